"""The judge: one audit, stage by stage, in a process that never imports the candidate.

The candidate's source is loaded by a sandboxed runner process (:mod:`tik_evo.runner`) that this process forks;
every call reaches it through shared buffers (:mod:`tik_evo.remote`). References, comparisons, timing and the
verdict are made here. The current best is timed by a second runner, loaded with the best's source as the IR
holds it (sent in the job), after the candidate's runner and everything it started are gone.

The result file is rewritten after every stage, so a judge killed by the audit timeout still leaves the evidence
of the stages passed. The parent (:mod:`tik_evo.audit`) enforces that timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tik_evo import warm
from tik_evo.failure import error_kind  # noqa: F401 - shards and tests import it from here
from tik_evo.worker_io import WorkerJob


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

    info = {"device": device, "torch": torch.__version__, "triton": triton.__version__,
            "python": sys.version.split()[0]}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = list(torch.cuda.get_device_capability(0))
    else:
        info["gpu"] = "none (Triton interpreter on CPU)"
    return info


def _trace(e: BaseException) -> str:
    from tik_evo.remote import CandidateError

    return str(e) if isinstance(e, CandidateError) else traceback.format_exc(limit=6)


def sandbox_options(job: WorkerJob) -> dict[str, Any]:
    """The runner's confinement: the run directory and $HOME hidden, the Triton cache kept per source."""
    run_dir = Path(job.run_dir)
    root = run_dir / "triton"
    return {"mode": job.evaluate.get("sandbox", "auto"), "hide": [str(run_dir), os.path.expanduser("~")],
            "cache_dir": root / job.source_hash, "cache_read": [root / h for h in job.ancestors]}


def run(job: WorkerJob, started: float | None = None) -> None:
    from tik_evo import sandbox

    res = Result(Path(job.result_path))
    res.data["phases"] = {"worker_started_at": started or time.time()}
    device = job.device
    sandbox.become_subreaper()  # whatever a runner leaves behind becomes ours to kill
    try:
        sandbox.prctl(sandbox.PR_SET_DUMPABLE, 0)  # a runner (same uid) cannot read this process's memory
    except OSError:
        pass
    try:
        _stages(job, res, device)
    finally:
        sandbox.kill_descendants()


def _stages(job: WorkerJob, res: Result, device: str) -> None:
    from tik_evo import interp
    from tik_evo.families import load_family

    if device == "cpu":
        interp.install()
    family = load_family(job.family)
    secret = random.Random(int.from_bytes(os.urandom(8), "little"))  # draws the candidate cannot predict
    opts = sandbox_options(job)
    # All the family's drawn cases on a GPU; one under the interpreter, where a case takes seconds.
    drawn = family.drawn_cases(random.Random(secret.getrandbits(64)))[: 1 if device == "cpu" else None]
    cases = family.check_cases("full") + drawn
    res.data["drawn_cases"] = drawn  # drawn for this audit: recorded so a failure can be reproduced
    n_fixed = len(cases) - len(drawn)
    note = _warm_pass(job, opts, res, device)
    in_flight = int(job.evaluate.get("in_flight", 1))
    hold = contextlib.nullcontext if in_flight < 2 else (lambda: _held_gpu(job, res))
    try:
        _judge(job, res, device, family, secret, opts, cases, note, n_fixed, hold)
    finally:
        res.flush()  # the lock's release time


@contextlib.contextmanager
def _held_gpu(job: WorkerJob, res: Result):
    """The GPU alone among the run's audits in flight, the candidate given `evaluate.timeout_s` from taking it;
    nothing the candidate started outlives the hold (another audit's timing may come next)."""
    from tik_evo import sandbox

    with warm.gpu_lock(Path(job.run_dir), res.data.setdefault("gpu_lock", {})), \
            _deadline(res, float(job.evaluate.get("timeout_s", 300))):
        try:
            yield
        finally:
            sandbox.kill_descendants()


