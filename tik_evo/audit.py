"""Audit: static scan in-process, then every other stage in a worker subprocess pinned to one device.

Stages, cheapest first: static → import → small correctness → full correctness and consistency → timing
(then fresh-input verification). The worker runs in its own process group, killed as a group on timeout,
so a candidate that hangs, aborts or segfaults becomes a failed audit with its evidence, never a dead run.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tik_evo import staticscan
from tik_evo.executor import EXECUTORS, InfrastructureError
from tik_evo.family import Family
from tik_evo.worker_io import StageResult, WorkerJob, WorkerResult

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class AuditOutcome:
    stages: list[dict[str, Any]] = field(default_factory=list)
    measurements: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_retimed: dict[str, dict[str, Any]] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    passed: bool = False
    failure_kind: str | None = None
    failure: str = ""
    seconds: float = 0.0


@dataclass
class AuditJob:
    """One audit as the engine asks for it; the judge gets it as a `WorkerJob`."""
    family: Family
    source: str
    source_hash: str
    impl_id: str
    workloads: list[dict[str, Any]]
    seeds: list[int]
    evaluate: dict[str, Any]
    device: str  # "cuda" | "cpu"
    gpu_index: int | str = 0  # a device index; with evaluate.executor=ray the slot's GPU model ("ray:H100")
    best_source_hash: str | None = None
    best_source: str | None = None  # its text, read from the IR by the caller
    ancestors: list[str] = field(default_factory=list)  # source hashes whose compiled kernels it may reuse
    time: bool = True
    slot: int = 0  # which of the concurrent audits this is: each slot has its own executor (fork server)
    screen: dict[str, Any] | None = None  # the screen's reference (tik_evo.screen.spec), for a timed audit

    def worker_job(self, run_dir: Path, result_path: Path) -> WorkerJob:
        # The best goes only where it is timed, as the IR holds it (never a file a candidate could have rewritten).
        best = bool(self.best_source_hash) and self.time
        return WorkerJob(self.family.name, str(Path(run_dir).resolve()), self.source, self.source_hash,
                         self.workloads, self.seeds, self.evaluate, self.device, str(result_path),
                         best_source=self.best_source if best else None,
                         best_hash=self.best_source_hash if best else None,
                         ancestors=[h for h in self.ancestors if h != self.source_hash],
                         bench_seed=1000 + self.seeds[0], time=self.time,
                         screen=self.screen if self.time else None)


def source_file(run_dir: Path, source_hash: str, text: str) -> Path:
    """Triton needs real source files: candidates are written once, named by their content hash."""
    path = run_dir / "sources" / f"cand_{source_hash}.py"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


_executors: dict[tuple, object] = {}
_executors_lock = threading.Lock()


def executor_for(job: AuditJob, env: dict[str, str]):
    """One executor per (kind, device) for the life of the process: the fork server is reused across audits."""
    kind = job.evaluate.get("executor", "auto")
    if kind == "auto":
        # Forking a process that imported torch is safe while CUDA is uninitialised (the server never touches
        # the GPU; each forked job initialises its own context). Measured on an H200: 42 audits, mean 17-21 s
        # against 30 s with a fresh interpreter per audit.
        kind = "forkserver"
    key = (kind, job.device, env.get("CUDA_VISIBLE_DEVICES"), job.slot)
    make = lambda: EXECUTORS[kind](env)  # noqa: E731
    if kind == "ray":  # one per GPU model: its tasks ask the cluster for that model (tik_evo.ray_executor)
        from tik_evo.ray_executor import RayExecutor

        key, make = (kind, job.device, job.gpu_index), lambda: RayExecutor(job.evaluate, job.device, job.gpu_index)
    with _executors_lock:  # concurrent audits ask from their threads; a fork server serves one at a time
        if key not in _executors:
            _executors[key] = make()
        return _executors[key]


@atexit.register
def close_executors() -> None:
    """Stop every executor and the audits running in them (an interrupted run with audits in flight)."""
    with _executors_lock:
        for ex in _executors.values():
            ex.close()
        _executors.clear()


def audit_slots(evaluate: Any, device: str) -> list[int]:
    """The GPU index of each audit that may run at once: every GPU of `evaluate.gpus` (the first audits the
    root), else `gpu_index` alone; under the interpreter `evaluate.parallel` slots (the index is then unused)."""
    if getattr(evaluate, "executor", None) == "ray":  # the cluster's GPUs (or CPUs), labelled by GPU model
        from tik_evo.ray_executor import slots

        return slots(evaluate, device)
    n = max(1, int(getattr(evaluate, "in_flight", 1)))
    if device == "cuda":
        return [g for g in (list(evaluate.gpus) or [evaluate.gpu_index]) for _ in range(n)]
    return [evaluate.gpu_index] * max(n, evaluate.parallel)


def worker_devices(env: dict[str, str], gpu_index: int) -> str:
    """CUDA_VISIBLE_DEVICES pinning a worker to this process's device `gpu_index`. Indices are logical: under
    CUDA_VISIBLE_DEVICES=4,5 index 1 is physical GPU 5 (entries may also be UUIDs or MIG names)."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(gpu_index)
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if not 0 <= gpu_index < len(entries):
        raise ValueError(f"evaluate.gpu_index={gpu_index} but CUDA_VISIBLE_DEVICES={visible!r} makes "
                         f"{len(entries)} device(s) visible")
    return entries[gpu_index]


