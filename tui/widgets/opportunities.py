"""Opportunities table; Enter follows the first evidence (or origin) link to that implementation."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tui.model import STATUS_STYLE, RunView
from tui.widgets.messages import ImplChosen

COLUMNS = ("id", "status", "kind", "mechanism", "paths", "origin", "evidence")


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _paths(paths: list[str]) -> str:
    # Both paths is what the paper calls a joint scope; the short word keeps the table within 80 columns.
    return "joint" if set(paths) >= {"full", "decode"} else "+".join(paths) or "—"


class OpportunityTable(DataTable):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.links: dict[str, str] = {}
        self.view: RunView | None = None

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns(*COLUMNS)

    def show(self, view: RunView) -> None:
        self.view = view
        keep = self.cursor_row
        self.clear()
        self.links.clear()
        order = {"pending": 0, "consumed": 1, "withdrawn": 2}
        for o in sorted(view.opps.values(), key=lambda o: (order.get(o.status, 3), int(o.id[1:]))):
            # The newest evidence is the most telling (family opportunities all cite the root's audit first).
            target = next((t for t in map(view.impl_for_ref, [*reversed(o.evidence), o.origin]) if t), None)
            if target:
                self.links[o.id] = target
            refs = ",".join(o.evidence[:2]) + (f" +{len(o.evidence) - 2}" if len(o.evidence) > 2 else "")
            status = Text(o.status + (f" ×{o.uses}" if o.uses else ""), style=STATUS_STYLE.get(o.status, ""))
            self.add_row(o.id, status, _clip(o.kind, 14), _clip(o.mechanism, 18), _paths(o.paths),
                         _clip(o.origin, 10), Text(refs or "—", style="underline" if target else "dim"), key=o.id)
        if self.row_count:
            self.move_cursor(row=min(keep, self.row_count - 1), animate=False)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        target = self.links.get(event.row_key.value or "")
        if target:
            self.post_message(ImplChosen(target, open=True))
        else:
            self.notify("this opportunity links to no implementation yet", severity="warning")


class OpportunityPane(Vertical):
    """The table plus the highlighted opportunity in full (the table clips long mechanisms)."""

    def compose(self) -> ComposeResult:
        yield OpportunityTable()
        yield Static("", id="opp-detail")

    def show(self, view: RunView) -> None:
        self.query_one(OpportunityTable).show(view)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = self.query_one(OpportunityTable)
        o = table.view.opps.get(event.row_key.value or "") if table.view else None
        if o is None:
            return
        t = Text(f"{o.id} ", style="bold")
        t.append(o.mechanism)
        t.append(f"\npaths {'+'.join(o.paths) or '—'}  knobs {', '.join(o.knobs) or '—'}  "
                 f"workloads {', '.join(o.workloads) or 'all'}  repeatable {o.repeatable}"
                 + (f"  tries {', '.join(f'{k}={v!r}' for k, v in o.values.items())}" if o.values else ""), style="dim")
        t.append(f"\nevidence {', '.join(o.evidence) or '—'}  origin {o.origin}"
                 + (f"  → Enter opens {table.links[o.id]}" if o.id in table.links else ""), style="dim")
        self.query_one("#opp-detail", Static).update(t)
