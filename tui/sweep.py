"""`tik-evo tui SWEEP_DIR`: every run of a sweep in one table, polled once a second; Enter opens a run's own
view, and quitting that comes back here."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from tik_evo.store import runs_under
from tik_evo.sweep import run_state, summary

COLUMNS = ("run", "state", "evals", "×root", "best", "κ", "fails", "wall s")
STATE_STYLE = {"running": "bold green", "stopped": "yellow"}


def sweep_rows(sweep_dir: Path) -> list[tuple[Path, tuple]]:
    """(run directory, table cells) for every run under the sweep directory; a run still being created shows
    as starting."""
    rows = []
    for run_dir in runs_under(sweep_dir):
        try:
            r = summary(run_dir)
        except Exception:  # its store is being created right now
            rows.append((run_dir, (run_dir.name, "starting", "-", "-", "-", "-", "-", "-")))
            continue
        state = run_state(run_dir, r["finished"])
        rows.append((run_dir, (run_dir.name, Text(state, style=STATE_STYLE.get(state, "dim")), str(r["evaluations"]),
                               Text(f"{r['speedup']:.3f}×" if r["speedup"] else "-", style="bold"),
                               str(r["best"] or "-"), str(r["kappa"]), str(r["failures"]), f"{r['wall_s']:.0f}")))
    return rows


class SweepApp(App[Path | None]):
    """Returns the run directory chosen with Enter, or None on quit."""
    TITLE = "tik-evo sweep"
    CSS = "#sweep-bar { height: 1; background: $panel; } DataTable { height: 1fr; }"
    BINDINGS: ClassVar[list[Binding]] = [Binding("q", "quit", "quit"), Binding("r", "reload", "reload")]

    def __init__(self, sweep_dir: str | Path, interval: float = 1.0) -> None:
        super().__init__()
        self.sweep_dir, self.interval = Path(sweep_dir), interval
        self.run_dirs: list[Path] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="sweep-bar")
        yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.action_reload()
        self.query_one(DataTable).focus()
        self.set_interval(self.interval, self.action_reload)

    def action_reload(self) -> None:
        table = self.query_one(DataTable)
        row = table.cursor_row
        rows = sweep_rows(self.sweep_dir)
        self.run_dirs = [d for d, _ in rows]
        table.clear()
        for run_dir, cells in rows:
            table.add_row(*cells, key=str(run_dir))
        if rows:  # keep the user's row across refreshes
            table.move_cursor(row=min(row, len(rows) - 1), animate=False)
        running = sum(1 for _, c in rows if str(c[1]) == "running")
        self.query_one("#sweep-bar", Static).update(
            f" {len(rows)} runs, {running} running · Enter: open a run · {self.sweep_dir.name}")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.exit(Path(str(event.row_key.value)))


def run_sweep_tui(sweep_dir: str | Path) -> None:
    """The sweep's table; a chosen run opens in the run view, and quitting it returns to the table."""
    from tui.app import run_tui

    while (chosen := SweepApp(sweep_dir).run()) is not None:
        run_tui(chosen)
