"""Lineage management: judging an offspring, and every decision on the lineage that follows.

Promotion needs every check passed, every workload within its limit (t_j <= limit_j * t_j(root)) and an
objective strictly lower than the best's by more than a noise margin taken from the measured spread (the
best re-timed in the same audit when available). Lineage decisions are separate from promotion: verified
offspring are kept as parents (continue), set aside (archive) and later revived (reactivate); failed ones are
abandoned and never become parents. The loop hands each audited offspring to `record_offspring`; the root enters
through `set_root`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from tik_evo.objective import weighted
from tik_evo.records import ACTIVE, ARCHIVED, BEST, FAILED, Audit, Decision, Implementation
from tik_evo.run_state import RunState
from tik_evo.store import Txn
from tik_evo.timing import timer_of

if TYPE_CHECKING:
    from tik_evo.audit import AuditOutcome


def objective(measurements: dict[str, dict[str, Any]], state: RunState, normalize: bool,
              root: dict[str, float] | None = None) -> float:
    times = {name: measurements[name]["median_s"] for name in state.weights}
    return weighted(times, state.weights, root or state.root_latencies, normalize)


def root_latencies(state: RunState, gpu: int | None) -> dict[str, float]:
    """The root's latencies on the GPU an audit ran on (concurrent audits time the root on each of their GPUs),
    else the ones measured at initialization."""
    return state.root_latencies_by_gpu.get(str(gpu)) or state.root_latencies


@dataclass
class Verdict:
    objective: float | None = None
    best_objective: float | None = None  # the best's T, re-timed in this audit when possible
    margin: float = 0.0
    admissible: bool = False
    promoted: bool = False
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    reason: str = ""


def judge(passed: bool, measurements: dict, best_retimed: dict, state: RunState, cfg: DictConfig,
          gpu: int | None = None) -> Verdict:
    """``gpu``: the GPU the audit ran on, whose own root timings anchor the limits and the normalisation."""
    v = Verdict()
    if not passed:
        v.reason = "audit failed"
        return v
    if set(measurements) != set(state.weights):
        v.reason = "not every workload was measured"
        return v
    norm, root = cfg.objective.normalize, root_latencies(state, gpu)
    v.objective = objective(measurements, state, norm, root)
    for name, lim in state.limits.items():
        t, max_s = measurements[name]["median_s"], lim["limit"] * root[name]
        v.limits[name] = {"t_s": t, "max_s": max_s, "ratio_vs_root": t / root[name], "limit": lim["limit"],
                          "ok": t <= max_s}
    over = [n for n, x in v.limits.items() if not x["ok"]]
    v.admissible = not over
    same_audit = bool(best_retimed) and set(best_retimed) == set(measurements)
    v.best_objective = objective(best_retimed, state, norm, root) if same_audit else state.best_objective
    spreads = [m.get("spread", 0.0) for m in measurements.values()]
    if same_audit:
        spreads += [m.get("spread", 0.0) for m in best_retimed.values()]
    v.margin = max(cfg.objective.min_margin, cfg.objective.noise_k * statistics.median(spreads))
    if not v.admissible:
        v.reason = f"over its slowdown limit on {len(over)} workload(s): {', '.join(over[:4])}"
    elif v.objective < v.best_objective * (1 - v.margin):
        v.promoted = True
        v.reason = (f"T {v.objective:.6g} < best {v.best_objective:.6g} by "
                    f"{(1 - v.objective / v.best_objective):.1%} (margin {v.margin:.1%})")
    else:
        v.reason = (f"T {v.objective:.6g} vs best {v.best_objective:.6g}: not better by more than the "
                    f"margin {v.margin:.1%}")
    return v


def overshoot(limits: dict[str, dict[str, Any]]) -> float:
    """The worst time against its slowdown limit, as a fraction over it (<= 0: within every limit)."""
    return max(x["ratio_vs_root"] / x["limit"] - 1 for x in limits.values())


# -- the lineage's records -------------------------------------------------------------------------------------
def set_root(txn: Txn, root: Implementation) -> None:
    """The verified root (its objective set): the first best and the frontier's only member."""
    st = txn.state
    root.status = BEST
    txn.put(root)
    st.root = st.best = root.id
    st.frontier = [root.id]
    st.root_objective = st.best_objective = root.objective
    st.sources[root.source_hash] = root.id
    st.history.append({"evaluation": 0, "impl": root.id, "objective": root.objective, "best": root.objective,
                       "promoted": True})


