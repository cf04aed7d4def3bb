"""Timing a runner from the judge: the judge's own clock around synchronised regions, every region checked.

Why the judge's clock: whatever runs in the candidate's process can be patched by it (timers, events, graph
replays), so no figure is read from there. The runner is told "run this region" (R replays of a CUDA graph of
the bench's calls, or R eager rounds of them), synchronises the device and answers; the judge times request to
answer with `perf_counter` and subtracts the round trip of an empty request. Regions are sized to tens of
milliseconds, so the round trip's jitter (tens of microseconds) stays a fraction of a percent.

Why the regions cannot be gamed: each round gets fresh inputs drawn by the family from a seed the judge draws
from os.urandom (nothing computed at import or memoised matches them), the number of replays varies per round,
and after each round the outputs of the region's last call are checked against the root, run by the judge on
the same inputs, and bit for bit against the candidate's own checked call on those inputs. Inputs must come
back unchanged.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks as C
from tik_evo.family import Bench, Check, Family
from tik_evo.remote import RemoteModule, Runner, bits_equal

MAX_RUNS = 32  # bench.run() calls recorded while looking for its input rotation to come round
GRAPH_RUNS = 20  # runs captured in one graph replay (decode-sized work)


@dataclass
class Plan:
    """A bench's calls over one turn of its input rotation, with the arena slot of every distinct tensor."""

    runs: list[list[tuple[str, dict[str, Any]]]]  # per bench.run(): its calls (name, bound arguments)
    tensors: list[torch.Tensor] = field(default_factory=list)  # judge-side, in slot order
    descs: list[dict] = field(default_factory=list)

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        return [c for run in self.runs for c in run]


def record(family: Family, impl: RemoteModule, workload: dict[str, Any], seed: int, device: str
           ) -> tuple[Bench, Plan]:
    """make_bench on ``impl`` and its run() recorded (not executed) until its input rotation repeats."""
    bench = family.make_bench(impl, workload, seed, device)  # may call the candidate (setup): not recorded
    try:
        runs: list[list[tuple[str, dict[str, Any]]]] = []
        keys: list[tuple] = []
        for _ in range(MAX_RUNS):
            impl.recording = []
            bench.run()
            calls = [(n, impl.bind(n, a, k)) for n, a, k in impl.recording]
            key = tuple((n, tuple(id(v) for v in b.values())) for n, b in calls)
            if keys and key == keys[0]:
                break
            runs.append(calls)
            keys.append(key)
    finally:
        impl.recording = None
    if not runs or not runs[0]:
        raise RuntimeError(f"workload {workload.get('name')}: the bench's run() calls no entry point")
    return bench, Plan(runs)


def _tensors(plan: Plan) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for _, bound in plan.calls():
        for v in bound.values():
            for t in v if isinstance(v, (list, tuple)) else [v]:
                if isinstance(t, torch.Tensor):
                    seen.setdefault(id(t), t)
    return list(seen.values())


def place(runner: Runner, plan: Plan) -> None:
    plan.tensors = _tensors(plan)
    plan.descs = [runner.arena.place(t.detach()) for t in plan.tensors]


def refill(runner: Runner, plan: Plan, fresh: Plan) -> None:
    """Copy a new round's inputs into the plan's slots (the same structure, new values)."""
    new = _tensors(fresh)
    if [(t.shape, t.dtype) for t in new] != [(t.shape, t.dtype) for t in plan.tensors]:
        raise RuntimeError("the bench's tensors changed shape between seeds")
    for t, d in zip(new, plan.descs):
        runner.arena.view(d).copy_(t)
    plan.tensors, plan.runs = new, fresh.runs


def _roles(impl: RemoteModule, plan: Plan) -> tuple[set[int], set[int]]:
    """Slots (by index) the plan's calls write, and of those the ones they only write (poisoned before a region)."""
    index = {id(t): i for i, t in enumerate(plan.tensors)}
    written, updated = set(), set()
    for name, bound in plan.calls():
        sig = impl.signature(name)
        for p in sig.writes:
            if isinstance(bound.get(p), torch.Tensor):
                (updated if p in sig.updates else written).add(index[id(bound[p])])
    return written | updated, written - updated


def poison(runner: Runner, plan: Plan, slots: set[int]) -> None:
    """Outputs filled with NaN (integers: -1) before a region, so a region that skips its work leaves them so."""
    for i in slots:
        v = runner.arena.view(plan.descs[i])
        v.fill_(float("nan") if v.dtype.is_floating_point else (True if v.dtype == torch.bool else -1))


def inputs_unchanged(runner: Runner, plan: Plan, written: set[int], tag: str) -> Check:
    """Every slot the plan's calls only read, bit-equal after the region to the judge's copy."""
    bad = [i for i, (t, d) in enumerate(zip(plan.tensors, plan.descs))
           if i not in written and not bits_equal(runner.arena.view(d), t.detach().contiguous())]
    return Check(f"{tag}: inputs unchanged by the timed calls", not bad, "inputs", {"changed_slots": bad[:10]})


def message(impl: RemoteModule, plan: Plan, pid: str, graph: bool, cycles: int) -> dict[str, Any]:
    index = {id(t): d for t, d in zip(plan.tensors, plan.descs)}

    def enc(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return index[id(v)]
        if isinstance(v, (list, tuple)):
            return {"t": "tuple" if isinstance(v, tuple) else "list", "items": [enc(x) for x in v]}
        return v

    calls = [{"fn": n, "kwargs": {k: enc(v) for k, v in b.items()}} for n, b in plan.calls()]
    return {"op": "plan", "id": pid, "calls": calls, "graph": graph, "cycles": cycles}


def _wall(runner: Runner, msg: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    runner.request(msg)
    return time.perf_counter() - t0


def check_last_call(impl: RemoteModule, root: ModuleType, plan: Plan, runner: Runner, tag: str) -> list[Check]:
    """The region's last call: its outputs against the root's on the same inputs (tolerance) and against the
    candidate's own checked call on them (bits)."""
    name, bound = plan.calls()[-1]
    sig = impl.signature(name)
    index = {id(t): d for t, d in zip(plan.tensors, plan.descs)}
    timed = {p: runner.arena.view(index[id(bound[p])]).clone() for p in sig.writes
             if isinstance(bound.get(p), torch.Tensor)}
    out = []
    for who, fn in (("root", getattr(root, name, None)), ("checked call", getattr(impl, name))):
        if fn is None:
            continue
        fresh = {k: (v.detach().clone() if k in timed else v) for k, v in bound.items()}
        fn(**fresh)
        for p, got in timed.items():
            want = fresh[p]
            if who == "root":
                out.append(_close(f"{tag}: timed {name} {p} vs root", got, want))
            else:
                out.append(Check(f"{tag}: timed {name} {p} == checked call (bits)", bits_equal(got, want),
                                 "timed", {"param": p}))
    return out


def _close(name: str, got: torch.Tensor, want: torch.Tensor) -> Check:
    if got.dtype.is_floating_point:
        c = C.reference(name, got, want)
        return Check(c.name, c.passed, "timed", c.details)
    bad = int((got != want).sum())
    return Check(name, bad <= max(0, got.numel() // 1000), "timed", {"mismatches": bad, "elements": got.numel()})


def measure(family: Family, impl: RemoteModule, root: ModuleType, runner: Runner, workload: dict[str, Any],
            device: str, cfg: dict[str, Any], rng: random.Random, check: bool = True
            ) -> tuple[dict[str, Any], list[Check], Bench]:
    """Time one workload on ``runner``: (measurement, checks of the timed calls, the last round's bench)."""
    mark = runner.arena.mark()
    try:
        bench, plan = record(family, impl, workload, rng.getrandbits(48), device)
        place(runner, plan)
        graph = bench.graph_friendly and device != "cpu"
        cycles = math.ceil(GRAPH_RUNS / len(plan.runs)) if graph else 1
        runner.request(message(impl, plan, workload["name"], graph, cycles))
        timed_msg = {"op": "time", "id": workload["name"], "reps": 1}
        if device == "cpu":
            rounds, reps, t0 = max(1, int(cfg.get("interpreter_reps", 3))), 1, 0.0
        else:
            rounds = max(3, int(cfg.get("rounds", 5)))
            t0 = statistics.median(_wall(runner, {"op": "empty"}) for _ in range(7))
            probe = max(_wall(runner, timed_msg) - t0, 1e-7)
            target = float(cfg.get("rep_ms", 100)) / 1e3 / rounds
            reps = max(1, min(100_000, round(target / probe)))
        samples, found = [], []
        written, outputs = _roles(impl, plan)
        for r in range(rounds):
            if r:
                bench, fresh = record(family, impl, workload, rng.getrandbits(48), device)
                refill(runner, plan, fresh)
            poison(runner, plan, outputs)
            n = reps if device == "cpu" else max(1, round(reps * rng.uniform(0.8, 1.25)))
            wall = _wall(runner, {**timed_msg, "reps": n})
            samples.append(max(wall - t0, 0.0) / (n * cycles * len(plan.runs)))
            # Every round on a GPU; under the interpreter (seconds a call) the last, the first on refilled inputs.
            if check and (device != "cpu" or r == rounds - 1):
                found += check_last_call(impl, root, plan, runner, f"{workload['name']} round {r}")
                found.append(inputs_unchanged(runner, plan, written, f"{workload['name']} round {r}"))
        timer = "wall-interpreter" if device == "cpu" else ("judge-graph" if graph else "judge-eager")
        from tik_evo.timing import _summary

        return _summary(samples, timer), found, bench
    finally:
        runner.arena.release(mark)
