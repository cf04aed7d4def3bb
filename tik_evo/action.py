"""Action: ask the scheduler for (operator, opportunity, parent) and let the operator write an offspring."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from tik_evo.family import Family
from tik_evo.operators import make_operator
from tik_evo.operators.base import ActionContext, Operator, Proposal
from tik_evo.records import Opportunity
from tik_evo.scheduler import Scheduler
from tik_evo.store import Store


@dataclass
class Choice:
    trial: Any
    operator: str
    opportunity: Opportunity | None
    parent: str


class Actor:
    def __init__(self, cfg: DictConfig, family: Family, store: Store, scheduler: Scheduler):
        self.cfg, self.family, self.store, self.scheduler = cfg, family, store, scheduler
        self._operators: dict[str, Operator] = {}

    def operator(self, name: str) -> Operator:
        if name not in self._operators:
            self._operators[name] = make_operator(name)
        return self._operators[name]

    def kinds(self, opportunities: list[Opportunity]) -> dict[str, list[str]]:
        """Opportunity kinds each enabled operator can act on (the scheduler's static space)."""
        out = {}
        for name in self.cfg.search.operators:
            op = self.operator(name)
            kinds = sorted({o.kind for o in opportunities if op.usable(o)})
            if getattr(op, "accepts_follow_ups", False):
                kinds.append("follow-up")  # any opportunity proposed during the run
            if kinds:
                out[name] = kinds
        return out

    def choose(self, state: dict[str, Any]) -> Choice:
        pending = [self.store.get(o) for o in state["pending_opportunities"]]
        trial = self.scheduler.ask()
        usable = [o for o in pending if any(self.operator(n).usable(o) for n in self.scheduler.kinds)]
        op, opp, parent = self.scheduler.choose(trial, state["frontier"], usable, state["best"])
        return Choice(trial, op, opp, parent)

    def propose(self, choice: Choice) -> tuple[Proposal, float]:
        t0 = time.time()
        parent = self.store.get(choice.parent)
        ctx = ActionContext(self.family, parent, self.store.source(parent.source_hash), choice.opportunity,
                            self.cfg, self.store, choice.trial)
        try:
            proposal = self.operator(choice.operator).propose(ctx)
        except Exception:  # an operator bug must not end the run: it becomes a failed action
            proposal = Proposal(None, "joint", error="operator raised:\n" + traceback.format_exc(limit=4))
        return proposal, time.time() - t0

    def after_audit(self, choice: Choice, proposal: Proposal, verdict: Any) -> list[dict[str, Any]]:
        """The operator's follow-up opportunities once its offspring is judged (none if it raises)."""
        parent = self.store.get(choice.parent)
        ctx = ActionContext(self.family, parent, "", choice.opportunity, self.cfg, self.store, choice.trial)
        try:
            return list(self.operator(choice.operator).after_audit(ctx, proposal, verdict))
        except Exception:  # noqa: BLE001 - follow-ups are advice; losing them must not lose the audit
            return []
