"""A kernel call replayed from a CUDA graph, checked bit for bit against the same call run eagerly.

Rollout engines capture their decode step in CUDA graphs and replay it. A unified kernel keeps its contract
there only if a replay writes exactly what an eager call writes: a launch that reads a host-side value at
capture, or a scratch buffer that a replay no longer owns, would break it silently. `replay_check` runs a call
eagerly, puts its tensor arguments back as they were, captures the call in a graph, replays it and compares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Arguments larger than this are taken as read-only inputs (weights): not copied, only checked unchanged.
LARGE_BYTES = 64 << 20


@dataclass
class Replay:
    result: Any  # the eager call's return value
    written: int  # tensor arguments the eager call changed (its outputs, in-place updates included)
    elements: int  # elements of those arguments
    differ: int  # elements whose bits differ between the replay and the eager call, over every argument


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as [elements, element size] uint8 (a contiguous copy where it is a strided view)."""
    return t.contiguous().view(torch.uint8).reshape(t.numel(), t.element_size())


def _fingerprint(t: torch.Tensor) -> int:
    """A sum over the tensor's words (a write that keeps it reads as none; enough to catch an output passed
    where an input was expected)."""
    flat = t.contiguous().view(-1)
    try:
        words = flat.view(torch.int32)
    except RuntimeError:  # a size or offset that 4-byte words do not divide
        words = flat.view(torch.uint8)
    return int(words.sum(dtype=torch.int64))


class CaptureError(RuntimeError):
    """The call could not be captured in a CUDA graph (it synchronises, say); `result` is the eager call's
    return value, and its outputs are in place."""

    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result


def _differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((_bytes(a) != _bytes(b)).any(1).sum())


def capture_one(fn: Callable[[], Any]):
    """A CUDA graph of one call of `fn` (a failed capture is undone, see tik_evo.timing)."""
    from tik_evo.timing import _capture

    torch.cuda.synchronize()
    return _capture(fn, 1)


