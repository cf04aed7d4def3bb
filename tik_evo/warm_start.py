"""Warm start (`search.warm_start`): points of the knob space known to be good elsewhere, tried before the sampler.

Each entry is a named set of the family, or an earlier run directory (its best's knobs: a run on one card seeds
a campaign on another). Each point becomes a one-shot opportunity that fixes the knobs where it differs from the
run's root; the scheduler hands those out first, as it does split bundles, and the audit judges them like any
offspring (a point that is slower here, or over a limit, is recorded and left).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tik_evo.config import ConfigError
from tik_evo.family import Family

KEY = "search.warm_start"


def points(entries: list[str], family: Family, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, knob values) per entry, checked against the family's knob space; ConfigError names the entry."""
    sets = family.named_sets()
    out = []
    for entry in entries:
        entry = str(entry)
        if entry in sets:
            knobs, label = dict(sets[entry]), f"set {entry}"
        elif Path(entry).is_dir():
            knobs, label = _run_best(Path(entry), family, where), f"run {entry}"
        else:
            raise ConfigError(f"{where}: key {KEY!r}: {entry!r} is neither a named set of family {family.name!r} "
                              f"(sets: {', '.join(sorted(sets)) or 'none'}) nor a run directory")
        try:
            family.check_knobs(knobs, f"{where}: key {KEY!r}: {label}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        out.append((label, knobs))
    return out


def _run_best(run_dir: Path, family: Family, where: str) -> dict[str, Any]:
    from tik_evo.store import Store, StoreError

    try:
        with Store.open_reader(run_dir) as store:
            st = store.state()
            best = store.get(st.best) if st.best else None
    except StoreError as e:
        raise ConfigError(f"{where}: key {KEY!r}: {run_dir}: {e}") from None
    if st.family != family.name:
        raise ConfigError(f"{where}: key {KEY!r}: {run_dir} is a run of family {st.family!r}, not {family.name!r}")
    if best is None or not best.knobs:
        raise ConfigError(f"{where}: key {KEY!r}: {run_dir} has no verified best with knobs to start from")
    known = {k.name for k in family.knobs}
    return {k: v for k, v in best.knobs.items() if k in known}  # knobs since removed from the family are dropped


def opportunities(pts: list[tuple[str, dict[str, Any]]], root_knobs: dict[str, Any], kind: str) -> list[dict]:
    """One-shot opportunity fields per point that differs from the root (``kind``: one of the run's kinds, so the
    knob operator takes it); points equal to the root are left out."""
    out = []
    for label, knobs in pts:
        diff = {k: v for k, v in knobs.items() if root_knobs.get(k) != v}
        if diff:
            out.append({"kind": kind, "mechanism": f"warm start from {label}: {len(diff)} knob(s) off the root",
                        "knobs": list(diff), "values": diff, "origin": f"seed:{label}"})
    return out
