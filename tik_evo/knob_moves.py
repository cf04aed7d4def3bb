"""One-knob moves of a family's root and the family's own checks on each: a `full` or `decode` knob claims to
change one path's schedule and never a bit, a `contract` knob both paths' numerics together; the checks say
whether each value keeps that claim. `tik-evo bench knob-moves` runs every move on a GPU, several at a time
(`check_move` runs in a worker process: it imports what it needs)."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any


def moves(name: str, roles: set[str]) -> list[dict[str, Any]]:
    """(knob, role, value) for each other value of each knob of the family's space with one of `roles`; the
    root itself first (knob None), so a failure of every move is told apart from one of the root."""
    from tik_evo.families import load_family
    from tik_evo.knobs import read_knobs

    family = load_family(name)
    root = read_knobs(family.root_source())
    return [{"family": name, "knob": None, "role": "root", "value": None, "root_value": None}] + [
        {"family": name, "knob": k.name, "role": k.role, "value": v, "root_value": root.get(k.name)}
        for k in family.knobs if k.role in roles for v in k.values if v != root.get(k.name)]


def check_move(move: dict[str, Any], device: str, level: str, seed: int) -> dict[str, Any]:
    """The family's checks on its root with the move applied: failed checks, or the exception that stopped them."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from tik_evo import interp

        interp.install()
    from tik_evo.candidate import load_source
    from tik_evo.families import load_family
    from tik_evo.knobs import read_knobs, write_knobs

    family = load_family(move["family"])
    source = family.root_source()
    if move["knob"] is not None:
        source = write_knobs(source, {**read_knobs(source), move["knob"]: move["value"]})
    t0, out = time.time(), {**move, "checks": 0, "failed": [], "error": None}
    try:
        impl = load_source(source, f"move_{move['family']}_{move['knob'] or 'root'}")
        for case in family.check_cases(level):
            for c in family.run_checks(impl, case, seed, device):
                out["checks"] += 1
                if not c.passed:
                    out["failed"].append({"name": c.name, "kind": c.kind, "details": c.details})
    except Exception as e:  # a move the kernel refuses (a value that needs another knob) is reported, not fatal
        out["error"] = f"{type(e).__name__}: {e}"[:400]
        out["traceback"] = traceback.format_exc(limit=4)[-1500:]
    out["seconds"] = round(time.time() - t0, 2)
    return out
