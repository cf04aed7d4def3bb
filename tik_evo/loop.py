"""The search loop, top to bottom: initialization → action → audit → lineage management, one store
transaction per step, until κ, the evaluation budget, the wall-time budget or the space runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from tik_evo import lineage, screen
from tik_evo.action import Actor, Choice
from tik_evo.audit import AuditJob, AuditOutcome, audit_slots, close_executors, run_audit, static_scan
from tik_evo.family import Family
from tik_evo.knobs import canonical_source, knobs_or_none
from tik_evo.operators.base import Proposal
from tik_evo.records import Action, Implementation, Opportunity
from tik_evo.run_state import RunState
from tik_evo.scheduler import Scheduler, trial_value
from tik_evo.store import Store, Txn, source_hash


@dataclass
class Pending:
    """One step between the operator's proposal and its record: the audit to run, if any."""
    choice: Choice
    proposal: Proposal
    t0: float
    t_op: float
    best: str  # the best when the step began (its re-timing in the audit is a reference only while it stays best)
    h: str | None = None  # the offspring's source hash
    existing: str | None = None  # the implementation that already has this source (or is auditing it now)
    in_flight: bool = False
    reserved: str | None = None  # the implementation id reserved for a concurrent audit
    job: AuditJob | None = None
    overshoot: float | None = None  # the audited offspring's worst time over a slowdown limit (fraction)


