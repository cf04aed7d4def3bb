"""Check shards: the audit's full correctness stage split by check case over forked processes on one device.

Compiling the candidate's kernels for every case's shapes is most of that stage (H200, attention root: 54 s
with a cold Triton cache against 3 s warm, `results/engine/audit_profile_*`), and compiling is CPU work, so
processes do it side by side. The worker forks the shards first thing, while CUDA is still uninitialised (a
forked child cannot use its parent's context), so their compiles overlap the small stage. A shard runs whole
cases (a case's seeds share its compiled kernels) and rewrites its result file after each one; the worker
merges them in (case, seed) order, so the stage record is the one the in-process loop would write. Shards stay
in the worker's process group and die with it: an audit timeout or a dead worker takes them down too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tik_evo.executor import die_with_parent, forked_child
from tik_evo.family import Check
from tik_evo.worker_io import WorkerJob, read_json

MAX_AUTO = 8


def count(setting: int, n_cases: int, cpus: int | None = None) -> int:
    """Shards for ``n_cases`` cases: ``setting`` (evaluate.check_procs) if positive, else half the CPUs, at most
    MAX_AUTO; never more than the cases. 1 means the stage runs in the worker itself."""
    if setting > 0:
        return max(1, min(setting, n_cases))
    if not cpus:  # the CPUs this process may run on (a container's share, not the host's count)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(n_cases, cpus // 2, MAX_AUTO))


# A drawn case's kernels are compiled cold (its shapes are new to every audit), a fixed case's mostly found in the
# lineage's cache: on an H100 a shard compiled 3-4 kernels for a fixed attention case and 8-16 with a drawn one
# (`results/engine/h100_audit_times_2026-12-07c.md`), so a drawn case weighs about three fixed ones.
FRESH_WEIGHT = 3


def deal(n_cases: int, shards: int, fresh_from: int | None = None) -> list[list[int]]:
    """Cases per shard, balanced by weight: the cases from ``fresh_from`` on (drawn, compiled cold) weigh
    FRESH_WEIGHT and are dealt first, one per shard while shards last, then the others in turn to the lightest
    shard (the family lists cases roughly by size, so big ones spread out)."""
    fresh_from = n_cases if fresh_from is None else max(0, min(fresh_from, n_cases))
    load, out = [0] * shards, [[] for _ in range(shards)]
    for c in [*range(fresh_from, n_cases), *range(fresh_from)]:
        i = min(range(shards), key=lambda s: (load[s], s))
        out[i].append(c)
        load[i] += FRESH_WEIGHT if c >= fresh_from else 1
    return [sorted(x) for x in out]


@dataclass
class Shard:
    pid: int
    cases: list[int]
    result: Path
    log: Path
    gate: int = -1  # the write end of the shard's gate (`gated` shards wait for `release` before their cases)
    start: int = -1  # the write end of the shard's start gate (every shard waits for `begin` before it loads)


def start(job: WorkerJob, all_cases: list[dict[str, Any]], shards: int, work: Path, note: bool = False,
          fresh_from: int | None = None, gated: bool = False) -> list[Shard]:
    """Fork one process per share of ``all_cases``; each starts a runner of its own for the candidate (its CUDA
    context included) and waits for `begin` before the runner loads the candidate. Call before anything
    initialises CUDA. ``note``: note the calls the checks make (tik_evo.warm); ``fresh_from``: the first drawn
    case (see `deal`); ``gated``: each shard loads the candidate, then waits for `release` before its first case
    (nothing of it runs on the GPU while the judge screens the candidate)."""
    out = []
    for i, cases in enumerate(deal(len(all_cases), shards, fresh_from)):
        result, log = work / f"shard{i}.json", work / f"shard{i}.log"
        result.unlink(missing_ok=True)
        read_end, write_end = os.pipe() if gated else (-1, -1)
        start_read, start_write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # this shard's and the earlier shards' write ends belong to the judge alone
            for fd in (write_end, start_write, *(s.gate for s in out), *(s.start for s in out)):
                if fd >= 0:
                    os.close(fd)
            _child(job, all_cases, cases, result, log, note, read_end, start_read)
        if gated:
            os.close(read_end)
        os.close(start_read)
        out.append(Shard(pid, cases, result, log, write_end, start_write))
    return out


def begin(shards: list[Shard]) -> None:
    """Let the shards load the candidate into their runners."""
    for s in shards:
        _close(s, "start", go=True)


def _close(shard: Shard, which: str, go: bool) -> None:
    """Close one of a shard's gates ("gate" or "start"), letting it go on (go) or, at EOF, stop."""
    fd = getattr(shard, which)
    if fd >= 0:
        if go:
            try:
                os.write(fd, b"1")
            except BrokenPipeError:  # the shard has died; `collect` reports it
                pass
        os.close(fd)
        setattr(shard, which, -1)


def release(shards: list[Shard]) -> None:
    """Let gated shards start their cases."""
    for s in shards:
        _close(s, "gate", go=True)


