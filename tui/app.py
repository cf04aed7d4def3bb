"""`tik-evo tui RUN_DIR`: a live, read-only view of a run's IR store.

The app polls the store once a second and reloads only when the run's counters moved, so watching a long
run costs one small LMDB read per second. LMDB allows one open environment per process: run the app in its
own process, or hand it the Store the engine already has open (``TikEvoApp(run_dir, store=store)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static, TabbedContent, TabPane

from tik_evo.store import Store, StoreError
from tui.help import HelpScreen
from tui.model import INTERP_NOTE, RunView
from tui.source import RunSource
from tui.widgets.chart import BestChart
from tui.widgets.detail import DetailPane
from tui.widgets.events import EventLog
from tui.widgets.frontier import FrontierTable
from tui.widgets.gauges import RunGauges
from tui.widgets.lineage import LineageTree
from tui.widgets.messages import ImplChosen
from tui.widgets.opportunities import OpportunityPane, OpportunityTable
from tui.widgets.runbar import RunBar

# tab id -> (title, widget type that takes focus there)
TABS = {
    "frontier": ("1 Frontier", FrontierTable), "lineage": ("2 Lineage", LineageTree),
    "detail": ("3 Detail", DetailPane), "progress": ("4 Progress", RunGauges),
    "opportunities": ("5 Opps", OpportunityTable), "events": ("6 Events", EventLog),
}


class TikEvoApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tik-evo"
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("question_mark", "help", "help"),
        Binding("b", "best", "best"),
        Binding("r", "reload", "reload"),
        Binding("q", "quit", "quit"),
        *(Binding(k, f"tab('{tab}')", show=False) for tab, keys in (
            ("frontier", "1f"), ("lineage", "2l"), ("detail", "3d"), ("progress", "4p"),
            ("opportunities", "5o"), ("events", "6e")) for k in keys),
    ]

    def __init__(self, run_dir: str | Path, store: Store | None = None, interval: float = 1.0) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.source = RunSource(self.run_dir, store)
        self.interval = interval
        self.view: RunView | None = None
        self.selected: str | None = None
        self.sub_title = str(self.run_dir)

    def compose(self) -> ComposeResult:
        yield RunBar()
        with TabbedContent(initial="frontier"):
            with TabPane(TABS["frontier"][0], id="frontier"):
                yield Static("", classes="pane-note", id="frontier-note")
                yield FrontierTable()
                yield BestChart(id="frontier-chart")
            with TabPane(TABS["lineage"][0], id="lineage"):
                yield LineageTree()
            with TabPane(TABS["detail"][0], id="detail"):
                yield DetailPane()
            with TabPane(TABS["progress"][0], id="progress"):
                yield BestChart()
                yield RunGauges()
            with TabPane(TABS["opportunities"][0], id="opportunities"):
                yield OpportunityPane()
            with TabPane(TABS["events"][0], id="events"):
                yield EventLog()
        yield Footer()

    def on_mount(self) -> None:
        self.reload()
        self.query_one(FrontierTable).focus()
        self.set_interval(self.interval, self.reload)

    def on_unmount(self) -> None:
        self.source.close()

    # -- data ----------------------------------------------------------------------------------------------
    def reload(self, force: bool = False) -> bool:
        """Poll the store; redraw every pane when the run moved. Returns whether anything changed."""
        if force:
            self.source._key = None
        try:
            view = self.source.poll()
            events = self.source.new_events()
        except (StoreError, OSError) as e:  # a run being created or removed under us: say so, keep polling
            self.notify(str(e), severity="error", timeout=3)
            return False
        if events:
            self.query_one(EventLog).add(events)
        if view is None:
            return False
        self.view = view
        if self.selected is None or self.selected not in view.impls:
            self.selected = view.state.best or view.root_id
        self.query_one(RunBar).show(view)
        note = self.query_one("#frontier-note", Static)
        if not view.impls:
            note.update("no implementations yet: the run is auditing its root")
        else:
            note.update(f"timings: {INTERP_NOTE}" if view.any_interp else
                        f"{len(view.frontier())} verified of {len(view.impls)} implementations · Enter: detail")
        note.set_class(view.any_interp, "-interp")
        self.query_one(FrontierTable).show(view)
        self.query_one(LineageTree).show(view)
        self.query_one(OpportunityPane).show(view)
        for chart in self.query(BestChart):
            chart.show(view.history(), view.any_interp)
        self.query_one(RunGauges).show(view)
        self._show_detail()
        return True

    def _show_detail(self) -> None:
        if self.view is not None:
            self.query_one(DetailPane).show(self.view, self.selected, self.source.source)

    # -- navigation ----------------------------------------------------------------------------------------
    def on_impl_chosen(self, message: ImplChosen) -> None:
        if message.impl_id != self.selected:
            self.selected = message.impl_id
            self._show_detail()
        if message.open:
            self.action_tab("detail")

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self.call_after_refresh(self._focus_pane, tab)

    def _focus_pane(self, tab: str) -> None:
        # Focus requests arrive after a refresh; a stale one (an earlier tab) would switch TabbedContent
        # back to that tab, because focusing a widget in a hidden pane activates its pane.
        if self.query_one(TabbedContent).active == tab:
            self.query_one(TABS[tab][1]).focus()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # Mouse clicks on a tab land here too: put the keyboard where the eye goes.
        if event.pane.id in TABS:
            self.call_after_refresh(self._focus_pane, event.pane.id)

    def action_best(self) -> None:
        best = self.view.state.best if self.view else None
        if best:
            self.query_one(LineageTree).select_impl(best)
            self.on_impl_chosen(ImplChosen(best, open=True))

    def action_reload(self) -> None:
        self.reload(force=True)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())


def run_tui(run_dir: str | Path, store: Store | None = None) -> None:
    """Entry point for `tik-evo tui RUN_DIR` (and `tik-evo run ... --tui` with the engine's open Store)."""
    TikEvoApp(run_dir, store=store).run()


if __name__ == "__main__":
    import sys

    run_tui(sys.argv[1])
