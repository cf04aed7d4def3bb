"""Action: ask the scheduler for (operator, opportunity, parent) and let the operator write an offspring."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from tik_evo.family import Family
from tik_evo.neighbours import one_knob_moves, tried_moves
from tik_evo.operators import make_operator
from tik_evo.operators.base import ActionContext, Operator, Proposal
from tik_evo.records import Opportunity
from tik_evo.run_state import Moves, RunState
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

    def choose(self, state: RunState) -> Choice:
        if self.cfg.search.neighbours:
            self._queue_move(state.best)
        pending = [self.store.get(o) for o in state.pending_opportunities]
        trial = self.scheduler.ask()
        while trial.user_attrs.get("parent", state.best) != state.best:
            # A move queued for a former best (a run stopped between queueing and asking): not taken.
            self.scheduler.tell(trial.number, None, note="one-knob move of a former best, not taken")
            trial = self.scheduler.ask()
        usable = [o for o in pending if any(self.operator(n).usable(o) for n in self.scheduler.kinds)]
        op, opp, parent = self.scheduler.choose(trial, state.frontier, usable, state.best)
        return Choice(trial, op, opp, parent)

    def _queue_move(self, best: str) -> None:
        """Queue the best's next one-knob move (see `tik_evo.neighbours`) for the coming ask. The moves left
        live in the run's state; a new best replaces them with its own, not yet tried in the run. With other
        operators enabled, moves take every other step so those operators are not kept waiting."""
        moves: Moves | None = self.store.state().moves
        note = ""
        if moves is None or moves["of"] != best:
            # The root's values count as tried: moving back to one repeats the root's own measurement.
            tried = tried_moves(self.store.all("A"))
            tried |= {(k, repr(v)) for k, v in (self.store.get("I0").knobs or {}).items()}
            left = one_knob_moves(self.family, self.store.get(best).knobs or {}, self.store.all("O"),
                                  self.scheduler.kinds.get("knob", []), self.cfg.search.neighbours, tried)
            moves = {"of": best, "left": left, "skip": False}
            note = f"{len(left)} one-knob moves of {best} queued ahead of the sampler" if left else ""
        elif not moves["left"]:
            return
        if moves["left"]:
            if moves["skip"] and not set(self.scheduler.kinds) <= {"knob"}:
                moves["skip"] = False
            else:
                self.scheduler.queue([moves["left"].pop(0)], best)
                moves["skip"] = True
        with self.store.transaction() as txn:
            txn.state.moves = moves
            if note:
                txn.event("scheduler", note)

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
