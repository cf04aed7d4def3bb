"""The knob operator (no LLM): turns the knobs an opportunity names, sampling values through the trial.

Scope follows the roles of the knobs that changed: any contract knob makes the change joint (a contract
knob is a single entry both paths read, so it can only change for both together).

Bundle splits: turning several knobs at once can hide a good change behind a bad one (a faster offspring that
one knob pushes over a slowdown limit). When an offspring beats the best objective but is over a limit, the
operator proposes each changed knob alone, at the value it had, as new opportunities (`search.split_bundles`)
that the scheduler offers before any other.
"""

from __future__ import annotations

from typing import Any

from tik_evo.knobs import KnobsError, read_knobs, write_knobs
from tik_evo.operators.base import ActionContext, Operator, Proposal
from tik_evo.records import Opportunity


def scope_of(roles: set[str]) -> str:
    if not roles or "contract" in roles or roles == {"full", "decode"}:
        return "joint"
    return next(iter(roles))


def _conditions_first(family, names: list[str]) -> list[str]:
    """``names`` with every knob after the knobs its `when` names (declaration order otherwise), so a knob's
    conditions are drawn before it."""
    order, seen = [], set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for cond, _ in family.knob(name).when:
            if cond in names:
                visit(cond)
        order.append(name)

    for name in names:
        visit(name)
    return order


class KnobOperator(Operator):
    name = "knob"

    def usable(self, opportunity: Opportunity) -> bool:
        return bool(opportunity.knobs)

    def propose(self, ctx: ActionContext) -> Proposal:
        opp = ctx.opportunity
        if opp is None or not opp.knobs:
            return Proposal(None, "joint", error="knob operator needs an opportunity that names knobs")
        try:
            knobs = read_knobs(ctx.parent_source)
        except KnobsError as e:
            return Proposal(None, "joint", error=f"parent {ctx.parent.id}: {e}")
        new = dict(knobs)
        changed: dict[str, tuple] = {}
        for name in _conditions_first(ctx.family, opp.knobs):
            knob = ctx.family.knob(name)
            if name not in knobs:
                return Proposal(None, "joint", error=f"parent {ctx.parent.id} has no knob {name!r} in KNOBS")
            if name in opp.values:  # a split bundle names its value; nothing to sample
                value = opp.values[name]
            elif name not in ctx.family.in_effect(new):
                continue  # out of effect under the values drawn so far: a change would compile the same kernels
            else:
                value = ctx.trial.suggest_categorical(f"knob.{name}", list(knob.values))
            if value != knobs[name]:
                new[name] = value
                changed[name] = (knobs[name], value)
        roles = {ctx.family.knob(n).role for n in changed}
        scope = scope_of(roles)
        params = {n: v for n, (_, v) in changed.items()}
        if not changed:
            return Proposal(None, scope, params=params, error="no-change")
        text = ", ".join(f"{n} {a!r}→{b!r} ({ctx.family.knob(n).role})" for n, (a, b) in changed.items())
        return Proposal(write_knobs(ctx.parent_source, new), scope, rationale=f"{opp.kind}: {text}",
                        expected=opp.mechanism, params=params)

    def after_audit(self, ctx: ActionContext, proposal: Proposal, verdict: Any) -> list[dict[str, Any]]:
        if not ctx.cfg.search.get("split_bundles", True) or len(proposal.params) < 2 or ctx.opportunity is None:
            return []
        if verdict.objective is None or verdict.admissible or verdict.objective >= verdict.best_objective:
            return []
        over = ", ".join(n for n, x in verdict.limits.items() if not x["ok"])
        return [{"kind": ctx.opportunity.kind, "split": True, "knobs": [name], "values": {name: value},
                 "paths": ctx.opportunity.paths,
                 "mechanism": f"{name}={value!r} alone: it came in a bundle ({', '.join(proposal.params)}) that beat "
                              f"the best objective but went over the limit on {over}"}
                for name, value in proposal.params.items()]
