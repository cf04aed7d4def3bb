"""The audit worker: runs in its own process (and process group) on one device, stage by stage.

It writes its result file after every stage, so a candidate that segfaults or hangs still leaves the
evidence of the stages it passed. The parent (:mod:`tik_evo.audit`) enforces the timeout.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tik_evo import shards
from tik_evo.candidate import load_module

# Triton raises these when a (legal) knob choice cannot be built; OutOfResources when it builds but does not fit
# the GPU (shared memory, registers), which is worth telling apart: a smaller tile or fewer stages may fit.
COMPILE_ERRORS = {"CompilationError", "CompileTimeAssertionFailure"}
RESOURCE_ERRORS = {"OutOfResources"}


def error_kind(e: BaseException) -> str:
    """The failure kind of an exception raised by a candidate, the same in every stage."""
    name = type(e).__name__
    if name in RESOURCE_ERRORS:
        return "resources"
    return "compile" if name in COMPILE_ERRORS or "Compil" in name else "exception"


class Result:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"stages": [], "measurements": {}, "best_retimed": {}, "done": False}

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)

    def stage(self, name: str, passed: bool, t0: float, checks: list | None = None, error: str = "",
              kind: str = "") -> bool:
        self.data["stages"].append({"name": name, "passed": passed, "seconds": time.time() - t0,
                                    "checks": [c.to_dict() for c in (checks or [])], "error": error,
                                    "failure_kind": kind})
        self.flush()
        return passed


def _failed_kind(checks: list) -> str:
    for c in checks:
        if not c.passed:
            return c.kind
    return ""


def _device_info(device: str) -> dict[str, Any]:
    import torch
    import triton

    info = {"device": device, "torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    else:
        info["gpu"] = "none (Triton interpreter on CPU)"
    return info


def run(job: dict[str, Any]) -> None:
    res = Result(Path(job["result_path"]))
    device = job["device"]
    if device == "cpu":
        from tik_evo import interp

        interp.install()
    from tik_evo import timing
    from tik_evo.families import load_family

    family = load_family(job["family"])

    t0 = time.time()
    try:
        impl = load_module(job["source_path"], "tik_candidate")
        best = load_module(job["best_path"], "tik_best") if job.get("best_path") else None
    except Exception:
        res.data["device"] = _device_info(device)
        res.stage("import", False, t0, error=traceback.format_exc(limit=5), kind="import")
        return
    res.stage("import", True, t0)
    # The full stage's shards fork now: before anything here touches CUDA, and so that their compiles overlap
    # the small stage.
    n_full = len(family.check_cases("full"))
    procs = shards.count(int(job["evaluate"].get("check_procs", 0)), n_full)
    import torch

    forked = shards.start(job, impl, n_full, procs, Path(job["result_path"]).parent) \
        if procs > 1 and not torch.cuda.is_initialized() else []
    res.data["device"] = _device_info(device)
    res.data["device"]["check_procs"] = max(len(forked), 1)

    seeds = job["seeds"]
    for level, seed_list in (("small", seeds[:1]), ("full", seeds)):
        t0 = time.time()
        checks: list = []
        todo = family.check_cases(level)
        if level == "full" and forked:
            got = shards.collect(forked, n_full)
            checks, todo = got.checks, todo[got.case:]  # empty unless a shard stopped early
            if got.type in shards.RETRY_IN_WORKER:
                res.data["device"]["checks_rerun_in_worker_from_case"] = got.case
            elif got.error:
                res.stage(level, False, t0, checks, error=got.error, kind=got.kind)
                return
        try:
            for case in todo:
                for seed in seed_list:
                    checks += family.run_checks(impl, case, seed, device)
        except Exception as e:
            shards.stop(forked)
            res.stage(level, False, t0, checks, error=traceback.format_exc(limit=6), kind=error_kind(e))
            return
        if not res.stage(level, all(c.passed for c in checks), t0, checks, kind=_failed_kind(checks)):
            shards.stop(forked)
            return

    mode = job["evaluate"].get("graph_replay", "auto")
    if mode == "on" or (mode == "auto" and device == "cuda"):
        # Rollout engines replay decode from CUDA graphs: a replay must write what an eager call writes.
        from tik_evo import graph_replay

        t0 = time.time()
        try:
            checks = graph_replay.audit_checks(family, impl, seeds[0], device)
        except Exception as e:
            res.stage("graph", False, t0, error=traceback.format_exc(limit=6), kind=error_kind(e))
            return
        if not res.stage("graph", all(c.passed for c in checks), t0, checks, kind=_failed_kind(checks)):
            return

    if not job.get("time", True):
        res.data["done"] = True
        res.flush()
        return
    t0 = time.time()
    fresh: list = []
    try:
        for w in job["workloads"]:
            bench = family.make_bench(impl, w, job["bench_seed"], device)
            m = timing.measure(bench, device, job["evaluate"])
            m.update(phase=w["phase"], bytes=bench.bytes_moved, flops=bench.flops)
            res.data["measurements"][w["name"]] = m
            fresh += [type(c)(f"{w['name']}: {c.name}", c.passed, "fresh", c.details) for c in bench.verify()]
            if best is not None:
                # Re-time the current best in the same process, right after, on the same inputs' seed.
                bb = family.make_bench(best, w, job["bench_seed"], device)
                res.data["best_retimed"][w["name"]] = timing.measure(bb, device, job["evaluate"])
            res.flush()
    except Exception as e:
        res.stage("timing", False, t0, fresh, error=traceback.format_exc(limit=6), kind=error_kind(e))
        return
    if res.stage("timing", all(c.passed for c in fresh), t0, fresh, kind=_failed_kind(fresh)):
        res.data["done"] = True
        res.flush()


def main() -> None:
    from tik_evo.executor import die_with_parent

    die_with_parent()
    job = json.loads(Path(sys.argv[1]).read_text())
    run(job)


if __name__ == "__main__":
    main()
