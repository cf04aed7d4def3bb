"""Best-so-far speed-up over evaluations as a small text chart (textual-plotext is not a dependency).

A step chart of eighth-block bars: one column per evaluation when they fit, otherwise evaluations are
binned; the row under the bars marks promotions with ▲.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
AXIS = 8  # width of the y-axis labels


class BestChart(Widget):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.points: list[tuple[float | None, bool]] = []
        self.interp = False

    def show(self, points: list[tuple[float | None, bool]], interp: bool) -> None:
        self.points, self.interp = points, interp
        self.refresh()

    def render(self) -> Text:
        title = Text("best-so-far speed-up over root, per evaluation", style="bold")
        if self.interp:
            title.append("  (interpreter wall clock)", style="bold red")
        vals = [v for v, _ in self.points if v is not None]
        width, height = max(self.size.width - AXIS, 1), max(self.size.height - 3, 1)
        if not vals:
            return title + Text("\n(no evaluations yet)", style="dim")
        lo = min(min(vals), 1.0)
        # Headroom on both sides: the root's 1.000× stays a visible bar, and a flat run (no promotion yet)
        # draws half-height bars instead of looking like a maximum.
        pad = max((max(vals) - lo) * 0.1, 0.01)
        hi, lo = max(max(vals), lo + 2 * pad), lo - pad
        span = hi - lo
        n = len(self.points)
        cols = width
        # Few evaluations stretch over several columns; many share one, which then shows the best after
        # the last evaluation in its bin, so the curve never hides a gain.
        col_val, marks = [], [False] * cols
        for c in range(cols):
            col_val.append(self.points[((c + 1) * n - 1) // cols][0])
        for i, (_, promoted) in enumerate(self.points):
            if promoted:
                marks[min(cols - 1, i * cols // n)] = True
        eighths = [0 if v is None else max(1, round((v - lo) / span * height * 8)) for v in col_val]
        out = Text()
        out.append_text(title)
        for row in range(height):
            label = f"{hi:.3f}×" if row == 0 else (f"{lo:.3f}×" if row == height - 1 else "")
            out.append(f"\n{label:>{AXIS - 1}}│", style="dim")
            floor = (height - 1 - row) * 8
            out.append("".join(BLOCKS[min(8, max(0, e - floor))] for e in eighths), style="green")
        out.append("\n" + " " * (AXIS - 1) + "└")
        out.append("".join("▲" if m else "─" for m in marks), style="bold yellow")
        # Evaluation 0 is the root's audit, so the last index matches the run's evaluation count.
        right = f"evaluation {n - 1}  ▲ promotion"
        out.append("\n" + " " * AXIS + "0 root" + right.rjust(max(cols - 6, len(right))), style="dim")
        return out
