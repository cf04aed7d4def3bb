"""The one-line run summary above the tabs: what a glance at a live run needs."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tik_evo.report import offspring_audits
from tui.model import RunView, fmt_x


class RunBar(Static):
    def show(self, view: RunView) -> None:
        st = view.state
        t = Text(no_wrap=True, overflow="ellipsis")
        finished = st.finished
        t.append(" FINISHED " if finished else " RUNNING ", style="bold black on green" if finished else
                 "bold black on yellow")
        t.append(" ")
        if st.step:  # engines that do not count steps leave it at 0: say nothing rather than "step 0"
            t.append(f"step {st.step}  ")
        t.append(f"evals {st.evaluations}")
        best = st.best
        if best:
            t.append("  best ")
            t.append(f"{best} {fmt_x(view.speedup(best))}", style="bold green")
        thr = view.config.kappa_threshold
        t.append(f"  κ {st.kappa}/{thr if thr is not None else '?'}")
        left = (st.moves or {}).get("left")
        if left:  # search.neighbours: one-knob moves of the best still queued ahead of the sampler
            t.append(f"  moves {len(left)} left")
        if view.any_interp:
            t.append("  INTERPRETER TIMINGS", style="bold red")
        spent = offspring_audits(list(view.audits.values()), st.root)
        if spent:  # the offspring's mean audit: how fast the search can go (`tik-evo status` splits it by stage)
            t.append(f"  audit {sum(a.seconds for a in spent) / len(spent):.1f} s")
        self.update(t)
