"""Scrolling event log: appends only the events newer than the last one shown."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text
from textual.widgets import RichLog

KIND_STYLE = {"promote": "bold green", "finish": "bold", "error": "bold red", "audit": "cyan", "init": "blue"}


class EventLog(RichLog):
    def __init__(self, **kwargs) -> None:
        super().__init__(max_lines=2000, wrap=True, markup=False, **kwargs)

    def add(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            line = Text(time.strftime("%H:%M:%S ", time.localtime(e.get("t", 0))), style="dim")
            if e.get("step"):  # 0 when the engine does not count steps
                line.append(f"#{e['step']:<3} ")
            kind = str(e.get("kind", "?"))
            line.append(f"{kind:<8} ", style=KIND_STYLE.get(kind, ""))
            line.append(str(e.get("text", "")))
            self.write(line)