def record_offspring(txn: Txn, impl: Implementation, outcome: AuditOutcome, best_at_start: str, cfg: DictConfig,
                     gpu: int | None) -> tuple[Audit, Verdict]:
    """An audited offspring into the lineage: judged against the best, recorded with its audit, decided on (and
    its primary parent, `impl.parents[0]`, with it), counted as an evaluation and in the best-so-far history.
    ``best_at_start``: the best when its step began; ``gpu``: the GPU that audited it (None on the CPU)."""
    st = txn.state
    uid = txn.new_id("U")
    st.sources[impl.source_hash] = impl.id
    # The best re-timed in this audit is the reference only if it is still the best: with concurrent
    # audits another may have been promoted meanwhile, and then the stored best objective is.
    retimed = outcome.best_retimed if st.best == best_at_start else {}
    verdict = judge(outcome.passed, outcome.measurements, retimed, st, cfg, gpu)
    audit = Audit(uid, impl.id, outcome.stages, outcome.measurements, outcome.best_retimed, verdict.objective,
                  verdict.best_objective, verdict.margin, outcome.passed, verdict.admissible, verdict.promoted,
                  outcome.failure_kind, outcome.failure, verdict.limits, timer_of(outcome.measurements),
                  outcome.device, outcome.seconds)
    failed = audit.failure_kind is not None
    impl.status, impl.audit, impl.objective, impl.created = "pending", uid, verdict.objective, time.time()
    txn.put(impl)
    txn.put(audit)
    st.evaluations += 1
    apply(txn, impl.id, impl.parents[0], verdict, uid, cfg, failed, audit.failure or verdict.reason)
    st.history.append({"evaluation": st.evaluations, "impl": impl.id, "objective": verdict.objective,
                       "best": st.best_objective, "promoted": verdict.promoted, "failed": failed,
                       "admissible": verdict.admissible})
    return audit, verdict


def ancestors(get: Callable[[str], Implementation | None], parents: list[str], most: int = 256) -> list[str]:
    """Source hashes of an offspring's ancestors (``get``: an implementation by id), nearest first: the compiled
    kernels it may reuse."""
    out, seen, todo = [], set(), list(parents)
    while todo and len(out) < most:
        iid = todo.pop(0)
        rec = None if iid in seen else get(iid)
        seen.add(iid)
        if rec is not None:
            out.append(rec.source_hash)
            todo += rec.parents
    return out


# -- decisions -------------------------------------------------------------------------------------------------
def _decide(txn: Txn, impl_id: str, decision: str, reason: str, evidence: list[str]) -> None:
    did = txn.new_id("D")
    txn.put(Decision(did, impl_id, decision, reason, evidence, txn.state.step))
    txn.event("decision", f"{decision} {impl_id}: {reason}", impl=impl_id)


def _set_status(txn: Txn, impl_id: str, status: str) -> None:
    impl = txn.get(impl_id)
    impl.status = status
    txn.put(impl)
    st = txn.state
    st.frontier = [i for i in st.frontier if i != impl_id]
    st.archive = [i for i in st.archive if i != impl_id]
    if status in (BEST, ACTIVE):
        st.frontier.append(impl_id)
    elif status == ARCHIVED:
        st.archive.append(impl_id)


def _sort_frontier(txn: Txn) -> None:
    objs = {i: txn.get(i).objective or float("inf") for i in txn.state.frontier}
    txn.state.frontier.sort(key=lambda i: objs[i])


def _merge_later(txn: Txn, child_id: str, parent_id: str, verdict: Verdict, audit_id: str) -> None:
    """A verified offspring that is not the best but beats its parent on some workloads holds a change worth
    combining with the best later (an LLM merge action picks these up)."""
    parent = txn.get(parent_id)
    audit = txn.get(parent.audit) if parent and parent.audit else None
    if audit is None:
        return
    better = [n for n, x in verdict.limits.items() if n in audit.measurements
              and x["t_s"] < audit.measurements[n]["median_s"] * (1 - verdict.margin)]
    if better:
        _decide(txn, child_id, "merge-later", f"faster than its parent {parent_id} on {', '.join(better[:4])}",
                [audit_id, parent.audit])


def _stepping_stone(verdict: Verdict, cfg: DictConfig) -> bool:
    return bool(cfg.search.stepping_stones and cfg.ablation.lineage_management and verdict.objective is not None
                and verdict.best_objective and verdict.objective < verdict.best_objective)