def _tensor_args(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every non-empty tensor among the arguments, one level of tuples and lists included."""
    out = []
    for name, a in [*((str(i), a) for i, a in enumerate(args)), *kwargs.items()]:
        for j, t in enumerate(a) if isinstance(a, (tuple, list)) else [(None, a)]:
            if isinstance(t, torch.Tensor) and t.numel():
                out.append((name if j is None else f"{name}[{j}]", t))
    return out


def replay_check(call: Callable[..., Any], *args, capture: Callable = capture_one,
                 large_bytes: int = LARGE_BYTES, **kwargs) -> Replay:
    """call(*args, **kwargs) eagerly, then from a graph that `capture` makes of it with the same arguments, on the
    same input values: every tensor argument (up to `large_bytes`) is restored to its state before the eager
    call, so an output the replay did not write reads as differing. The replay's writes are left in place."""
    tensors = _tensor_args(args, kwargs)
    small = [t for _, t in tensors if t.numel() * t.element_size() <= large_bytes]
    large = [(i, t, _fingerprint(t)) for i, t in tensors if t.numel() * t.element_size() > large_bytes]
    before = [t.clone() for t in small]
    result = call(*args, **kwargs)
    for i, t, mark in large:
        if _fingerprint(t) != mark:
            raise ValueError(f"replay_check: argument {i} {list(t.shape)} ({t.numel() * t.element_size()} "
                             f"bytes, over large_bytes {large_bytes}) was written by the call; raise large_bytes")
    eager = [t.clone() for t in small]
    written = [k for k, (b, e) in enumerate(zip(before, eager)) if _differ(b, e)]
    for t, b in zip(small, before):
        t.copy_(b)
    try:
        graph = capture(lambda: call(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - the caller decides; the eager outputs stand
        for t, e_out in zip(small, eager):
            t.copy_(e_out)
        raise CaptureError(f"{type(e).__name__}: {e}"[:500], result) from e
    graph.replay()
    if any(t.is_cuda for t in small):
        torch.cuda.synchronize()
    return Replay(result, len(written), sum(eager[k].numel() for k in written),
                  sum(_differ(t, e) for t, e in zip(small, eager)))


def tallied(tally: dict, key: str, call: Callable[..., Any], *args, capture: Callable = capture_one,
            **kwargs) -> Any:
    """replay_check(call, *args, **kwargs) with its outcome added to tally[key] (calls, outputs written, their elements,
    differing elements, capture failures and the first one's error); a call that cannot be captured keeps its
    eager outputs. Returns the eager call's value."""
    t = tally.setdefault(key, {"calls": 0, "written": 0, "elements": 0, "differ": 0, "capture_failures": 0})
    t["calls"] += 1
    try:
        r = replay_check(call, *args, capture=capture, **kwargs)
    except CaptureError as e:
        t["capture_failures"] += 1
        t.setdefault("first_failure", str(e))
        return e.result
    t["written"] += r.written
    t["elements"] += r.elements
    t["differ"] += r.differ
    return r.result


class Rerun:
    """Stands in for a CUDA graph where there is none (the CPU): replay() runs the captured call again, so the
    check still catches a call whose bits depend on state kept between calls."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def replay(self) -> None:
        self.fn()


def replayed_names(impl, signatures) -> list[str]:
    """The forward entry points a kernel file defines, as its family declares them (`EntryPoint`; a backward
    need not be bit-exact, so it is not replayed)."""
    return [s.name for s in signatures if not s.backward and hasattr(impl, s.name)]


class _Replayed:
    """The module `impl` with the named functions run through replay_check, their outcomes summed in `tally`."""

    def __init__(self, impl, names: list[str], tally: dict, capture: Callable):
        self._impl, self._names, self._tally, self._capture = impl, set(names), tally, capture

    def __getattr__(self, name: str):
        fn = getattr(self._impl, name)
        if name not in self._names:
            return fn

        # wraps: families read an entry point's signature (e.g. whether it takes an optional argument), so the
        # stand-in must show the function's own.
        @functools.wraps(fn)
        def replayed(*args, **kwargs):
            return tallied(self._tally, name, fn, *args, capture=self._capture, **kwargs)
        return replayed


def audit_checks(family, impl, seed: int, device: str, capture: Callable | None = None) -> list:
    """The audit's graph stage: the family's small cases with every forward entry point replayed from a CUDA
    graph (`Rerun` on the CPU). The cases' own checks then judge the replays' outputs, and one check per entry
    point says whether its replays wrote the eager calls' bits and could all be captured."""
    from tik_evo.family import Check

    capture = capture or (capture_one if device == "cuda" else Rerun)
    tally: dict = {}
    proxy = _Replayed(impl, replayed_names(impl, family.signatures), tally, capture)
    out = []
    for case in family.check_cases("small"):
        out += [Check(f"replayed: {c.name}", c.passed, c.kind, c.details)
                for c in family.run_checks(proxy, case, seed, device)]
    for name, t in sorted(tally.items()):
        kind = "graph" if t["capture_failures"] else "consistency"
        out.append(Check(f"graph replay == eager call: {name} ({t['calls']} calls)",
                         t["differ"] == 0 and not t["capture_failures"], kind, dict(t)))
    if not tally:
        out.append(Check("graph replay: the small cases call an entry point", False, "graph",
                         {"entry_points": replayed_names(impl, family.signatures)}))
    return out


def graph_rollout(m, seqs, prompts, capture=capture_one) -> tuple[list[torch.Tensor], dict]:
    """A model's (tik_evo_kernels.moe_decoder.MoEDecoder) rollout log-probs with every family call replayed from a
    graph, and per family.path: calls, outputs written, their elements, elements differing from the eager call,
    capture failures (first error). `tik-evo bench model-graphs` runs it on a GPU."""
    from tik_evo_kernels.moe_decoder import hooked

    tally: dict = {}

    def replayed(family, path, call, *args):
        return tallied(tally, f"{family}.{path}", call, *args, capture=capture)

    with hooked(m, replayed):
        lps = m.rollout_logprobs(seqs, prompts)
    return lps, tally


def mismatches(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    """Elements whose bits differ between two lists of fp32 tensors (log-probs)."""
    return sum(int((x.view(torch.int32) != y.view(torch.int32)).sum()) for x, y in zip(a, b))
