"""The search loop, top to bottom: initialization → action → audit → lineage management, one store
transaction per step, until κ, the evaluation budget, the wall-time budget or the space runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from tik_evo import lineage
from tik_evo.action import Actor, Choice
from tik_evo.audit import AuditJob, AuditOutcome, run_audit, source_file
from tik_evo.family import Family
from tik_evo.knobs import knobs_or_none
from tik_evo.operators.base import Proposal
from tik_evo.records import Action, Audit, Implementation, Opportunity
from tik_evo.scheduler import Scheduler, trial_value
from tik_evo.store import Store, Txn, source_hash
from tik_evo.timing import timer_of


class Search:
    def __init__(self, store: Store, cfg: DictConfig, family: Family, on_step: Callable[[dict], None] | None = None):
        self.store, self.cfg, self.family = store, cfg, family
        self.on_step = on_step or (lambda s: None)
        state = store.state()
        self.device = state["device"]
        self.workloads = state["workloads"]
        # The scheduler's space must stay static across resumes: family opportunities only (plus "follow-up").
        opportunities = [o for o in store.all("O") if o.origin == "family"]
        self.actor = Actor(cfg, family, store, None)  # type: ignore[arg-type]
        self.scheduler = Scheduler(cfg, store.run_dir, self.actor.kinds(opportunities))
        self.actor.scheduler = self.scheduler
        self._overhead: float | None = None  # last step's engine time, stored with the next write
        self._recover()

    def _recover(self) -> None:
        """Tell the study what the IR recorded for trials a killed run left open (failed if nothing)."""
        outcome: dict[int, float | None] = {}
        for a in self.store.all("A"):
            if a.trial is not None:
                outcome[a.trial] = a.params.get("_trial_value")
        self.scheduler.recover(outcome)

    # -- stopping ------------------------------------------------------------------------------------------
    def stop_reason(self, st: dict[str, Any]) -> str | None:
        s = self.cfg.search
        if st["kappa"] >= s.kappa_threshold:
            return f"κ reached {st['kappa']} (threshold {s.kappa_threshold})"
        if st["evaluations"] >= s.max_evaluations:
            return f"evaluation budget used ({st['evaluations']}/{s.max_evaluations})"
        if st["budgets"]["wall_s"] >= s.wall_time_s:
            return f"wall-time budget used ({st['budgets']['wall_s']:.0f}/{s.wall_time_s:.0f} s)"
        if st.get("duplicates_in_a_row", 0) >= s.max_duplicates:
            return f"{st['duplicates_in_a_row']} proposals in a row repeated existing sources (space exhausted?)"
        llm = self.cfg.llm
        if llm.max_tokens and st["budgets"]["tokens"] >= llm.max_tokens:
            return f"token budget used ({st['budgets']['tokens']}/{llm.max_tokens})"
        if llm.max_usd and st["budgets"]["usd"] >= llm.max_usd:
            return f"USD budget used ({st['budgets']['usd']:.2f}/{llm.max_usd:.2f})"
        if not st["pending_opportunities"]:
            return "no pending opportunities"
        return None

    def run(self) -> str:
        while True:
            st = self.store.state()
            reason = self.stop_reason(st)
            if reason:
                with self.store.transaction() as txn:
                    self._flush_overhead(txn)
                    txn.state["finished"] = {"reason": reason, "at": time.time()}
                    txn.event("finish", f"search finished: {reason}")
                return reason
            self.step(st)

    def _flush_overhead(self, txn: Txn) -> None:
        if self._overhead is not None:
            over = txn.state["engine_overhead_s"]
            over.append(self._overhead)
            del over[:-200]
            self._overhead = None

    # -- one step ------------------------------------------------------------------------------------------
    def step(self, st: dict[str, Any]) -> None:
        t0 = time.time()
        try:
            choice = self.actor.choose(st)
        except LookupError as e:
            with self.store.transaction() as txn:
                txn.state["pending_opportunities"] = []
                txn.event("scheduler", str(e))
            return
        self.on_step({"phase": "action", "text": f"{choice.operator} on {choice.parent} "
                      f"({choice.opportunity.kind if choice.opportunity else '-'})", "state": st})
        proposal, t_op = self.actor.propose(choice)
        outcome: AuditOutcome | None = None
        existing = None
        h = None
        if proposal.source is not None:
            h = source_hash(proposal.source)
            existing = st["sources"].get(h)
            if existing is None:
                self.on_step({"phase": "audit", "text": f"auditing offspring of {choice.parent}: "
                              f"{proposal.rationale[:80]}", "state": st})
                best = self.store.get(st["best"])
                source_file(self.store.run_dir, best.source_hash, self.store.source(best.source_hash))
                outcome = run_audit(self.store.run_dir, AuditJob(
                    self.family, proposal.source, h, f"I{st['counters']['I']}", self.workloads,
                    list(self.cfg.correctness.seeds), dict(self.cfg.evaluate), self.device,
                    self.cfg.evaluate.gpu_index,
                    best.source_hash if self.cfg.evaluate.retime_best else None))
        t_audit = outcome.seconds if outcome else 0.0
        t1 = time.time()
        with self.store.transaction() as txn:
            txn.state["step"] += 1
            value = self._record(txn, choice, proposal, h, existing, outcome, t0)
            txn.state["budgets"]["wall_s"] += time.time() - t0
            self._flush_overhead(txn)
        self.scheduler.tell(choice.trial.number, value)
        # Store + scheduler time this step, excluding the operator and the audit (reported by `status`).
        self._overhead = (t1 - t0 - t_op - t_audit) + (time.time() - t1)
        self.on_step({"phase": "done", "state": self.store.state()})

    def _record(self, txn: Txn, choice: Choice, proposal: Proposal, h: str | None, existing: str | None,
                outcome: AuditOutcome | None, t0: float) -> float | None:
        st = txn.state
        aid = txn.new_id("A")
        action = Action(aid, choice.opportunity.id if choice.opportunity else None,
                        [choice.parent, *proposal.parents], proposal.scope, choice.operator,
                        proposal.rationale, proposal.expected, dict(proposal.params), choice.trial.number,
                        tokens=proposal.tokens, cost_usd=proposal.cost_usd, started=t0, finished=time.time())
        st["budgets"]["tokens"] += sum(proposal.tokens.values())
        st["budgets"]["usd"] += proposal.cost_usd
        if outcome is None:
            # Nothing to audit: the operator failed, changed nothing, or repeated an existing source.
            same = existing if existing else (choice.parent if proposal.error == "no-change" else None)
            action.outcome = "duplicate" if existing else ("no-change" if same else "failed-to-apply")
            action.offspring, action.error = existing, proposal.error if not existing else ""
            value = self._value_of(txn, same) if same else None
            action.params["_trial_value"] = value
            txn.put(action)
            st["duplicates"] += 1
            st["duplicates_in_a_row"] = st.get("duplicates_in_a_row", 0) + 1
            if action.outcome == "failed-to-apply":
                st["failures_by_kind"]["action"] = st["failures_by_kind"].get("action", 0) + 1
            txn.event("action", f"{aid} {choice.operator}: {action.outcome} {proposal.error[:120]}".rstrip())
            return value
        st["duplicates_in_a_row"] = 0
        iid, uid = txn.new_id("I"), txn.new_id("U")
        txn.put_source(proposal.source or "")
        st["sources"][h] = iid
        verdict = lineage.judge(outcome.passed, outcome.measurements, outcome.best_retimed, st, self.cfg)
        audit = Audit(uid, iid, outcome.stages, outcome.measurements, outcome.best_retimed, verdict.objective,
                      verdict.best_objective, verdict.margin, outcome.passed, verdict.admissible, verdict.promoted,
                      outcome.failure_kind, outcome.failure, verdict.limits, timer_of(outcome.measurements), outcome.device,
                      outcome.seconds)
        failed = audit.failure_kind is not None
        if outcome.passed and not verdict.admissible:
            st["failures_by_kind"]["over-limit"] = st["failures_by_kind"].get("over-limit", 0) + 1
        impl = Implementation(iid, h or "", [choice.parent, *proposal.parents], proposal.scope, "pending", aid, uid,
                              knobs_or_none(proposal.source), verdict.objective, time.time())
        action.offspring, action.outcome = iid, "audited"
        txn.put(impl)
        txn.put(audit)
        st["evaluations"] += 1
        if failed:
            k = audit.failure_kind
            st["failures_by_kind"][k] = st["failures_by_kind"].get(k, 0) + 1
        lineage.apply(txn, iid, choice.parent, verdict, uid, self.cfg, failed, audit.failure or verdict.reason)
        if not failed:
            proposal.follow_ups += self.actor.after_audit(choice, proposal, verdict)
        self._use_opportunity(txn, choice.opportunity, proposal, uid)
        value = None if failed else trial_value(verdict.objective, verdict.best_objective)
        if value is not None and not verdict.admissible:
            # Tell the sampler an over-limit offspring is worse than no change, by how far it overshot.
            excess = max(x["ratio_vs_root"] / x["limit"] - 1 for x in verdict.limits.values())
            value = min(value, 0.0) - excess
        action.params["_trial_value"] = value
        txn.put(action)
        st["history"].append({"evaluation": st["evaluations"], "impl": iid, "objective": verdict.objective,
                              "best": st["best_objective"], "promoted": verdict.promoted, "failed": failed,
                              "admissible": verdict.admissible})
        txn.event("audit", f"{iid} ({choice.operator}, {proposal.scope}): "
                  + (f"FAILED {audit.failure_kind}" if failed else ("PROMOTED " if verdict.promoted else "")
                     + verdict.reason), impl=iid)
        return value

    def _value_of(self, txn: Txn, impl_id: str) -> float | None:
        impl = txn.get(impl_id)
        return trial_value(impl.objective, txn.state["best_objective"]) if impl and impl.objective else None

    def _use_opportunity(self, txn: Txn, opp: Opportunity | None, proposal: Proposal, audit_id: str) -> None:
        st = txn.state
        if opp is not None:
            opp = txn.get(opp.id)
            opp.uses += 1
            opp.evidence.append(audit_id)
            if not opp.repeatable:
                opp.status = "consumed"
                st["pending_opportunities"] = [o for o in st["pending_opportunities"] if o != opp.id]
            txn.put(opp)
        for f in proposal.follow_ups:
            oid = txn.new_id("O")
            txn.put(Opportunity(oid, f.get("kind", "follow-up"), f.get("mechanism", ""),
                                list(f.get("paths", ["full", "decode"])), list(f.get("knobs", [])),
                                origin=f"{'split' if f.get('split') else 'audit'}:{audit_id}", evidence=[audit_id],
                                created=time.time(), values=dict(f.get("values", {}))))
            st["pending_opportunities"].append(oid)
