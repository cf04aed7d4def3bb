"""The screen (`evaluate.screen`): an offspring timed right after its small checks, its audit stopped there when
the timings say it cannot become the best.

Most offspring of a search are no faster than the best, and most of an audit is the full correctness stage (its
kernels compiled for every check case, the drawn cases' fresh shapes included). The screen times the offspring on
the campaign's workloads first, as the timing stage does (fresh inputs, its timed outputs checked), and compares
it with the reference the engine put in the job: the best's objective and every workload's slowdown limit, on this
GPU's root timings. An offspring worse than the best by more than `screen_margin`, or over a limit by more than
that, is *screened*: recorded with the screen's measurements and kind "screened", never promoted and never a
parent. The margin absorbs the drift between the best's own audit and this one (the screen does not re-time the
best). The others go on to the full checks, the graph and repeat stages and the timing stage, exactly as without a
screen, so a screen can only save time: it never lets an offspring skip a check on the way to becoming the best.
"""

from __future__ import annotations

from typing import Any

from tik_evo.objective import weighted

SCREENED = "screened"  # the failure kind of an audit the screen stopped


def spec(weights: dict[str, float], root: dict[str, float], limits: dict[str, dict[str, Any]], normalize: bool,
         best_objective: float, margin: float, stones: bool = False) -> dict[str, Any]:
    """The reference a screening judge compares with (JSON, in the worker's job). ``stones``: the search keeps
    stepping stones (search.stepping_stones), so an offspring over a limit but better on the objective goes on."""
    return {"weights": dict(weights), "root": dict(root), "limits": {n: float(x["limit"]) for n, x in limits.items()},
            "normalize": bool(normalize), "best_objective": float(best_objective), "margin": float(margin),
            "stones": bool(stones)}


def decide(measurements: dict[str, dict[str, Any]], ref: dict[str, Any]) -> tuple[bool, str]:
    """(passes, why) for the offspring's screen measurements against ``ref``."""
    missing = [n for n in ref["weights"] if n not in measurements]
    if missing:
        return True, f"not screened: {', '.join(missing)} not measured"
    t = {n: float(m["median_s"]) for n, m in measurements.items()}
    root = ref["root"]
    objective = weighted(t, ref["weights"], root, ref["normalize"])
    over = {n: t[n] / (lim * root[n]) - 1 for n, lim in ref["limits"].items() if n in t and n in root}
    worst = max(over, key=over.get, default=None)
    margin, best = ref["margin"], ref["best_objective"]
    if worst is not None and over[worst] > margin:
        if ref.get("stones") and objective < best * (1 + margin):
            return True, (f"{worst} is {over[worst]:.1%} over its slowdown limit, but the objective {objective:.6g} "
                          f"may make it a stepping stone: audited in full")
        return False, (f"screened: {worst} is {over[worst]:.1%} over its slowdown limit (screen margin "
                       f"{margin:.0%})")
    if objective > best * (1 + margin):
        return False, (f"screened: objective {objective:.6g} is {objective / best - 1:.1%} above the best's "
                       f"{best:.6g} (screen margin {margin:.0%})")
    return True, f"objective {objective:.6g} against the best's {best:.6g}: audited in full"
