"""Fixtures: small realistic run directories built through the real Store (see fixture_store.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repo may be used without `pip install -e .`
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("textual")

import fixture_store


@pytest.fixture(scope="session")
def gpu_run(tmp_path_factory) -> Path:
    """A run timed on a GPU (cuda-event timer), still running."""
    return fixture_store.build(tmp_path_factory.mktemp("gpu_run"))


@pytest.fixture(scope="session")
def interp_run(tmp_path_factory) -> Path:
    """The same run timed under Triton's interpreter, finished."""
    return fixture_store.build(tmp_path_factory.mktemp("interp_run"), interp=True, finished=True)


@pytest.fixture
def live_run(tmp_path) -> Path:
    """A fresh run per test, for tests that write to it."""
    return fixture_store.build(tmp_path / "live")


def screen_text(app) -> str:
    """The visible screen as plain text (what export_screenshot draws, without the SVG)."""
    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


@pytest.fixture
def text():
    return screen_text


def sync(fn):
    """Run an async pilot test with asyncio.run (pytest-asyncio is not a dependency)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
