"""Detail pane for one implementation: numbers, checks, action, and the source diff against its parent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.model import INTERP_NOTE, STATUS_STYLE, RunView, fmt_s, fmt_x


def _ratio(x: float | None, good_above: bool = True) -> Text:
    if x is None:
        return Text("—", style="dim")
    ok = x >= 1.0 if good_above else x <= 1.0
    return Text(fmt_x(x) if good_above else f"{x:.0%}", style="green" if ok else "red")


def header(view: RunView, impl_id: str) -> Text:
    impl, audit = view.impls[impl_id], view.audit_of(impl_id)
    t = Text(f"{impl.id} ", style="bold")
    t.append(impl.status, style=STATUS_STYLE.get(impl.status, ""))
    t.append(f"  scope {impl.scope}  operator {view.operator_of(impl_id)}")
    t.append(f"  parents {', '.join(impl.parents) or '—'}")
    paths = view.path_speedups(impl_id)
    t.append(f"\nT(I) {fmt_s(impl.objective)}  ×root {fmt_x(view.speedup(impl_id))}  "
             f"full {fmt_x(paths['full'])}  decode {fmt_x(paths['decode'])}")
    if audit is not None:
        t.append(f"\naudit {audit.id}: {'passed' if audit.passed else 'FAILED'}", style="green" if audit.passed
                 else "bold red")
        t.append(f"  admissible {audit.admissible}  promoted {audit.promoted}  timer {audit.timer or '?'}")
        if view.is_interp(audit):
            t.append(f"\n⚠ {INTERP_NOTE}", style="bold red")
        if audit.failure:
            t.append(f"\nfailure ({audit.failure_kind or '?'}): {audit.failure}", style="red")
    return t


def workload_table(view: RunView, impl_id: str) -> RenderableType:
    rows = view.workload_rows(impl_id)
    if not rows:
        return Text("no measurements (the audit stopped before timing)", style="dim")
    interp = any(r.timer == "wall-interpreter" for r in rows)
    title = "per-workload latency" + (" — Triton interpreter wall clock" if interp else "")
    table = Table(title=title, title_justify="left", expand=False, pad_edge=False)
    for col, just in (("workload", "left"), ("path", "left"), ("latency", "right"), ("vs root", "right"),
                      ("of limit", "right"), ("vs parent", "right")):
        table.add_column(col, justify=just, no_wrap=col != "workload")
    for r in rows:
        table.add_row(r.name, r.path, fmt_s(r.latency) + ("*" if r.timer == "wall-interpreter" else ""),
                      _ratio(r.vs_root), _ratio(r.of_limit, good_above=False), _ratio(r.vs_parent))
    return table


def checks_table(audit: Any) -> RenderableType:
    if audit is None or not audit.stages:
        return Text("no audit stages recorded", style="dim")
    table = Table(title="checks", title_justify="left", pad_edge=False)
    for col in ("stage", "check", "kind", "ok", "details"):
        table.add_column(col, no_wrap=col in ("stage", "kind", "ok"))
    for stage in audit.stages:
        ok = stage.get("passed")
        mark = Text("✓" if ok else "✗", style="green" if ok else "bold red")
        table.add_row(Text(stage.get("name", "?"), style="bold"), f"({stage.get('seconds', 0):.2f} s)", "",
                      mark, Text(stage.get("error") or "", style="red"))
        for c in stage.get("checks", []):
            ok = c.get("passed")
            table.add_row("", c.get("name", "?"), c.get("kind", ""),
                          Text("✓" if ok else "✗", style="green" if ok else "bold red"), _details(c.get("details")))
    return table


def _details(d: Any, top: bool = True) -> str:
    # Checks carry either a sentence or a dict of numbers (errors, tolerances, knob values).
    if isinstance(d, dict):
        inner = ", ".join(f"{k}={_details(v, False)}" for k, v in d.items())
        return inner if top else "{" + inner + "}"
    if isinstance(d, (list, tuple)):
        return "[" + ", ".join(_details(x, False) for x in d) + "]"
    if isinstance(d, float):
        return f"{d:.4g}"
    return "" if d is None else str(d)


def action_text(view: RunView, impl_id: str) -> Text:
    action = view.action_of(impl_id)
    if action is None:
        return Text("no action (root)", style="dim")
    t = Text(f"action {action.id}", style="bold")
    t.append(f"  {action.operator} on {action.opportunity or '—'}  outcome {action.outcome or '?'}")
    tokens = ", ".join(f"{k} {v}" for k, v in action.tokens.items()) or "none"
    t.append(f"\ntokens: {tokens}  cost ${action.cost_usd:.4f}")
    params = {k: v for k, v in action.params.items() if not k.startswith("_")}  # "_" keys are engine-internal
    if params:
        t.append(f"\nparams: {_details(params)}")
    t.append("\nrationale: ", style="bold")
    t.append(action.rationale or "—")
    if action.expected:
        t.append("\nexpected: ", style="bold")
        t.append(action.expected)
    if action.error:
        t.append(f"\nerror: {action.error}", style="red")
    return t


class DetailPane(VerticalScroll):
    def compose(self):
        yield Static("Select an implementation (Frontier or Lineage, Enter).", id="detail-body")

    def show(self, view: RunView, impl_id: str | None, source: Callable[[str], str]) -> None:
        body = self.query_one("#detail-body", Static)
        if impl_id != getattr(self, "_shown", None):  # a new selection starts at its header
            self._shown = impl_id
            self.scroll_home(animate=False)
        if impl_id is None or impl_id not in view.impls:
            body.update("Select an implementation (Frontier or Lineage, Enter).")
            return
        impl = view.impls[impl_id]
        diff = view.diff(impl_id, source)
        lexer = "diff" if impl.parents else "python"
        body.update(Group(
            header(view, impl_id), Text(""), workload_table(view, impl_id), Text(""),
            action_text(view, impl_id), Text(""), checks_table(view.audit_of(impl_id)), Text(""),
            Text(f"source vs parent {impl.parents[0]}" if impl.parents else "source (root)", style="bold"),
            Syntax(diff, lexer, theme="ansi_dark", word_wrap=True)))
