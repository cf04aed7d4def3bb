"""Helpers for Textual pilot tests (a module of its own: `conftest` is a name several test folders use)."""

from __future__ import annotations

import io


def screen_text(app) -> str:
    """The visible screen as plain text (what export_screenshot draws, without the SVG)."""
    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()



def sync(fn):
    """Run an async pilot test with asyncio.run (pytest-asyncio is not a dependency)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper
