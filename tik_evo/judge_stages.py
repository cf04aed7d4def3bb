"""The judge's stages after the family's checks: graph replays, repeated calls, timing of the candidate and best.

Each takes the candidate as a `RemoteModule` (its calls run in the runner) and returns checks; figures go to the
result record. See :mod:`tik_evo.worker` for the order and :mod:`tik_evo.timed` for how a region is timed.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tik_evo.family import Check, Family
from tik_evo.remote import RemoteModule, Runner, bits_equal, connect
from tik_evo.worker_io import WorkerJob


def graph_stage(family: Family, impl: RemoteModule, runner: Runner, small: list[dict], seed: int, device: str,
                cfg: dict[str, Any]) -> list[Check] | None:
    """The small cases with every forward call also captured in a CUDA graph and replayed (rerun on the CPU):
    a replay must write what the eager call wrote. None when the stage is off (auto: GPUs only)."""
    mode = cfg.get("graph_replay", "auto")
    if not (mode == "on" or (mode == "auto" and device == "cuda")):
        return None
    impl.replay_tally = {}
    try:
        out = []
        for case in small:
            out += [Check(f"replayed: {c.name}", c.passed, c.kind, c.details)
                    for c in family.run_checks(impl, case, seed, device)]
        out += impl.take_checks()
        tally = impl.replay_tally
    finally:
        impl.replay_tally = None
    for name, t in sorted(tally.items()):
        kind = "graph" if t["capture_failures"] else "consistency"
        out.append(Check(f"graph replay == eager call: {name} ({t['calls']} calls)",
                         t["differ"] == 0 and not t["capture_failures"], kind, dict(t)))
    if not tally:
        out.append(Check("graph replay: the small cases call an entry point", False, "graph", {}))
    return out


def repeat_stage(family: Family, impl: RemoteModule, runner: Runner, small: list[dict], seed: int, device: str,
                 cfg: dict[str, Any]) -> list[Check]:
    """Each entry point's first call of the small stage (logged there), repeated on the same inputs: every
    repetition must write the same bits (a call that drifts, counts calls or diverges now and then is caught)."""
    n = int(cfg.get("repeat_calls", 100))
    if device == "cpu":
        n = min(n, int(cfg.get("interpreter_repeat_calls", 2)))
    logged = impl.small_log or []
    firsts: dict[str, dict[str, Any]] = {}
    for name, pre in logged:
        firsts.setdefault(name, pre)
    out = []
    for name, pre in firsts.items():
        sig = impl.signature(name)
        written = [p for p in sig.writes if isinstance(pre.get(p), torch.Tensor)]
        first: dict[str, torch.Tensor] = {}
        differ_at = None
        for i in range(n):
            args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in pre.items()}
            getattr(impl, name)(**args)
            got = {p: args[p] for p in written}
            if i == 0:
                first = got
            elif differ_at is None and not all(bits_equal(got[p], first[p]) for p in written):
                differ_at = i
        out.append(Check(f"{name}: {n} repeated calls write the same bits", differ_at is None, "consistency",
                         {"calls": n, "first_differing_call": differ_at}))
    return out + impl.take_checks()


def _root(family: Family):
    from tik_evo.candidate import load_module

    return load_module(family.root_path, f"_judge_root_{family.name}")


def time_candidate(family: Family, impl: RemoteModule, runner: Runner, job: WorkerJob, res,
                   secret: random.Random, device: str) -> list[Check]:
    """Every workload timed on the candidate's runner, its timed calls checked, then its fresh-input verify."""
    from tik_evo import timed

    root = _root(family)
    found: list[Check] = []
    for w in job.workloads:
        m, checks, bench = timed.measure(family, impl, root, runner, w, device, job.evaluate, secret)
        m.update(phase=w["phase"], bytes=bench.bytes_moved, flops=bench.flops)
        res.data["measurements"][w["name"]] = m
        found += checks
        found += [Check(f"{w['name']}: {c.name}", c.passed, "fresh", c.details) for c in bench.verify()]
        found += [Check(f"{w['name']}: {c.name}", c.passed, c.kind, c.details) for c in impl.take_checks()]
        res.flush()
    return found


def time_best(family: Family, runner: Runner, job: WorkerJob, res, secret: random.Random, device: str) -> None:
    """The current best, loaded from the IR's source in its own runner, timed the same way on every workload."""
    from tik_evo import timed

    best = connect(runner, family, job.best_source)
    for w in job.workloads:
        m, _, _ = timed.measure(family, best, None, runner, w, device, job.evaluate, secret, check=False)
        res.data["best_retimed"][w["name"]] = m
        res.flush()
    runner.close()
