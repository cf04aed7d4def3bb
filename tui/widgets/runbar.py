"""The one-line run summary above the tabs: what a glance at a live run needs."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tik_evo.report import offspring_audits, throughput_figures
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
        audits = list(view.audits.values())
        rate = throughput_figures(audits, st.root, (st.budgets or {}).get("wall_s") or 0.0)
        spent = offspring_audits(audits, st.root)
        if rate:  # how fast the search goes: offspring a minute after the root's audit (`tik-evo status` says more)
            t.append(f"  {rate[0]:.1f} audits/min")
        elif spent:  # no wall time recorded yet: the offspring's mean audit
            t.append(f"  audit {sum(a.seconds for a in spent) / len(spent):.1f} s")
        self.update(t)