class Search:
    def __init__(self, store: Store, cfg: DictConfig, family: Family, on_step: Callable[[dict], None] | None = None):
        self.store, self.cfg, self.family = store, cfg, family
        self.on_step = on_step or (lambda s: None)
        state = store.state()
        self.device = state.device
        self.workloads = state.workloads
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
        overshoot: dict[int, float] = {}
        for a in self.store.all("A"):
            if a.trial is not None:
                outcome[a.trial] = a.params.get("_trial_value")
                if self.cfg.search.constraints and a.params.get("_overshoot") is not None:
                    overshoot[a.trial] = a.params["_overshoot"]
        self.scheduler.recover(outcome, overshoot)

    # -- stopping ------------------------------------------------------------------------------------------
    def stop_reason(self, st: RunState, in_flight: int = 0) -> str | None:
        """Why no new step may start; audits in flight count against the evaluation budget."""
        s, spent = self.cfg.search, st.budgets
        if st.kappa >= s.kappa_threshold:
            return f"κ reached {st.kappa} (threshold {s.kappa_threshold})"
        if st.evaluations + in_flight >= s.max_evaluations:
            return f"evaluation budget used ({st.evaluations}/{s.max_evaluations})"
        if spent["wall_s"] >= s.wall_time_s:
            return f"wall-time budget used ({spent['wall_s']:.0f}/{s.wall_time_s:.0f} s)"
        if st.duplicates_in_a_row >= s.max_duplicates:
            return f"{st.duplicates_in_a_row} proposals in a row repeated existing sources (space exhausted?)"
        llm = self.cfg.llm
        if llm.max_tokens and spent["tokens"] >= llm.max_tokens:
            return f"token budget used ({spent['tokens']}/{llm.max_tokens})"
        if llm.max_usd and spent["usd"] >= llm.max_usd:
            return f"USD budget used ({spent['usd']:.2f}/{llm.max_usd:.2f})"
        if not st.pending_opportunities:
            return "no pending opportunities"
        return None

    def run(self) -> str:
        slots = audit_slots(self.cfg.evaluate, self.device)
        if len(slots) > 1:
            return self._run_concurrently(slots)
        while True:
            st = self.store.state()
            reason = self.stop_reason(st)
            if reason:
                return self._finish_run(reason)
            self.step(st)

    def _finish_run(self, reason: str) -> str:
        with self.store.transaction() as txn:
            self._flush_overhead(txn)
            txn.state.finished = {"reason": reason, "at": time.time()}
            txn.event("finish", f"search finished: {reason}")
        return reason

    def _run_concurrently(self, slots: list[int]) -> str:
        """One audit per slot (GPU) at once. This thread chooses, proposes and records, one transaction per
        step as before; audits run in their worker processes, waited on by a pool thread each. An offspring is
        judged against the best of the moment it is recorded (see `_record`)."""
        in_flight: dict[Future, Pending] = {}
        free, mark = list(enumerate(slots)), time.time()  # (slot, GPU index)

        def record(pending: Pending, outcome: AuditOutcome | None) -> None:
            nonlocal mark
            now = time.time()
            self.finish(pending, outcome, wall_s=now - mark)  # wall time once, however many audits overlap
            mark = now

        pool = ThreadPoolExecutor(len(slots), thread_name_prefix="audit")
        try:
            while True:
                st = self.store.state()
                reason = self.stop_reason(st, len(in_flight))
                if reason is None and free:
                    pending = self.begin(st, time.time(), free[0], {p.h: p.reserved for p in in_flight.values()})
                    if pending is not None and pending.job is None:
                        record(pending, None)
                    elif pending is not None:
                        free.pop(0)
                        where = f"GPU {pending.job.gpu_index}" if self.device == "cuda" else "the CPU"
                        self.on_step({"phase": "audit", "text": f"auditing offspring of {pending.choice.parent} "
                                      f"on {where} ({len(in_flight) + 1} in flight)", "state": st})
                        static = static_scan(pending.job)  # here: `ast` must not run in two threads at once
                        in_flight[pool.submit(run_audit, self.store.run_dir, pending.job, static)] = pending
                    continue
                if not in_flight:
                    return self._finish_run(reason or "stopped")
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    pending = in_flight.pop(future)
                    free.append((pending.job.slot, pending.job.gpu_index))
                    record(pending, future.result())
        except BaseException:
            # Interrupted (or a bug): stop the audits in flight instead of waiting for them. Their steps are
            # not recorded; a resumed run tells their trials as failed and goes on.
            close_executors()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _flush_overhead(self, txn: Txn) -> None:
        if self._overhead is not None:
            over = txn.state.engine_overhead_s
            over.append(self._overhead)
            del over[:-200]
            self._overhead = None

    # -- one step ------------------------------------------------------------------------------------------
    def step(self, st: RunState) -> None:
        t0 = time.time()
        pending = self.begin(st, t0)
        if pending is None:
            return
        outcome = None
        if pending.job is not None:
            self.on_step({"phase": "audit", "text": f"auditing offspring of {pending.choice.parent}: "
                          f"{pending.proposal.rationale[:80]}", "state": st})
            outcome = run_audit(self.store.run_dir, pending.job)
        t1 = time.time()
        self.finish(pending, outcome, wall_s=time.time() - t0)
        # Store + scheduler time this step, excluding the operator and the audit (reported by `status`).
        self._overhead = (t1 - t0 - pending.t_op - (outcome.seconds if outcome else 0.0)) + (time.time() - t1)

    def begin(self, st: RunState, t0: float, slot: tuple[int, int] | None = None,
              in_flight: dict[str, str] | None = None) -> Pending | None:
        """Choose (operator, opportunity, parent) and let the operator write; the audit job if there is one to
        run. ``in_flight`` maps the sources being audited now to their reserved ids (concurrent audits only)."""
        try:
            choice = self.actor.choose(st)
        except LookupError as e:
            with self.store.transaction() as txn:
                txn.state.pending_opportunities = []
                txn.event("scheduler", str(e))
            return None
        self.on_step({"phase": "action", "text": f"{choice.operator} on {choice.parent} "
                      f"({choice.opportunity.kind if choice.opportunity else '-'})", "state": st})
        proposal, t_op = self.actor.propose(choice)
        pending = Pending(choice, proposal, t0, t_op, best=st.best)
        if proposal.source is None:
            return pending
        # Same KNOBS laid out differently (an LLM rewrite, a hand-formatted file) is the same source: one audit.
        proposal.source = canonical_source(proposal.source)
        pending.h = h = source_hash(proposal.source)
        pending.existing = st.sources.get(h)
        if pending.existing is None and in_flight is not None and h in in_flight:
            pending.existing = in_flight[h]  # the same source is being audited now: a repeat, not a new one
            pending.in_flight = True
        if pending.existing is not None:
            return pending
        if in_flight is None:
            impl_id = f"I{st.counters['I']}"  # the id this step's record will take
        else:
            with self.store.transaction() as txn:  # concurrent audits: each reserves its id up front
                impl_id = pending.reserved = txn.new_id("I")
        best = self.store.get(st.best)
        best_source = self.store.source(best.source_hash)  # from the IR: the judge times exactly this text
        gpu = audit_slots(self.cfg.evaluate, self.device)[0] if slot is None else slot[1]
        pending.job = AuditJob(
            self.family, proposal.source, h, impl_id, self.workloads, list(self.cfg.correctness.seeds),
            OmegaConf.to_container(self.cfg.evaluate), self.device, gpu,
            best.source_hash if self.cfg.evaluate.retime_best else None,
            best_source if self.cfg.evaluate.retime_best else None,
            lineage.ancestors(self.store.get, [choice.parent, *proposal.parents]),
            slot=0 if slot is None else slot[0], screen=self._screen_ref(st, gpu))
        return pending

    def _screen_ref(self, st, gpu) -> dict | None:
        """evaluate.screen's reference for an audit on ``gpu``: the best's objective, the limits, the root's times."""
        if not self.cfg.evaluate.screen or not st.best_objective or not st.weights:
            return None
        root = lineage.root_latencies(st, gpu if self.device == "cuda" else None)
        return screen.spec(st.weights, root, st.limits, self.cfg.objective.normalize, st.best_objective,
                           self.cfg.evaluate.screen_margin,
                           stones=self.cfg.search.stepping_stones and self.cfg.ablation.lineage_management)

    def finish(self, pending: Pending, outcome: AuditOutcome | None, wall_s: float) -> None:
        """Record the step (action, offspring, audit, decisions, state) in one transaction; tell the sampler."""
        with self.store.transaction() as txn:
            txn.state.step += 1
            value = self._record(txn, pending, outcome)
            txn.state.budgets["wall_s"] += wall_s
            self._flush_overhead(txn)
        self.scheduler.tell(pending.choice.trial.number, value,
                            overshoot=pending.overshoot if self.cfg.search.constraints else None)
        self.on_step({"phase": "done", "state": self.store.state()})

    def _record(self, txn: Txn, pending: Pending, outcome: AuditOutcome | None) -> float | None:
        """The step's records; the value the sampler is told (None: failed)."""
        st = txn.state
        choice, proposal = pending.choice, pending.proposal
        aid = txn.new_id("A")
        action = Action(aid, choice.opportunity.id if choice.opportunity else None,
                        [choice.parent, *proposal.parents], proposal.scope, choice.operator,
                        proposal.rationale, proposal.expected, dict(proposal.params), choice.trial.number,
                        tokens=proposal.tokens, cost_usd=proposal.cost_usd, started=pending.t0, finished=time.time())
        st.budgets["tokens"] += sum(proposal.tokens.values())
        st.budgets["usd"] += proposal.cost_usd
        if outcome is None:
            return self._record_unaudited(txn, pending, action)
        st.duplicates_in_a_row = 0
        iid = pending.reserved or txn.new_id("I")
        txn.put_source(proposal.source or "")
        offspring = Implementation(iid, pending.h or "", list(action.parents), proposal.scope, "pending", aid,
                                   knobs=knobs_or_none(proposal.source))
        gpu = pending.job.gpu_index if self.device == "cuda" else None
        audit, verdict = lineage.record_offspring(txn, offspring, outcome, pending.best, self.cfg, gpu)
        failed = audit.failure_kind is not None
        if failed:
            st.count_failure(audit.failure_kind)
        elif outcome.passed and not verdict.admissible:
            st.count_failure("over-limit")
        action.offspring, action.outcome = iid, "audited"
        if not failed:
            proposal.follow_ups += self.actor.after_audit(choice, proposal, verdict)
        self._use_opportunity(txn, choice.opportunity, proposal, audit.id)
        value = None if failed else trial_value(verdict.objective, verdict.best_objective)
        if audit.failure_kind == screen.SCREENED and outcome.measurements:
            # Screened: not a verdict on its correctness, and its timings are known; the sampler learns from them.
            verdict = lineage.judge(True, outcome.measurements, {}, st, self.cfg, gpu)
            value = trial_value(verdict.objective, verdict.best_objective) if verdict.objective else None
        if value is not None and verdict.limits:
            pending.overshoot = lineage.overshoot(verdict.limits)
            action.params["_overshoot"] = pending.overshoot
        if value is not None and not verdict.admissible and not self.cfg.search.constraints:
            # Tell the sampler an over-limit offspring is worse than no change, by how far it overshot (with
            # search.constraints it is told its own value and flagged infeasible by the overshoot instead).
            value = min(value, 0.0) - pending.overshoot
        action.params["_trial_value"] = value
        txn.put(action)
        txn.event("audit", f"{iid} ({choice.operator}, {proposal.scope}): "
                  + (f"FAILED {audit.failure_kind}" if failed else ("PROMOTED " if verdict.promoted else "")
                     + verdict.reason), impl=iid)
        return value

    def _record_unaudited(self, txn: Txn, pending: Pending, action: Action) -> float | None:
        """Nothing to audit: the operator failed, changed nothing, or repeated an existing source."""
        st, proposal, existing = txn.state, pending.proposal, pending.existing
        same = existing if existing else (pending.choice.parent if proposal.error == "no-change" else None)
        action.outcome = "duplicate" if existing else ("no-change" if same else "failed-to-apply")
        action.offspring, action.error = existing, proposal.error if not existing else ""
        if pending.in_flight:  # its implementation is not recorded yet (nor ever, if the run is killed now)
            action.offspring, action.error = None, f"repeats the source being audited now as {existing}"
        # A repeat of a source still in flight has no objective yet: told as failed, like an operator error.
        value = self._value_of(txn, same, pending) if same and not pending.in_flight else None
        action.params["_trial_value"] = value
        txn.put(action)
        st.duplicates += 1
        st.duplicates_in_a_row += 1
        if action.outcome == "failed-to-apply":
            st.count_failure("action")
        txn.event("action", f"{action.id} {action.operator}: {action.outcome} {proposal.error[:120]}".rstrip())
        return value

    def _value_of(self, txn: Txn, impl_id: str, pending: Pending) -> float | None:
        """The value of a proposal that repeats ``impl_id``: that implementation's, told as its own audit was (an
        over-limit one penalised, or flagged by its overshoot under search.constraints)."""
        impl = txn.get(impl_id)
        if not impl or not impl.objective:
            return None
        value = trial_value(impl.objective, txn.state.best_objective)
        audit = txn.get(impl.audit) if impl.audit else None
        limits = audit.limits if audit else {}
        if limits:
            pending.overshoot = lineage.overshoot(limits)
            if pending.overshoot > 0 and not self.cfg.search.constraints:
                value = min(value, 0.0) - pending.overshoot
        return value

    def _use_opportunity(self, txn: Txn, opp: Opportunity | None, proposal: Proposal, audit_id: str) -> None:
        st = txn.state
        if opp is not None:
            opp = txn.get(opp.id)
            opp.uses += 1
            opp.evidence.append(audit_id)
            if not opp.repeatable:
                opp.status = "consumed"
                st.pending_opportunities = [o for o in st.pending_opportunities if o != opp.id]
            txn.put(opp)
        for f in proposal.follow_ups:
            oid = txn.new_id("O")
            txn.put(Opportunity(oid, f.get("kind", "follow-up"), f.get("mechanism", ""),
                                list(f.get("paths", ["full", "decode"])), list(f.get("knobs", [])),
                                origin=f"{'split' if f.get('split') else 'audit'}:{audit_id}", evidence=[audit_id],
                                created=time.time(), values=dict(f.get("values", {}))))
            st.pending_opportunities.append(oid)