def apply(txn: Txn, child_id: str, parent_id: str, verdict: Verdict, audit_id: str, cfg: DictConfig,
          failed: bool, failure: str) -> None:
    """Record the lineage decisions for one audited offspring and update the frontier, archive and κ."""
    st = txn.state
    lm, branch = cfg.ablation.lineage_management, cfg.ablation.branch_exploration
    streak = st.parent_streak
    if failed:
        _set_status(txn, child_id, FAILED)
        _decide(txn, child_id, "abandon", f"failed audit: {failure[:300]}", [audit_id])
    elif verdict.promoted:
        _set_status(txn, st.best, ACTIVE if branch else ARCHIVED)
        _set_status(txn, child_id, BEST)
        st.best, st.best_objective = child_id, verdict.objective
        _decide(txn, child_id, "promote", verdict.reason, [audit_id])
    elif not verdict.admissible and _stepping_stone(verdict, cfg):
        # Over a limit but better on T: never the best, yet a parent, so the change that brings the slow workload
        # back within its limit is one step away (a valley the best alone cannot cross in one move).
        _set_status(txn, child_id, ACTIVE)
        _decide(txn, child_id, "continue", f"stepping stone: T {verdict.objective:.6g} below the best's "
                f"{verdict.best_objective:.6g} but {verdict.reason}; a parent, never promoted", [audit_id])
    elif not verdict.admissible:
        # Correct but over a slowdown limit: not a parent now, yet a later change may fix the slow workload.
        _set_status(txn, child_id, ARCHIVED)
        _decide(txn, child_id, "archive", f"verified but inadmissible: {verdict.reason}", [audit_id])
    elif not branch:
        _set_status(txn, child_id, ARCHIVED)
        _decide(txn, child_id, "archive", f"branch exploration disabled; {verdict.reason}", [audit_id])
    elif lm and verdict.objective is not None and verdict.objective > cfg.search.archive_factor * st.best_objective:
        _set_status(txn, child_id, ARCHIVED)
        _decide(txn, child_id, "archive", f"verified but {verdict.objective / st.best_objective:.2f}x the best's "
                f"T (> {cfg.search.archive_factor}x); kept for reactivation", [audit_id])
    else:
        _set_status(txn, child_id, ACTIVE)
        _decide(txn, child_id, "continue", f"verified; {verdict.reason}; kept as a parent", [audit_id])

    if lm and not failed and not verdict.promoted:
        _merge_later(txn, child_id, parent_id, verdict, audit_id)
    improved = verdict.promoted
    st.kappa = 0 if improved else st.kappa + 1
    streak[parent_id] = 0 if improved else streak.get(parent_id, 0) + 1
    if not lm:
        _sort_frontier(txn)
        return
    # A parent that keeps producing nothing better is set aside (it stays reactivatable).
    if parent_id != st.best and parent_id in st.frontier and streak[parent_id] >= cfg.search.parent_patience:
        _set_status(txn, parent_id, ARCHIVED)
        _decide(txn, parent_id, "archive", f"{streak[parent_id]} offspring in a row did not improve the best",
                [audit_id])
    _sort_frontier(txn)
    while len(st.frontier) > cfg.search.frontier_size:
        worst = st.frontier[-1]
        _set_status(txn, worst, ARCHIVED)
        _decide(txn, worst, "archive", f"frontier full ({cfg.search.frontier_size}); slowest verified", [audit_id])
    # Revisit a set-aside alternative when the search stalls: verified intermediates can enable later gains.
    if branch and st.kappa and st.kappa % cfg.search.reactivate_every == 0 and st.archive:
        objs = {i: txn.get(i).objective or float("inf") for i in st.archive}
        pick = min(st.archive, key=lambda i: objs[i])
        streak[pick] = 0
        _set_status(txn, pick, ACTIVE)
        _decide(txn, pick, "reactivate", f"κ={st.kappa} without improvement; best archived alternative "
                f"(T {objs[pick]:.6g}) returns to the frontier", [audit_id])
        _sort_frontier(txn)
        while len(st.frontier) > cfg.search.frontier_size:
            worst = st.frontier[-1] if st.frontier[-1] != pick else st.frontier[-2]
            _set_status(txn, worst, ARCHIVED)
            _decide(txn, worst, "archive", "frontier full after a reactivation", [audit_id])
