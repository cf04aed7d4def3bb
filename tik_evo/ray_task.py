"""The node side of `evaluate.executor=ray`: what one Ray task does on the node it lands on.

Only the job travels (its JSON: the candidate's and the best's source text, the workloads, the `evaluate`
section) and, once the run has one, the warm pass's manifest. The code does not: each node imports tik-evo from
its own install, so a task first checks that install against the engine's (version and a digest of the engine's
and the families' sources) and refuses to audit on a mismatch.

A task runs the audit exactly as a local executor does (`tik_evo.executor`: the worker in its own process group,
killed as a group at the limit) in a scratch copy of the run directory on its node, then returns the evidence
files for the engine to write: the engine stays the one writer of the run. This module imports nothing heavy and
nothing of Ray: the engine wraps its functions as Ray tasks (`tik_evo.ray_executor`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MAX_FILE_BYTES = 8 << 20  # per evidence file sent back (its tail): a runaway log must not flood the engine
_DIGESTED = ("tik_evo", "kernels")  # the engine and the families: what a worker and its judge import


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


_digest: str | None = None


def source_digest() -> str:
    """sha256 over the engine's and the families' Python sources as installed here (paths and contents)."""
    global _digest
    if _digest is None:
        h = hashlib.sha256()
        for top in _DIGESTED:
            for path in sorted((PROJECT_ROOT / top).rglob("*.py")):
                h.update(str(path.relative_to(PROJECT_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
        _digest = h.hexdigest()
    return _digest


def identity() -> dict[str, Any]:
    """What this install is: compared with the engine's before anything is audited here."""
    from tik_evo import __version__

    return {"tik_evo": __version__, "digest": source_digest(), "python": platform.python_version(),
            "torch": _version("torch"), "triton": _version("triton"), "ray": _version("ray"),
            "host": socket.gethostname(), "root": str(PROJECT_ROOT)}


def mismatch(mine: dict[str, Any], engine: dict[str, Any]) -> str:
    """Why this install may not audit for that engine ("" when it may): tik-evo and its sources must be equal."""
    diff = [k for k in ("tik_evo", "digest", "python") if mine.get(k) != engine.get(k)]
    if not diff:
        return ""
    return (f"node {mine['host']} ({mine['root']}) has another tik-evo install than the engine's "
            f"({engine['host']}: {engine['root']}): " + ", ".join(
                f"{k} {str(mine.get(k))[:16]} != {str(engine.get(k))[:16]}" for k in diff)
            + "; install the same tik-evo checkout (pip install -e '.[ray]') on every node")


def scratch_root(scratch: str, run_key: str) -> Path:
    """This node's working copy of the run: the audits' directories, Triton caches, the warm manifest, GPU locks."""
    return Path(scratch or tempfile.gettempdir()) / "tik-evo-ray" / run_key


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks (/proc/PID/stat field 22): tells a pid from a reused one."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


_inner: dict[tuple, Any] = {}
_inner_lock = threading.Lock()


def _executor(kind: str, env: dict[str, str]):
    """The local executor the audits of this Ray worker process use (a fork server outlives one task)."""
    from tik_evo.executor import EXECUTORS

    kind = "forkserver" if kind == "auto" else kind
    key = (kind, env.get("CUDA_VISIBLE_DEVICES"), env.get("TRITON_INTERPRET"))
    with _inner_lock:
        if key not in _inner:
            _inner[key] = EXECUTORS[kind](env)
        return _inner[key]


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - MAX_FILE_BYTES))
        return fh.read().decode(errors="replace")


def audit(payload: dict[str, Any]) -> dict[str, Any]:
    """One audit on this node. ``payload``: job (the engine's job.json text), impl, timeout, device, executor,
    run_key, engine (the engine process's id), scratch, manifest (the warm manifest's text or None), identity
    (the engine's). Returns {rc, timed_out, files: {name: text}, manifest, node} or {refused: why}."""
    t0 = time.time()
    mine = identity()
    refused = mismatch(mine, payload["identity"])
    if refused:
        return {"refused": refused}
    root = scratch_root(payload["scratch"], payload["run_key"])
    work = root / "audits" / f"{payload['impl']}-{uuid.uuid4().hex[:8]}"  # an attempt's own directory
    work.mkdir(parents=True)
    job = json.loads(payload["job"])
    job["run_dir"], job["result_path"] = str(root), str(work / "result.json")
    (work / "job.json").write_text(json.dumps(job, indent=1))
    manifest = root / "warm" / "calls.json"
    if payload.get("manifest") and not manifest.exists():
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(payload["manifest"])
    # Who runs this attempt, for a later engine of the run to end it if this one dies (see `reap`).
    entry = root / "running" / f"{work.name}.json"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(json.dumps({"pid": os.getpid(), "started": _started(os.getpid()), "engine": payload["engine"],
                                 "dir": work.name}))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if payload["device"] == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)  # CUDA_VISIBLE_DEVICES is Ray's: the GPU this task holds
    try:
        t_run = time.time()
        rc, timed_out = _executor(payload["executor"], env).run(work / "job.json", work / "worker.log",
                                                                float(payload["timeout"]))
        files = {p.name: _tail(p) for p in sorted(work.iterdir()) if p.is_file() and p.name != "job.json"}
        new_manifest = manifest.read_text() if not payload.get("manifest") and manifest.exists() else None
    finally:
        entry.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"rc": rc, "timed_out": timed_out, "files": files, "manifest": new_manifest,
            "node": {"host": mine["host"], "pid": os.getpid(), "gpus": env.get("CUDA_VISIBLE_DEVICES"),
                     "task_s": round(time.time() - t0, 3), "before_worker_s": round(t_run - t0, 3)}}


def probe() -> dict[str, Any]:
    """This node's install (one small task per node when the engine connects)."""
    return identity()


def reap(scratch: str, run_key: str, engine: str) -> list[int]:
    """End on this node every audit of the run started by another engine than ``engine`` (one that died: a
    live engine holds the run's writer lock, so there is no other): the Ray worker that ran it (its worker and
    the worker's processes die with it) and any process still working in its directory. Returns the pids ended."""
    root = scratch_root(scratch, run_key)
    ended, mine = [], set()
    for entry in sorted((root / "running").glob("*.json")):
        try:
            data = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        if data.get("engine") == engine:
            mine.add(data.get("dir"))
            continue
        pid = int(data.get("pid", 0))
        if pid > 1 and pid != os.getpid() and _started(pid) == data.get("started"):
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except ProcessLookupError:
                pass
        entry.unlink(missing_ok=True)
    audits = root / "audits"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwd = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if cwd.is_relative_to(audits) and cwd != audits and cwd.relative_to(audits).parts[0] not in mine:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                ended.append(int(proc.name))
            except ProcessLookupError:
                pass
    for left in audits.glob("*") if audits.is_dir() else ():
        if left.name not in mine:
            shutil.rmtree(left, ignore_errors=True)
    return ended


if __name__ == "__main__":  # `python -m tik_evo.ray_task`: this install's identity, to compare nodes by hand
    json.dump(identity(), sys.stdout, indent=1)
