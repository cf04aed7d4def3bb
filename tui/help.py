"""The ? screen: every key the app answers to."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]tik-evo TUI[/b] — read-only, refreshes every second.  [dim]Esc, q or ? closes this.[/dim]

[b]Panes[/b]
  1 / f   Frontier      verified implementations by objective
  2 / l   Lineage       derivation tree, coloured by status
  3 / d   Detail        latency, checks, action, diff of the selection
  4 / p   Progress      best-so-far chart, κ, budgets, failures
  5 / o   Opportunities Enter follows the evidence link
  6 / e   Events        the run's event log

[b]Moving[/b]
  ↑ ↓ PgUp PgDn Home End   move / scroll in the focused pane
  Enter    open the highlighted implementation in Detail
  space    fold / unfold a lineage subtree
  tab      next widget          b   jump to the best implementation
  r        reload now           ?   this help      q   quit

Latencies marked * or "interp" were taken under Triton's interpreter:
CPU wall clock, useful for structure, meaningless as GPU speed."""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[tuple[str, str, str]]] = [
        ("escape", "dismiss", "close"), ("question_mark", "dismiss", "close"), ("q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(HELP)
