"""Compile ahead: a candidate's Triton kernels compiled before its audit takes the GPU, by a process with no GPU.

Most of an audit's time on a GPU is Triton compiling the candidate's kernels for each shape the checks and the
timed workloads use. The judge, not the candidate, makes those calls, and their shapes are public (the family's
fixed check cases, the campaign's workloads) or drawn per audit from the family's declared distribution. A drawn
shape must be secret only while its own audit runs; Triton specialises a kernel on little of a shape (integer
arguments by divisibility by 16 and equality to 1, the constants a launch derives), so the draws of finished
audits compile most of what a fresh draw needs. So:

- the judges of a run's first DRAWN_AUDITS full audits note every entry-point call they make (tensors by dtype
  and shape, everything else by value) and, once their verdict is written, merge them into ``RUN/warm/calls.json``
  with the GPU's compute capability: the fixed cases, the workloads and those audits' own drawn cases. The file
  never holds a call of an audit in progress, so a candidate never sees its own draws ahead;
- before a later audit takes the GPU (see `gpu_lock`), its judge starts a *warm runner*: sandboxed like every
  runner, with no GPU (CUDA hidden and, where the sandbox can, the device nodes covered), Triton's driver
  replaced by a compile-only one for that capability (:mod:`tik_evo.compile_only`). It replays the calls on meta
  tensors: the candidate's code runs on shapes only, and every kernel it would launch is compiled into its own
  lineage cache directory (:mod:`tik_evo.kernel_cache`), where the audit's runner then finds it.

Nothing of a warm pass is evidence: it cannot touch the GPU, the verdict or another audit's timing, its errors
are recorded and the audit goes on exactly as without it (a kernel it missed is compiled in the audit). Several
audits in flight on one GPU (``evaluate.in_flight``) compile ahead on the host's cores while one at a time holds
the GPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import time
from pathlib import Path
from typing import Any

MANIFEST = Path("warm") / "calls.json"
MAX_CALLS = 2000  # distinct calls kept: shapes, not data; far more than any family's cases and workloads
DRAWN_AUDITS = 4  # audits whose calls (their drawn cases') join the manifest: enough draws to cover the
# specialisations a fresh draw compiles, without a manifest (and each warm pass) growing with every audit


class Undescribable(ValueError):
    """An argument a warm runner could not rebuild (such a call is not replayed)."""


def encode(v: Any) -> Any:
    import torch

    from tik_evo.arena import dtype_name

    if isinstance(v, torch.Tensor):
        return {"t": "meta", "dtype": dtype_name(v.dtype), "shape": list(v.shape)}
    if isinstance(v, torch.dtype):
        return {"t": "dtype", "name": dtype_name(v)}
    if isinstance(v, (list, tuple)):
        return {"t": "tuple" if isinstance(v, tuple) else "list", "items": [encode(x) for x in v]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise Undescribable(type(v).__name__)


class Notes:
    """The judge's notes of the calls it makes, deduplicated."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}

    def add(self, name: str, bound: dict[str, Any], optional: tuple[str, ...] = ()) -> None:
        if len(self.calls) >= MAX_CALLS:
            return
        variants = [bound]
        if any(bound.get(p) is not None for p in optional):  # the production call, optional outputs left out
            variants.append({k: (None if k in optional else v) for k, v in bound.items()})
        for b in variants:
            try:
                call = {"fn": name, "kwargs": {k: encode(v) for k, v in b.items()}}
            except Undescribable:
                return
            self.calls.setdefault(json.dumps(call, sort_keys=True), call)

    def merge(self, run_dir: Path, capability: list[int] | None) -> None:
        """Add these calls to the run's manifest, for the first DRAWN_AUDITS audits that finish (after the
        audit's verdict: the file is the judge's, in the run directory runners cannot see). Audits in flight
        merge one at a time under a lock; the file is replaced whole, never seen half written."""
        if not self.calls:
            return
        path = Path(run_dir) / MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            old = read_manifest(run_dir) or {"capability": capability, "calls": [], "audits": 0}
            if not wants_notes(old if path.exists() else None):
                return
            calls = {json.dumps(c, sort_keys=True): c for c in old["calls"]}
            for key, call in self.calls.items():
                if len(calls) >= MAX_CALLS:
                    break
                calls.setdefault(key, call)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"capability": old.get("capability") or capability,
                                       "calls": list(calls.values()), "audits": int(old.get("audits", 1)) + 1}))
            tmp.replace(path)
        finally:
            os.close(fd)


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("calls"), list) else None


def wants_notes(manifest: dict[str, Any] | None) -> bool:
    """Whether an audit should note its calls: the manifest has fewer than DRAWN_AUDITS audits' calls (a manifest
    of an older engine, which counted none, has one's)."""
    return manifest is None or int(manifest.get("audits", 1)) < DRAWN_AUDITS


def gpu_nodes() -> list[str]:
    """The device files a process opens to reach an NVIDIA GPU: covered in a warm runner's sandbox."""
    return sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*"))


def warm(source: str, calls: list[dict[str, Any]], capability: list[int], opts: dict[str, Any],
         timeout: float, threads: int = 1) -> dict[str, Any]:
    """Run a warm pass for ``source`` (opts: the runner's sandbox options, as for the audit's runner); a report,
    never an exception."""
    from tik_evo.remote import Runner

    t0 = time.time()
    report: dict[str, Any] = {"calls": 0, "failed": 0, "capability": list(capability), "threads": threads}
    runner = None
    try:
        runner = Runner.fork("compile-only", opts["mode"], [*opts["hide"], *gpu_nodes()], opts["cache_dir"],
                             opts["cache_read"])
        report["sandbox"] = runner.sandbox
        runner.timeout = timeout
        runner.request({"op": "compile_only", "capability": list(capability)})
        runner.load(source)
        got = runner.request({"op": "warm", "calls": calls, "threads": threads},
                             timeout=max(1.0, timeout - (time.time() - t0)))
        report.update(calls=got.get("calls", 0), failed=got.get("failed", 0), errors=got.get("errors", []))
    except Exception as e:  # noqa: BLE001 - a warm pass that fails leaves the audit as it was
        report["error"] = f"{type(e).__name__}: {e}"[:1000]
    finally:
        if runner is not None:
            runner.close()
        from tik_evo import sandbox

        sandbox.kill_descendants()
    report["cubins"] = sum(1 for _ in Path(opts["cache_dir"]).rglob("*.cubin"))  # compiled, here or before
    report["seconds"] = time.time() - t0
    return report


@contextlib.contextmanager
def gpu_lock(run_dir: Path, record: dict[str, Any]):
    """Hold this audit's GPU alone among the run's audits in flight (a file lock per visible device, released
    by the kernel if the judge dies). ``record`` gets the wait and the hold, for the audit's evidence."""
    device = os.environ.get("CUDA_VISIBLE_DEVICES", "") or "cpu"
    path = Path(run_dir) / "locks" / f"gpu-{device.replace('/', '_')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    t0 = time.time()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        record.update(lock=path.name, waited_s=time.time() - t0, acquired_at=time.time())
        yield
    finally:
        record["released_at"] = time.time()
        os.close(fd)  # closing the descriptor releases the lock