@contextlib.contextmanager
def _deadline(res: Result, timeout: float):
    """With audits in flight the engine lets a worker live long enough to wait for the GPU; the judge itself
    gives the candidate `timeout` seconds from taking it, as the engine does when audits run one at a time: then
    it ends everything the candidate started, records the timeout and exits (releasing the GPU)."""
    import math
    import signal

    def expire(signum, frame) -> None:
        from tik_evo import sandbox

        sandbox.kill_descendants()
        res.data.setdefault("gpu_lock", {})["released_at"] = time.time()  # on exit, as the kernel releases it
        res.stage("timeout", False, time.time() - timeout, error=f"the audit held the GPU for {timeout:g} s "
                  "(evaluate.timeout_s)", kind="timeout")
        os._exit(3)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(max(1, math.ceil(timeout)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _warm_pass(job: WorkerJob, opts: dict[str, Any], res: Result, device: str) -> bool:
    """Compile ahead (tik_evo.warm) when the run has calls to replay; whether this audit notes its own calls
    for the manifest (merged once its verdict is written)."""
    mode = job.evaluate.get("warm", "auto")
    # auto: where it can pay, on a GPU with other audits in flight to overlap
    if mode == "off" or (mode == "auto" and (device != "cuda" or int(job.evaluate.get("in_flight", 1)) < 2)):
        return False
    manifest = warm.read_manifest(Path(job.run_dir))
    if manifest is None:
        return True
    capability = job.evaluate.get("warm_capability") or manifest.get("capability")
    if not capability:
        res.data["warm"] = {"error": "no compute capability to compile for (evaluate.warm_capability)"}
    else:
        threads = min(8, max(1, (os.cpu_count() or 2) // max(1, int(job.evaluate.get("in_flight", 1)))))
        res.data["warm"] = warm.warm(job.source, manifest["calls"], capability, opts,
                                     float(job.evaluate.get("warm_timeout_s", 120)), threads)
    res.flush()
    return warm.wants_notes(manifest)


def _judge(job: WorkerJob, res: Result, device: str, family, secret: random.Random, opts: dict[str, Any],
           cases: list[dict[str, Any]], note: bool, n_fixed: int, hold) -> None:
    """Fork every process that will run candidate code, before this process touches CUDA and before the GPU is
    held (their CUDA contexts start meanwhile, with no candidate code in them); then, within ``hold()``, load the
    candidate into them and judge it."""
    from tik_evo import shards
    from tik_evo.remote import CandidateError, Runner

    t0 = time.time()
    phases = res.data.setdefault("phases", {})  # where an audit's time goes besides its stages
    phases["judge_started_at"] = t0
    procs = shards.count(int(job.evaluate.get("check_procs", 0)), len(cases))
    screening = bool(job.screen) and job.time
    forked = shards.start(job, cases, procs, Path(job.result_path).parent, note,
                          fresh_from=n_fixed, gated=screening) if procs > 1 else []
    best = None
    try:
        runner = Runner.fork(device, opts["mode"], opts["hide"], opts["cache_dir"], opts["cache_read"])
        if job.best_source and job.time:
            best = Runner.fork(device, opts["mode"], opts["hide"], opts["cache_dir"].parent / job.best_hash)
    except CandidateError as e:
        shards.stop(forked)
        _import_failed(res, device, t0, e)
        return
    phases["runners_forked_at"] = time.time()
    with hold():
        shards.begin(forked)  # the shards load the candidate: its code runs from here on, the GPU held
        _judge_held(job, res, device, family, secret, cases, note, forked, runner, best, screening)


def _import_failed(res: Result, device: str, t0: float, e) -> None:
    res.data["device"] = _device_info(device)
    res.stage("import", False, t0, error=str(e), kind=e.kind if e.kind in ("sandbox", "crash", "timeout", "tamper")
              else "import")


def _judge_held(job: WorkerJob, res: Result, device: str, family, secret: random.Random,
                cases: list[dict[str, Any]], note: bool, forked: list, runner, best, screening: bool) -> None:
    """The stages, the candidate loaded into the runners forked for it (see `_judge`)."""
    from tik_evo import shards
    from tik_evo.remote import CandidateError, connect

    t0 = time.time()
    phases = res.data["phases"]
    try:
        res.data["sandbox"] = runner.sandbox
        impl = connect(runner, family, job.source)
    except CandidateError as e:
        shards.stop(forked)
        _import_failed(res, device, t0, e)
        return
    res.stage("import", True, t0)
    phases["candidate_loaded_at"] = time.time()
    if note:
        impl.notes = warm.Notes()
    res.data["device"] = _device_info(device)
    res.data["device"]["check_procs"] = max(len(forked), 1)
    res.data["secret_seed_draws"] = "os.urandom"

    seeds = job.seeds
    small = family.check_cases("small")
    for level, todo, seed_list in (("small", small, seeds[:1]), ("full", cases, seeds)):
        t0 = time.time()
        checks: list = []
        first = 0
        if level == "full" and screening:
            if not _screen(job, family, impl, runner, res, secret, device):
                shards.stop(forked)
                return
            shards.release(forked)
            t0 = time.time()
        if level == "full" and forked:
            got = shards.collect(forked, len(cases))
            phases["shard_runners"] = got.profiles
            checks, todo, first = got.checks, todo[got.case:], got.case  # empty unless a shard stopped early
            if impl.notes is not None:
                for n in got.notes:
                    impl.notes.calls.setdefault(json.dumps(n, sort_keys=True), n)
            if got.type in shards.RETRY_IN_WORKER:
                res.data["device"]["checks_rerun_in_worker_from_case"] = got.case
            elif got.error:
                res.stage(level, False, t0, checks, error=got.error, kind=got.kind)
                return
        impl.log = [] if level == "small" else None  # the repeat stage repeats the small stage's first calls
        try:
            for i, case in enumerate(todo, first):
                for seed in seed_list:
                    checks += family.run_checks(impl, case, seed, device) + impl.take_checks(f"[case {i} seed {seed}]")
        except Exception as e:
            shards.stop(forked)
            res.stage(level, False, t0, checks + impl.take_checks(summary=False), error=_trace(e), kind=error_kind(e))
            return
        if level == "small":
            impl.small_log, impl.log = impl.log, None
        if not res.stage(level, all(c.passed for c in checks), t0, checks, kind=_failed_kind(checks)):
            shards.stop(forked)
            return

    from tik_evo import judge_stages as judged

    for name, stage in (("graph", judged.graph_stage), ("repeat", judged.repeat_stage)):
        t0 = time.time()
        try:
            checks = stage(family, impl, runner, small, seeds[0], device, job.evaluate)
        except Exception as e:
            res.stage(name, False, t0, impl.take_checks(summary=False), error=_trace(e), kind=error_kind(e))
            return
        if checks is not None and not res.stage(name, all(c.passed for c in checks), t0, checks,
                                                kind=_failed_kind(checks)):
            return

    if not job.time:
        phases["runner"] = runner.profile()
        _done(res)
        return
    t0 = time.time()
    found: list = []
    try:
        found = judged.time_candidate(family, impl, runner, job, res, secret, device)
    except Exception as e:
        res.stage("timing", False, t0, found + impl.take_checks(summary=False), error=_trace(e), kind=error_kind(e))
        return
    if not res.stage("timing", all(c.passed for c in found), t0, found, kind=_failed_kind(found)):
        return
    phases["runner"] = runner.profile()
    if best is not None:
        t0 = time.time()
        runner.close()
        from tik_evo import sandbox

        sandbox.kill_descendants(keep=frozenset({best.pid}))  # nothing of the candidate's runs beside the best
        phases["close_candidate_s"] = time.time() - t0
        try:
            judged.time_best(family, best, job, res, secret, device)
            phases["best_retimed_s"] = time.time() - t0 - phases["close_candidate_s"]
            phases["best_runner"] = best.profile()
        except Exception as e:
            res.stage("best", False, time.time(), error="re-timing the current best failed (not the candidate's "
                      f"doing unless it left something behind):\n{_trace(e)}", kind="infrastructure")
            return
    _done(res)
    if impl.notes is not None:  # after the verdict: this audit's draws are no longer secret to anyone
        impl.notes.merge(Path(job.run_dir), res.data["device"].get("capability"))


def _screen(job: WorkerJob, family, impl, runner, res: Result, secret: random.Random, device: str) -> bool:
    """The screen (tik_evo.screen): the candidate timed as the timing stage times it, its timed outputs checked,
    then compared with the job's reference. False: the audit stops here (the stage records why)."""
    from tik_evo import judge_stages as judged
    from tik_evo import screen

    t0 = time.time()
    try:
        found = judged.time_candidate(family, impl, runner, job, res, secret, device)
    except Exception as e:
        res.stage("screen", False, t0, impl.take_checks(summary=False), error=_trace(e), kind=error_kind(e))
        return False
    if not all(c.passed for c in found):
        return res.stage("screen", False, t0, found, kind=_failed_kind(found))
    ok, why = screen.decide(res.data["measurements"], job.screen)
    res.data["screen"] = {"passed": ok, "why": why}
    return res.stage("screen", ok, t0, found, error="" if ok else why, kind="" if ok else screen.SCREENED)


def _done(res: Result) -> None:
    res.data["done"] = True
    res.data["phases"]["done_at"] = time.time()  # the parent counts the worker's exit from here
    res.flush()


def main() -> None:
    started = time.time()
    from tik_evo.executor import die_with_parent

    die_with_parent()
    job = WorkerJob.from_json(Path(sys.argv[1]).read_text())
    run(job, started)


if __name__ == "__main__":
    main()
