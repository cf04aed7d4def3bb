"""Live refresh: another process writes to the store while the app watches it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.widgets import TabbedContent
from tui_pilot import sync

from tui.app import TikEvoApp
from tui.widgets.lineage import LineageTree

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


async def _wait_for(pilot, cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        await pilot.pause(0.1)
    return cond()


@sync
async def test_refresh_when_another_process_writes(live_run, text):
    app = TikEvoApp(live_run, interval=0.2)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "I6" not in text(app)
        writer = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "fixture_store.py"), str(live_run), "--add", "2",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await writer.communicate()
        assert writer.returncode == 0, err.decode()
        assert out.split() == [b"I6", b"I7"]
        assert await _wait_for(pilot, lambda: app.view is not None and "I7" in app.view.impls)
        await pilot.pause()
        screen = text(app)
        assert "best I7" in screen.splitlines()[0] and "step 8" in screen
        assert screen.splitlines()[5].split()[:2] == ["I7", "best"]
        assert "I6" in screen
        await pilot.press("2")
        await pilot.pause()
        assert "I7 best" in text(app)  # the tree grew in place under I6
        assert app.query_one(LineageTree)._by_id["I7"].parent is app.query_one(LineageTree)._by_id["I6"]
        await pilot.press("6")
        await pilot.pause()
        assert "I7 is the new best" in text(app)


@pytest.mark.slow
@sync
async def test_watching_a_real_quickstart_run(tmp_path, text):
    """The engine's own writer in another process: the app must follow it from the root onward."""
    if not (ROOT / "tik_evo" / "loop.py").exists() or not (ROOT / "campaigns" / "quickstart.yaml").exists():
        pytest.skip("engine not available yet: tik_evo/loop.py or campaigns/quickstart.yaml is missing")
    run_dir = tmp_path / "run"
    # The budgets bound the run if the test fails; it stops the run as soon as the root is on screen.
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tik_evo.cli", "run", "campaigns/quickstart.yaml", f"store.path={run_dir}",
        "search.max_evaluations=2", "search.wall_time_s=90", "--quiet",
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (run_dir / "ir.lmdb" / "data.mdb").exists() and child.returncode is None:
            assert time.monotonic() < deadline, "the run created no store within 30 s"
            await asyncio.sleep(0.1)
        if not (run_dir / "ir.lmdb" / "data.mdb").exists():
            err = (await child.stderr.read()).decode()
            pytest.skip(f"quickstart exited with {child.returncode} before creating its store: {err[-400:]}")
        app = TikEvoApp(run_dir, interval=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            # The app may start before the engine has created its tables; it must keep polling until the
            # root is audited (seconds), then follow the run live.
            assert await _wait_for(pilot, lambda: app.view is not None and app.view.root_id in app.view.impls, 60), \
                "the root never appeared while the run wrote"
            await pilot.pause(0.3)
            screen = text(app)
            assert "I0" in screen and "INTERPRETER TIMINGS" in screen  # quickstart times on the CPU
            await pilot.press("enter")
            await pilot.pause()
            assert app.query_one(TabbedContent).active == "detail" and app.selected == "I0"
            assert "source (root)" in text(app) or "I0" in text(app)
            for key in "2456":
                await pilot.press(key)
                await pilot.pause()
            assert "root I0 verified" in text(app)
    finally:
        if child.returncode is None:
            child.terminate()
        await asyncio.wait_for(child.wait(), 30)