def static_scan(job: AuditJob) -> list:
    return staticscan.scan(job.source, job.family.entry_points, tuple(k.name for k in job.family.knobs))


def run_audit(run_dir: Path, job: AuditJob, static: list | None = None) -> AuditOutcome:
    """``static``: the job's static scan, done already. Audits run from threads pass it: CPython 3.11's `ast`
    is not thread-safe ("AST constructor recursion depth mismatch" when two threads parse at once)."""
    t_start = time.time()
    out = AuditOutcome()
    static = static_scan(job) if static is None else static
    static_ok = all(c.passed for c in static)
    out.stages.append(StageResult("static", static_ok, time.time() - t_start, [c.to_dict() for c in static],
                                  failure_kind="static").to_dict())
    if not static_ok:
        out.failure_kind, out.failure = "static", _first_failure(static)
        out.seconds = time.time() - t_start
        return out

    work = run_dir / "audits" / job.impl_id
    work.mkdir(parents=True, exist_ok=True)
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    source_file(run_dir, job.source_hash, job.source)  # a copy for people and tools; the judge uses the text
    (work / "job.json").write_text(job.worker_job(run_dir, result_path).to_json())

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if job.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
        if job.evaluate.get("executor") != "ray":  # a Ray task is given its GPU by Ray
            env["CUDA_VISIBLE_DEVICES"] = worker_devices(env, job.gpu_index)
    timeout = float(job.evaluate.get("timeout_s", 300))
    # In flight with others on one GPU, an audit may wait for each of them and compile ahead first: the worker
    # lives long enough for that, and only its own time on the GPU counts against timeout_s (below).
    in_flight = int(job.evaluate.get("in_flight", 1))
    limit = timeout * in_flight + (float(job.evaluate.get("warm_timeout_s", 120)) if in_flight > 1 else 0.0)
    t_worker = time.time()
    lost = ""
    try:
        rc, timed_out = executor_for(job, env).run(work / "job.json", work / "worker.log", limit)
    except InfrastructureError as e:
        rc, timed_out, lost = -signal.SIGKILL, False, str(e)
    t_returned = time.time()

    result = WorkerResult.read(result_path)
    out.stages += [s.to_dict() for s in result.stages]
    out.measurements, out.best_retimed, out.device = result.measurements, result.best_retimed, result.device
    if job.device == "cuda":  # which of the run's GPUs: concurrent audits spread over several
        out.device["gpu_index"] = job.gpu_index
    for key in ("warm", "gpu_lock", "phases", "ray"):  # compile ahead, the GPU's wait, time outside stages, node
        if result.other.get(key):
            out.device[key] = result.other[key]
    _outside_stages(out.device.get("phases"), t_worker, t_returned)
    out.seconds = time.time() - t_start
    held = result.other.get("gpu_lock", {}).get("acquired_at")
    if lost:
        out.failure_kind, out.failure = "infrastructure", lost
    elif timed_out and in_flight > 1 and (held is None or time.time() - held < timeout):
        out.failure_kind = "infrastructure"  # queued or compiling ahead too long: never the candidate's verdict
        out.failure = (f"worker killed after {limit:g} s, {'before it held' if held is None else 'soon after'} "
                       f"the GPU (evaluate.in_flight={in_flight}); last stage: {_last(out)}")
    elif timed_out:
        out.failure_kind = "timeout"
        out.failure = f"worker killed after {limit:g} s (evaluate.timeout_s); last stage: {_last(out)}"
    elif result.done and rc == 0:
        out.passed = True
    elif rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        out.failure_kind = "crash"
        out.failure = f"worker died of {name} during stage after {_last(out)}; log tail:\n{_tail(work)}"
    else:
        failed = next((s for s in result.stages if not s.passed), None)
        if failed:
            out.failure_kind = failed.failure_kind or "check"
            out.failure = failed.error or _first_failure_dicts(failed.checks)
        else:
            out.failure_kind = "crash"
            out.failure = f"worker exited with code {rc} after {_last(out)}; log tail:\n{_tail(work)}"
    if out.failure_kind:
        out.stages.append(StageResult("outcome", False, error=out.failure, failure_kind=out.failure_kind).to_dict())
    return out


def _outside_stages(phases: dict[str, Any] | None, t_worker: float, t_returned: float) -> None:
    """The worker's start (executor to its first line) and exit (its verdict written to the executor seeing
    it gone: runners, shards and CUDA contexts torn down), from the worker's own timestamps."""
    if not isinstance(phases, dict):
        return
    started, judge, done = (phases.get(k) for k in ("worker_started_at", "judge_started_at", "done_at"))
    if isinstance(started, (int, float)):
        phases["worker_start_s"] = round(started - t_worker, 3)
        if isinstance(judge, (int, float)):
            phases["before_judge_s"] = round(judge - started, 3)  # the family, drawn cases, a warm pass
    if isinstance(done, (int, float)):
        phases["worker_exit_s"] = round(t_returned - done, 3)


def _last(out: AuditOutcome) -> str:
    return out.stages[-1]["name"] if out.stages else "start"


def _tail(work: Path, n: int = 1500) -> str:
    try:
        return (work / "worker.log").read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _first_failure(checks: list) -> str:
    for c in checks:
        if not c.passed:
            return f"{c.name}: {c.details}"
    return ""


def _first_failure_dicts(checks: list[dict[str, Any]]) -> str:
    for c in checks:
        if not c["passed"]:
            return f"{c['name']}: {c['details']}"
    return ""
