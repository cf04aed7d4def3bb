"""κ against its threshold, budgets as gauges, and failures by kind."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, ProgressBar, Static

from tui.model import RunView


class Gauge(Horizontal):
    """name, bar, value; without a limit the bar is hidden (an indeterminate bar would animate forever)."""

    def __init__(self, name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self._label_text = name

    def compose(self) -> ComposeResult:
        yield Label(self._label_text, classes="gauge-name")
        yield ProgressBar(total=1, show_eta=False, show_percentage=False)
        yield Label("", classes="gauge-value")

    def set(self, value: float, limit: float | None, text: str) -> None:
        bar = self.query_one(ProgressBar)
        bar.display = bool(limit)
        if limit:
            bar.update(total=float(limit), progress=min(float(value), float(limit)))
            self.set_class(value >= limit, "-full")
        self.query_one(".gauge-value", Label).update(text if limit else f"{text} (no limit set)")


class RunGauges(Vertical):
    def compose(self) -> ComposeResult:
        yield Gauge("κ", id="g-kappa")
        yield Gauge("evaluations", id="g-evals")
        yield Gauge("wall time", id="g-wall")
        yield Gauge("tokens", id="g-tokens")
        yield Gauge("USD", id="g-usd")
        yield Static(id="failures")

    def show(self, view: RunView) -> None:
        st, cfg = view.state, view.config
        budgets = st.budgets
        kappa = st.kappa
        self.query_one("#g-kappa", Gauge).set(kappa, cfg.kappa_threshold,
                                              f"{kappa} / {_n(cfg.kappa_threshold)} non-improving in a row")
        evals = st.evaluations
        self.query_one("#g-evals", Gauge).set(evals, cfg.max_evaluations, f"{evals} / {_n(cfg.max_evaluations)}")
        wall = budgets.get("wall_s", 0.0) or 0.0
        self.query_one("#g-wall", Gauge).set(wall, cfg.wall_time_s, f"{_dur(wall)} / {_dur(cfg.wall_time_s)}")
        tokens = budgets.get("tokens", 0) or 0
        self.query_one("#g-tokens", Gauge).set(tokens, cfg.max_tokens, f"{tokens:,} / {_n(cfg.max_tokens)}")
        usd = budgets.get("usd", 0.0) or 0.0
        self.query_one("#g-usd", Gauge).set(usd, cfg.max_usd, f"${usd:.2f} / "
                                            + (f"${cfg.max_usd:.2f}" if cfg.max_usd else "—"))
        fails = st.failures_by_kind
        text = ", ".join(f"{k} {v}" for k, v in sorted(fails.items(), key=lambda kv: -kv[1])) or "none"
        extra = f"   duplicates {st.duplicates}"
        fin = st.finished
        if fin:
            extra += f"\n[b]finished:[/b] {fin.get('reason', fin) if isinstance(fin, dict) else fin}"
        self.query_one("#failures", Static).update(f"[b]failures by kind:[/b] {text}{extra}")


def _n(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
