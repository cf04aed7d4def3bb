"""One-knob moves of the best, queued ahead of the sampler's own draws.

A sampler that draws every knob of an opportunity at once can go a whole run without trying the one value
of one knob that helps: a knob search from RMSNorm's old 4096 block drew the row-wide block (0) only together
with a warp count that hid its gain, and never alone, in 25 offspring. So the knob operator first turns each
knob of the best to each other value of the family's space, one knob at a time (the other knobs of the
opportunity held at the best's values). Each (knob, value) is tried once a run: when a move makes a new
best, the moves not yet tried continue from it, and the sampler takes over once all have been tried, already
told what each single move did. With other operators enabled (LLM), the moves take every other step.
"""

from __future__ import annotations

from collections.abc import Set
from itertools import zip_longest
from typing import Any

from tik_evo.family import Family
from tik_evo.records import Action, Opportunity


def one_knob_moves(family: Family, knobs: dict[str, Any], opportunities: list[Opportunity], kinds: list[str],
                   limit: int, tried: Set[tuple[str, str]] = frozenset()) -> list[dict[str, Any]]:
    """At most ``limit`` trial parameter sets, each changing one knob of ``knobs`` through a family
    opportunity of one of ``kinds``, skipping the (knob, repr(value)) pairs in ``tried``. A knob named by
    several opportunities moves through the one naming the fewest knobs. Knobs take turns (each knob's first
    other value, then each knob's second, ...), so a limit cuts every knob's list alike rather than dropping
    whole knobs."""
    per_knob: dict[str, list[dict[str, Any]]] = {}
    # An opportunity that fixes a value (a switch it is about) would move that knob too: not a one-knob move.
    usable = [o for o in opportunities if o.origin == "family" and o.kind in kinds and o.knobs and not o.values]
    for opp in sorted(usable, key=lambda o: (len(o.knobs), int(o.id[1:]))):
        try:
            space = {name: list(family.knob(name).values) for name in opp.knobs}
        except KeyError:
            continue
        # Held knobs are fixed trial parameters, so their values must be in the space the operator draws from.
        if any(name not in knobs or knobs[name] not in space[name] for name in opp.knobs):
            continue
        held = {f"knob.{name}": knobs[name] for name in opp.knobs}
        effective = family.in_effect(knobs)
        for name in opp.knobs:
            if name in per_knob or name not in effective:  # out of effect: the move would compile the same kernels
                continue
            per_knob[name] = [{"operator": "knob", "opportunity.knob": opp.kind, "parent_rank": 0,
                               **held, f"knob.{name}": value}
                              for value in space[name]
                              if value != knobs[name] and (name, repr(value)) not in tried]
    turns = zip_longest(*per_knob.values())
    return [m for turn in turns for m in turn if m is not None][:max(0, limit)]


def tried_moves(actions: list[Action]) -> set[tuple[str, str]]:
    """(knob, repr(value)) of every knob action of the run that changed exactly one knob, from any parent."""
    out = set()
    for a in actions:
        changed = [(k, v) for k, v in a.params.items() if not k.startswith("_")]
        if a.operator == "knob" and len(changed) == 1:
            out.add((changed[0][0], repr(changed[0][1])))
    return out
