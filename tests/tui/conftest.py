"""Fixtures: small realistic run directories built through the real Store (see fixture_store.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the repo may be used without `pip install -e .`
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("textual")

import fixture_store
from tui_pilot import screen_text


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


@pytest.fixture
def text():
    return screen_text
