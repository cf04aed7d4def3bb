"""Live progress on the terminal (rich): evaluations, best T, κ and what the loop is doing now."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tik_evo.run_state import RunState


class LiveProgress:
    def __init__(self, cfg: Any, console: Console, enabled: bool = True):
        self.cfg = cfg
        self.enabled = enabled
        self.progress = Progress(TextColumn("[bold]evaluations"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 disable=not enabled, transient=False)
        self.task = None

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        self.task = self.progress.add_task("search", total=self.cfg.search.max_evaluations, info="")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def update(self, event: dict[str, Any]) -> None:
        st: RunState = event["state"]
        best, root = st.best_objective, st.root_objective
        sp = f"{root / best:.3f}x" if best and root else "-"
        clock = " interpreter wall clock" if st.device == "cpu" else ""
        info = (f"best {st.best} T={best:.4g}{clock} ({sp})  κ {st.kappa}/{self.cfg.search.kappa_threshold}  "
                if best else "") + (event.get("text") or "")[:70]
        self.progress.update(self.task, completed=st.evaluations, info=info)
