"""Shared comparison helpers for families: bits between paths, tolerance only against the reference."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tik_evo.family import Check

_INT_VIEW = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.int32: torch.int32,  # indices (e.g. routed expert ids) compare as themselves
    torch.int64: torch.int64,
}

# Relative-L2 tolerance against an fp32/fp64 reference, by output dtype.
REFERENCE_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def poison(*tensors: torch.Tensor) -> None:
    """Fill outputs with NaN so an unwritten element cannot pass as a correct one."""
    for t in tensors:
        if t is not None:
            t.fill_(float("nan"))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT_VIEW[t.dtype])


def bitwise(name: str, a: torch.Tensor, b: torch.Tensor, **details: Any) -> Check:
    """Bit-identical comparison of two computations of the same values (compares the int view)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return Check(name, False, "consistency", {"error": f"shape/dtype {tuple(a.shape)}/{a.dtype} vs "
                                                  f"{tuple(b.shape)}/{b.dtype}", **details})
    finite = bool(torch.isfinite(a).all() and torch.isfinite(b).all())
    diff = bits(a) != bits(b)
    n_diff = int(diff.sum())
    info: dict[str, Any] = {"dtype": str(a.dtype).removeprefix("torch."), "elements": a.numel(),
                            "mismatches": n_diff, "finite": finite, **details}
    if n_diff:
        idx = diff.nonzero()[0].tolist()
        info["first_mismatch"] = idx
        info["max_abs_diff"] = float((a.float() - b.float()).abs().max())
    return Check(name, finite and n_diff == 0, "consistency", info)


def finite(name: str, t: torch.Tensor) -> Check:
    """Every element finite: catches NaN poison left unwritten and overflow alike."""
    bad = ~torch.isfinite(t)
    n = int(bad.sum())
    info: dict[str, Any] = {"non_finite": n, "elements": t.numel()}
    if n:
        info["first_bad"] = bad.nonzero()[0].tolist()
    return Check(name, n == 0, "finite", info)


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64 (benches' figures; a zero reference counts as a tiny one)."""
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def reference(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float | None = None) -> Check:
    """Relative L2 error of ``out`` against a higher-precision reference."""
    tol = REFERENCE_TOL.get(out.dtype, 1e-4) if tol is None else tol
    o = out.detach().double()
    r = ref.detach().double()
    if not bool(torch.isfinite(o).all()):
        return Check(name, False, "reference", {"error": "non-finite output", "tol": tol})
    denom = float(r.norm()) or 1.0
    rel = float((o - r).norm()) / denom
    max_abs = float((o - r).abs().max()) if o.numel() else 0.0
    ok = rel <= tol and not math.isnan(rel)
    return Check(name, ok, "reference", {"rel_l2": rel, "max_abs": max_abs, "tol": tol})


# Tensors this large are benches' inputs, not check cases; drawing them on the CPU took seconds per GB (most of
# an audit's timing stage for families with GB-sized workloads).
DEVICE_DRAW_NUMEL = 1 << 22


def draws_on_device(numel: int, device: str) -> bool:
    return numel >= DEVICE_DRAW_NUMEL and str(device).startswith("cuda")


def randn(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device: str,
          scale: float = 1.0) -> torch.Tensor:
    """Fresh random data from a seeded generator: on the CPU, so a seed gives the same data everywhere, except
    bench-sized tensors on a GPU (`draws_on_device`), drawn there by a generator seeded from ``generator`` (the
    same data for a seed on the same GPU and torch)."""
    if draws_on_device(math.prod(shape), device):
        dg = torch.Generator(device=device)
        dg.manual_seed(int(torch.randint(0, 1 << 62, (1,), generator=generator)))
        return (torch.randn(shape, generator=dg, dtype=torch.float32, device=device) * scale).to(dtype)
    t = torch.randn(shape, generator=generator, dtype=torch.float32) * scale
    return t.to(device=device, dtype=dtype)


def input_copies(device: str, set_bytes: int, most: int = 8) -> int:
    """How many input sets a bench rotates through so repeated runs are not served from L2 (60 MB on an
    H200): enough to cover 256 MB, at most ``most``; one on the CPU, where there is no such cache to fool."""
    if device == "cpu":
        return 1
    return max(1, min(most, (256 << 20) // max(1, set_bytes)))


def rotate(call: Callable[..., None], *inputs: list) -> Callable[[], None]:
    """A bench's ``run()``: ``call(inputs[0][i], inputs[1][i], ...)`` with ``i`` advancing through the input
    sets on every call, so consecutive timed runs read different memory (sized by ``input_copies``)."""
    n = len(inputs[0])
    state = {"i": 0}

    def run() -> None:
        state["i"] = (state["i"] + 1) % n
        call(*(x[state["i"]] for x in inputs))

    return run


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g
