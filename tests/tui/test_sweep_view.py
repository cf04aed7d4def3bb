"""The sweep view (`tik-evo tui SWEEP_DIR`): every run in one table; Enter returns the chosen run."""

from __future__ import annotations

import os

import fixture_store
from tui_pilot import sync

from tik_evo.cli import main
from tui.sweep import SweepApp, sweep_rows


def _sweep(tmp_path):
    sweep = tmp_path / "sw"
    fixture_store.build(sweep / "seed=0", finished=True)
    fixture_store.build(sweep / "seed=1")
    (sweep / "seed=1" / "writer.lock").write_text(str(os.getpid()))  # a live writer: this process
    fixture_store.build(sweep / "seed=2")
    (sweep / "seed=2" / "writer.lock").write_text("999999999")  # a writer that is gone
    (sweep / "seed=3").mkdir()  # a run whose store does not exist yet is not listed
    return sweep


def test_rows_tell_finished_running_and_stopped_runs(tmp_path):
    rows = sweep_rows(_sweep(tmp_path))
    assert [d.name for d, _ in rows] == ["seed=0", "seed=1", "seed=2"]
    states = [str(cells[1]) for _, cells in rows]
    assert states == ["finished: max_evaluations", "running", "stopped"]
    assert all(cells[2] == "6" and str(cells[3]) == "1.233×" for _, cells in rows)


@sync
async def test_enter_returns_the_highlighted_run(tmp_path, text):
    sweep = _sweep(tmp_path)
    app = SweepApp(sweep)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = text(app)
        lines = screen.splitlines()
        assert lines[0].startswith(" 3 runs, 1 running · Enter: open a run · sw")
        assert lines[1].split() == ["run", "state", "evals", "×root", "best", "κ", "fails", "wall", "s"]
        assert [ln.split()[:2] for ln in lines[2:5]] == [["seed=0", "finished:"], ["seed=1", "running"],
                                                          ["seed=2", "stopped"]]
        await pilot.press("down", "enter")
    assert app.return_value == sweep / "seed=1"


def test_tui_on_an_empty_folder_is_a_named_error(tmp_path, capsys):
    assert main(["tui", str(tmp_path)]) == 2
    assert "no IR store here" in " ".join(capsys.readouterr().err.split())


def test_tui_on_a_sweep_directory_opens_the_sweep_view(tmp_path, monkeypatch):
    import tui.sweep

    opened = []
    monkeypatch.setattr(tui.sweep, "run_sweep_tui", opened.append)
    sweep = _sweep(tmp_path)
    assert main(["tui", str(sweep)]) == 0
    assert opened == [sweep]
