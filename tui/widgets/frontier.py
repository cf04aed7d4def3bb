"""Frontier: verified implementations by objective, with speed-ups over the root overall and per path."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist

from tui.model import STATUS_STYLE, RunView, fmt_s, fmt_x
from tui.widgets.messages import ImplChosen

COLUMNS = ("impl", "status", "×root", "full", "decode", "T(I)", "scope", "operator", "timer")


class FrontierTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns(*COLUMNS)

    def show(self, view: RunView) -> None:
        keep = self._current_key()
        self.clear()
        for impl in view.frontier():
            paths = view.path_speedups(impl.id)
            audit = view.audit_of(impl.id)
            timer = "interp" if view.is_interp(audit) else (audit.timer if audit else "—")
            self.add_row(
                impl.id, Text(impl.status, style=STATUS_STYLE.get(impl.status, "")),
                Text(fmt_x(view.speedup(impl.id)), style="bold"), fmt_x(paths["full"]), fmt_x(paths["decode"]),
                fmt_s(impl.objective), impl.scope, view.operator_of(impl.id),
                Text(timer, style="red" if timer == "interp" else ""), key=impl.id)
        # Refreshes happen every second while a run writes; keep the user's row instead of jumping to the top.
        if keep is not None and keep in self.rows:
            self.move_cursor(row=self.get_row_index(keep), animate=False)

    def _current_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:  # the cursor can point past the end after a clear
            return None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Only a pane the user is in may move the selection: refreshes re-highlight rows in hidden panes.
        if self.has_focus and event.row_key.value:
            self.post_message(ImplChosen(event.row_key.value, open=False))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.post_message(ImplChosen(event.row_key.value, open=True))
