"""The knob operator (no LLM): turns the knobs an opportunity names, sampling values through the trial.

Scope follows the roles of the knobs that changed: any contract knob makes the change joint (a contract
knob is a single entry both paths read, so it can only change for both together).
"""

from __future__ import annotations

from tik_evo.knobs import KnobsError, read_knobs, write_knobs
from tik_evo.operators.base import ActionContext, Operator, Proposal
from tik_evo.records import Opportunity


def scope_of(roles: set[str]) -> str:
    if not roles or "contract" in roles or roles == {"full", "decode"}:
        return "joint"
    return next(iter(roles))


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
        for name in opp.knobs:
            knob = ctx.family.knob(name)
            if name not in knobs:
                return Proposal(None, "joint", error=f"parent {ctx.parent.id} has no knob {name!r} in KNOBS")
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
