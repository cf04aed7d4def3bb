"""Initialization: pick the device, audit and measure the root, anchor the limits, seed the opportunities.

Search starts only from a root that compiles, passes every check and is fully measured.
"""

from __future__ import annotations

import os
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tik_evo import lineage, warm_start
from tik_evo.audit import AuditJob, audit_slots, run_audit, static_scan
from tik_evo.config import ConfigError, start_label, to_yaml
from tik_evo.failure import clip
from tik_evo.family import Family, OpportunitySpec
from tik_evo.knobs import knobs_or_none, read_knobs, write_knobs
from tik_evo.records import FAILED, Audit, Implementation, Opportunity
from tik_evo.store import Store, source_hash
from tik_evo.timing import timer_of


class InitError(RuntimeError):
    pass


def check_gpus(cfg: DictConfig) -> list[int]:
    """The GPUs the run's audits go to (`audit_slots`), each checked to be visible; one audit per GPU."""
    if cfg.evaluate.executor == "ray":  # the cluster's GPUs, not this host's (tik_evo.ray_executor)
        return audit_slots(cfg.evaluate, "cuda")
    import torch

    count = torch.cuda.device_count()
    key = "evaluate.gpus" if cfg.evaluate.gpus else "evaluate.gpu_index"
    indices = audit_slots(cfg.evaluate, "cuda")
    for index in indices:
        if not 0 <= index < count:
            raise ConfigError(f"{cfg.source_file}: key {key!r}: {index}, but {count} CUDA device(s) are visible "
                              f"(indices count from 0 within CUDA_VISIBLE_DEVICES="
                              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    if cfg.evaluate.parallel > 1 and not cfg.evaluate.gpus:
        raise ConfigError(f"{cfg.source_file}: key 'evaluate.parallel': {cfg.evaluate.parallel} audits on one GPU "
                          f"would time each other's kernels; list a GPU per audit in evaluate.gpus instead")
    return indices


def resolve_device(cfg: DictConfig) -> tuple[str, dict[str, Any], list[str]]:
    """Return ("cuda" | "cpu", facts to record, warnings), applying the campaign's GPU policy."""
    if cfg.evaluate.executor == "ray":
        from tik_evo.ray_executor import resolve_device as on_cluster

        return on_cluster(cfg)
    import torch

    warnings: list[str] = []
    want, policy, name = cfg.device, cfg.gpu.policy, cfg.gpu.name
    has_cuda = torch.cuda.is_available()
    facts: dict[str, Any] = {"campaign_gpu": name, "policy": policy, "torch": torch.__version__}
    if want == "interpreter":
        facts["actual_gpu"] = None
        return "cpu", facts, warnings
    if not has_cuda:
        if want == "cuda":
            raise ConfigError(f"{cfg.source_file}: key 'device': 'cuda' but no CUDA device is visible")
        if name.lower() not in ("any", "cpu") and policy != "interpret":
            raise ConfigError(
                f"{cfg.source_file}: key 'gpu.policy': campaign {cfg.name!r} targets {name} but no CUDA device is "
                f"visible. Run it on a GPU machine, or pass gpu.policy=interpret to run under the Triton "
                f"interpreter (slow: pick small workloads with workloads.only=[...])")
        facts["actual_gpu"] = None
        if name.lower() not in ("any", "cpu"):
            warnings.append(f"no CUDA device: running campaign for {name} under the Triton interpreter")
        return "cpu", facts, warnings
    indices = check_gpus(cfg)
    names = {torch.cuda.get_device_name(i) for i in indices}
    if len(names) > 1:
        warnings.append(f"evaluate.gpus {indices} are different GPUs ({', '.join(sorted(names))}): candidates "
                        f"are compared with timings taken on another GPU")
    actual = torch.cuda.get_device_name(indices[0])
    facts["actual_gpu"] = actual
    if name.lower() not in ("any", "cpu") and name.lower() not in actual.lower():
        msg = f"campaign {cfg.name!r} was written for {name} but this GPU is {actual!r}"
        if other_gpu(cfg, policy, msg, warnings, "the real GPU is recorded with every audit"):
            return "cpu", facts, warnings
    return "cuda", facts, warnings


def other_gpu(cfg: DictConfig, policy: str, msg: str, warnings: list[str], recorded: str) -> bool:
    """`gpu.policy` for a GPU other than the campaign's: refuse (raise), interpret (True: run under the Triton
    interpreter) or warn (run anyway; ``recorded`` says what keeps the GPU on record)."""
    if policy == "refuse":
        raise ConfigError(f"{cfg.source_file}: key 'gpu.policy': {msg} (policy refuse)")
    if policy == "interpret":
        warnings.append(f"{msg}: policy 'interpret' runs it under the Triton interpreter")
        return True
    warnings.append(f"{msg}: running anyway (policy warn); {recorded}")
    return False


def _yaml_switch(family: Family, name: str, value: Any) -> Any:
    """YAML and command-line overrides read a bare on / off as a boolean: back to "on" / "off" for a knob whose
    values are those strings and not booleans."""
    try:
        values = family.knob(name).values
    except KeyError:
        return value  # check_knobs names the unknown knob
    if isinstance(value, bool) and value not in values and ("on" if value else "off") in values:
        return "on" if value else "off"
    return value


def knob_changes(family: Family, set_name: str | None, knobs: dict[str, Any], where: str,
                 keys: tuple[str, str] = ("start.set", "start.knobs")) -> dict[str, Any]:
    """A named set's knob changes, then `knobs`, validated against the family's knob space; raises ConfigError
    naming `where`, the key (keys: how the set and the knobs were given) and the value."""
    changes: dict[str, Any] = {}
    parts = [(keys[1], knobs)]
    if set_name:
        sets = family.named_sets()
        if set_name not in sets:
            raise ConfigError(f"{where}: key {keys[0]!r}: {set_name!r} is not a named set of family "
                              f"{family.name!r} (sets: {', '.join(sorted(sets)) or 'none'})")
        parts.insert(0, (keys[0], sets[set_name]))
    for key, part in parts:
        part = {name: _yaml_switch(family, name, v) for name, v in part.items()}
        try:
            family.check_knobs(part, f"{where}: key {key!r}")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        changes.update(part)
    return changes


def start_changes(cfg: DictConfig, family: Family) -> dict[str, Any]:
    """The knob changes of the campaign's `start` (a named set, then `start.knobs`)."""
    return knob_changes(family, cfg.start.set, dict(cfg.start.knobs), cfg.source_file or "campaign")


def source_with(family: Family, changes: dict[str, Any]) -> str:
    """The family's root source with knob changes written into its KNOBS."""
    source = family.root_source()
    return write_knobs(source, {**read_knobs(source), **changes})


def start_source(cfg: DictConfig, family: Family) -> str:
    """The source the search starts from: the family's root, with the campaign's `start` applied."""
    return source_with(family, start_changes(cfg, family))


def initialize(store: Store, cfg: DictConfig, family: Family, workloads: list[dict[str, Any]], device: str,
               device_facts: dict[str, Any], log=print) -> None:
    run_dir = store.run_dir
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    source = start_source(cfg, family)
    h = source_hash(source)
    with store.transaction() as txn:  # first, so a run killed during the root audit can be resumed
        st = txn.state
        st.workloads, st.device, st.device_facts, st.family = workloads, device, device_facts, family.name
        st.weights = {w["name"]: w["weight"] for w in workloads}
        st.started_at, st.start = time.time(), {"set": cfg.start.set, "knobs": dict(cfg.start.knobs)}
    start = start_label(cfg.start)
    log(f"auditing the root of {family.name!r}{' with start ' + start if start else ''} "
        f"({len(workloads)} workloads, device {device})…")
    t0 = time.time()
    out = run_audit(run_dir, AuditJob(family, source, h, "I0", workloads, list(cfg.correctness.seeds),
                                      OmegaConf.to_container(cfg.evaluate), device,
                                      audit_slots(cfg.evaluate, device)[0]))
    with store.transaction() as txn:
        st = txn.state
        iid, uid = txn.new_id("I"), txn.new_id("U")
        txn.put_source(source)
        audit = Audit(uid, iid, out.stages, out.measurements, passed=out.passed, failure_kind=out.failure_kind,
                      failure=out.failure, device=out.device, seconds=out.seconds,
                      timer=timer_of(out.measurements))
        if not out.passed:
            txn.put(Implementation(iid, h, [], "root", FAILED, audit=uid, created=time.time()))
            txn.put(audit)
            st.finished = {"reason": "root failed its audit", "at": time.time()}
            txn.event("init", f"root failed its audit ({out.failure_kind})")
    if not out.passed:
        graph = any(s["name"] == "graph" and not s["passed"] for s in out.stages)
        raise InitError(f"the root of {family.name!r} failed its audit ({out.failure_kind}): {out.failure[:2000]}\n"
                        f"evidence: {run_dir / 'audits' / 'I0'}; `tik-evo show {run_dir} I0`"
                        + ("\nits CUDA-graph replays differ from its eager calls (or cannot be captured), so a rollout "
                           "engine replaying it from graphs would not get its bits; evaluate.graph_replay=off skips "
                           "that stage" if graph else ""))
    with store.transaction() as txn:
        st = txn.state
        st.root_latencies = {n: m["median_s"] for n, m in out.measurements.items()}
        st.limits = {w["name"]: {"limit": w["limit"], "max_s": w["limit"] * st.root_latencies[w["name"]]}
                     for w in workloads}
        t_root = lineage.objective(out.measurements, st, cfg.objective.normalize)
        audit.objective, audit.admissible, audit.limits = t_root, True, {}
        txn.put(audit)
        lineage.set_root(txn, Implementation(iid, h, [], "root", "pending", audit=uid, created=time.time(),
                                             knobs=knobs_or_none(source), objective=t_root))
        specs = seeded_opportunities(family, cfg.search.space)
        for spec in specs:
            oid = txn.new_id("O")
            txn.put(Opportunity(oid, spec.kind, spec.mechanism, list(spec.paths), list(spec.knobs),
                                list(spec.workloads), origin="family", repeatable=bool(spec.knobs),
                                values=dict(spec.values), evidence=[uid], created=time.time()))
            st.pending_opportunities.append(oid)
        seeds = warm_start.points(list(cfg.search.warm_start), family, cfg.source_file or "campaign")
        for f in warm_start.opportunities(seeds, read_knobs(source), specs[0].kind if specs else "knob"):
            oid = txn.new_id("O")
            txn.put(Opportunity(oid, f["kind"], f["mechanism"], ["full", "decode"], f["knobs"], origin=f["origin"],
                                values=f["values"], evidence=[uid], created=time.time()))
            st.pending_opportunities.append(oid)
        st.budgets["wall_s"] += time.time() - t0
        if device == "cuda":
            st.root_latencies_by_gpu = {str(audit_slots(cfg.evaluate, device)[0]): st.root_latencies}
        txn.event("init", f"root {iid} verified; T={t_root:.6g} ({timer_of(out.measurements)})")
    log(f"root verified in {time.time() - t0:.1f} s; T(root) = {t_root:.6g} s")
    if device == "cuda":
        anchor_gpus(store, cfg, family, device, log)


def seeded_opportunities(family: Family, space: str) -> list[OpportunitySpec]:
    """The opportunities a run starts with: the family's own, or (`search.space=flat`) one that names every knob,
    so the sampler draws whole points of the space (the plain-sampling baseline)."""
    if space == "flat":
        return [OpportunitySpec("flat", "Any setting of the family's knobs", knobs=tuple(k.name for k in family.knobs))]
    return family.opportunities()


def anchor_gpus(store: Store, cfg: DictConfig, family: Family, device: str, log=print,
                slots: list[int] | None = None) -> None:
    """Audit the root on every GPU of `evaluate.gpus` that has no root timings yet, all at once: each GPU's
    audits are then judged against the root as that GPU runs it, and a GPU that fails the root's checks stops
    the run before it audits anything. Raises InitError naming the GPU. (`slots`: the GPU indices, for tests
    that run this under the interpreter.)"""
    from concurrent.futures import ThreadPoolExecutor

    st = store.state()
    have = st.root_latencies_by_gpu
    slots = audit_slots(cfg.evaluate, device) if slots is None else slots
    todo: list[tuple[int, int]] = []  # (slot, GPU): each GPU once, however many audits it keeps in flight
    for slot, gpu in enumerate(slots):
        if str(gpu) not in have and gpu not in [g for _, g in todo]:
            todo.append((slot, gpu))
    if not todo:
        return
    root = store.get(st.root)
    source, t0 = store.source(root.source_hash), time.time()
    log(f"auditing the root on GPU {', '.join(str(g) for _, g in todo)} as well…")
    jobs = [AuditJob(family, source, root.source_hash, f"{root.id}-gpu{gpu}", st.workloads,
                     list(cfg.correctness.seeds), OmegaConf.to_container(cfg.evaluate), device, gpu, slot=slot)
            for slot, gpu in todo]
    static = static_scan(jobs[0])  # one source; scanned here, as `ast` must not run in two threads at once
    with ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: run_audit(store.run_dir, job, static), jobs))
    first, passed = st.root_latencies, [(job, out) for job, out in zip(jobs, outs) if out.passed]
    with store.transaction() as txn:  # the GPUs that passed keep their timings, whatever the others did
        by_gpu = txn.state.root_latencies_by_gpu
        for job, out in passed:
            by_gpu[str(job.gpu_index)] = {n: m["median_s"] for n, m in out.measurements.items()}
        spread = max((abs(t / first[n] - 1) for lat in by_gpu.values() for n, t in lat.items()), default=0.0)
        txn.state.budgets["wall_s"] += time.time() - t0
        if passed:
            txn.event("init", f"root timed on GPUs {', '.join(sorted(by_gpu))}: per-workload medians within "
                              f"{spread:.1%} of the first's")
    failed = [(job, out) for job, out in zip(jobs, outs) if not out.passed]
    if failed:
        job, out = failed[0]
        raise InitError(f"the root failed its audit on GPU {job.gpu_index} ({out.failure_kind}): {clip(out.failure)}"
                        f"\nevidence: {store.run_dir / 'audits' / job.impl_id}; leave that GPU out of evaluate.gpus "
                        f"and `tik-evo resume {store.run_dir} evaluate.gpus=[...]`")
    log(f"root timed on {len(by_gpu)} GPUs in {time.time() - t0:.1f} s: medians within {spread:.1%} of the first's")