def stop(shards: list[Shard]) -> None:
    """Kill and reap the shards not yet collected (the small stage failed: the full stage will not run)."""
    for s in shards:
        _close(s, "gate", go=False)
        _close(s, "start", go=False)
    live = [s for s in shards if s.pid]
    for s in live:
        try:
            os.kill(s.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for s in live:
        _reap(s.pid)
        s.pid = 0


# A shard that runs out of GPU memory beside the others is no verdict on the candidate: the worker runs the
# cases from there on itself, once the other shards have exited and freed theirs.
RETRY_IN_WORKER = {"OutOfMemoryError"}


@dataclass
class Collected:
    checks: list[Check]  # in (case, seed) order, up to the first case with an error
    error: str = ""  # that error (traceback or crash report), "" if none
    kind: str = ""  # its failure kind
    case: int = 0  # the case it happened in
    type: str = ""  # the exception's type name, if it raised
    notes: list[dict[str, Any]] = field(default_factory=list)  # calls noted for warm passes (tik_evo.warm)
    profiles: list[dict[str, Any]] = field(default_factory=list)  # each shard's runner (Runner.profile)


def collect(shards: list[Shard], n_cases: int) -> Collected:
    """Wait for every shard and merge their checks. As in the in-process loop, an error in case c keeps the
    checks of the cases before it and drops the rest."""
    by_case: dict[int, list[Check]] = {}
    errors: dict[int, tuple[str, str, str]] = {}
    notes: list[dict[str, Any]] = []
    profiles: list[dict[str, Any]] = []
    for s in shards:
        code = _reap(s.pid)
        s.pid = 0
        data = read_json(s.result)
        notes += [n for n in data.get("notes", []) if isinstance(n, dict)]
        if isinstance(data.get("profile"), dict):
            profiles.append(data["profile"])
        for c, checks in data.get("cases", {}).items():
            by_case[int(c)] = [Check(d["name"], d["passed"], d["kind"], d["details"]) for d in checks]
        if data.get("error"):
            e = data["error"]
            errors[e["case"]] = (e["text"], e["kind"], e.get("type", ""))
        elif not data.get("done"):  # died without a word: a crash, at its first case without results
            first = next((c for c in s.cases if c not in by_case), s.cases[0])
            how = f"died of {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                else f"exited with code {code}"
            errors[first] = (f"check shard of cases {s.cases} {how} in case {first}; log tail:\n{_tail(s.log)}",
                             "crash", "")
    stop_at = min(errors, default=n_cases)
    checks = [c for case in range(min(stop_at, n_cases)) for c in by_case.get(case, [])]
    text, kind, type_ = errors.get(stop_at, ("", "", ""))
    return Collected(checks, text, kind, stop_at, type_, notes, profiles)


def _child(job: WorkerJob, all_cases: list[dict[str, Any]], cases: list[int], result: Path, log: Path,
           note: bool, gate: int = -1, start: int = -1) -> None:
    die_with_parent()  # the worker's death (a crash in its small stage, say) takes the shard down
    forked_child(log, lambda: run(job, all_cases, cases, result, note, gate, start))


def _wait(fd: int) -> bool:
    """Wait on a gate: True once the judge opens it, False at EOF without a byte (the judge stopped the audit)."""
    if fd < 0:
        return True
    go = os.read(fd, 1)
    os.close(fd)
    return bool(go)


def run(job: WorkerJob, all_cases: list[dict[str, Any]], cases: list[int], result: Path, note: bool = False,
        gate: int = -1, start: int = -1) -> None:
    """A shard's work: its cases at the "full" level, every seed, on a runner of its own; the result file
    rewritten after each case. ``start``: a pipe to wait on, the runner started, before the candidate is loaded;
    ``gate``: one to wait on before the first case (either: EOF without a byte, the judge stopped the audit there,
    and the shard exits)."""
    from tik_evo import sandbox
    from tik_evo.families import load_family
    from tik_evo.remote import CandidateError, Runner, connect
    from tik_evo.worker import error_kind, sandbox_options

    sandbox.become_subreaper()
    family = load_family(job.family)
    data: dict[str, Any] = {"cases": {}, "error": None, "done": False}
    opts = sandbox_options(job)
    try:
        runner = Runner.fork(job.device, opts["mode"], opts["hide"], opts["cache_dir"], opts["cache_read"])
        if not _wait(start):
            return
        impl = connect(runner, family, job.source)
    except CandidateError as e:
        data["error"] = {"case": cases[0], "text": str(e), "kind": error_kind(e), "type": e.type_name}
        _write(result, data)
        return
    if not _wait(gate):
        return
    if note:
        from tik_evo.warm import Notes

        impl.notes = Notes()
    for c in cases:
        checks: list[Check] = []
        try:
            for seed in job.seeds:
                checks += family.run_checks(impl, all_cases[c], seed, job.device)
                checks += impl.take_checks(f"[case {c} seed {seed}]")
        except Exception as e:
            text = f"in check case {c}: {e}" if isinstance(e, CandidateError) else traceback.format_exc(limit=6)
            data["error"] = {"case": c, "text": text, "kind": error_kind(e),
                             "type": getattr(e, "type_name", "") or type(e).__name__}
            _write(result, data)
            return
        data["cases"][str(c)] = [ch.to_dict() for ch in checks]
        _write(result, data)
    data["done"] = True
    if impl.notes is not None:
        data["notes"] = list(impl.notes.calls.values())
    data["profile"] = runner.profile()
    _write(result, data)
    runner.close()
    sandbox.kill_descendants()


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _reap(pid: int) -> int:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 0
    return os.waitstatus_to_exitcode(status)


def _tail(log: Path, n: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""
