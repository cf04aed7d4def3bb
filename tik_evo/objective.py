"""The campaign's objective T = sum_j w_j t_j (each t_j over the root's when normalised), as a pure function:
the engine's lineage judges promotions with it and the audit's screen, in the judge's process, estimates it."""

from __future__ import annotations


def weighted(times: dict[str, float], weights: dict[str, float], root: dict[str, float], normalize: bool) -> float:
    """T of the workload times ``times`` (seconds by workload name; every weighted workload must be there)."""
    return sum(w * (times[n] / root[n] if normalize else times[n]) for n, w in weights.items())
