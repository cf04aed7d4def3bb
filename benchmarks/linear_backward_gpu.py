"""The dense linear backward (dX = dY @ W, dW = dY^T @ X) of the linear root against cuBLAS, at the projections of
the policy update's models (tik-evo bench policy: Qwen3-4B dense and Qwen3-30B-A3B's attention, router and
lm_head; 8192 tokens, 4096 scored at the lm_head).

Implementations, each timed on every projection (dX and dW launches together, do_bench median with L2 flushed):
- `dedicated` (the root's BWD_KERNEL): TMA-fed persistent GEMMs on the operands' row-major storage;
- `dedicated_<tile>`: the same kernel with other BWD_TILE entries (a tile that does not fit loses only itself);
- `transposed`: the forward kernel on transposed views (the backward before the dedicated kernel);
- `cublas`: torch.mm into the same outputs (what a trainer runs without tik-evo).
Backward has no bitwise contract: each implementation's dX and dW are compared with cuBLAS's fp32-accumulated
result by relative L2. Writes JSON.

    tik-evo bench linear-backward --out linear_backward.json
    tik-evo bench linear-backward --smoke --out x.json   # tiny shapes under the CPU interpreter

Imports only torch/triton and the linear root, so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
import tik_evo_kernels.linear.root as root  # noqa: E402

# (name, N, K, rows): y [rows, N] = x [rows, K] @ W^T
SHAPES = [
    ("qwen3-4b.qkv", 6144, 2560, 8192), ("qwen3-4b.o", 2560, 4096, 8192),
    ("qwen3-4b.gate", 9728, 2560, 8192), ("qwen3-4b.down", 2560, 9728, 8192),
    ("qwen3-4b.lm_head", 151936, 2560, 4096),
    ("qwen3-30b-a3b.qkv", 5120, 2048, 8192), ("qwen3-30b-a3b.router", 128, 2048, 8192),
]
SMOKE_SHAPES = [("smoke.a", 96, 160, 37), ("smoke.router", 8, 32, 2100)]
# Other (BLOCK_P, BLOCK_Q, BLOCK_R, GROUP_P, warps, stages, least rows per split) to time beside the root's.
TILES = [(128, 128, 64, 8, 8, 4, 1024), (128, 256, 64, 8, 8, 4, 1024), (256, 128, 64, 8, 8, 3, 1024),
         (128, 256, 64, 8, 8, 3, 512), (128, 128, 64, 8, 4, 4, 1024)]


def rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def timed(fn, smoke: bool) -> float:
    """Median ms (one timed call under the interpreter, where speed means nothing)."""
    fn()
    if smoke:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median")


def cell(name: str, n: int, k: int, rows: int, device: str, smoke: bool) -> dict:
    g = torch.Generator(device=device).manual_seed(n * 31 + k)
    x = torch.randn(rows, k, generator=g, device=device, dtype=torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device=device, dtype=torch.float32) * k ** -0.5).bfloat16()
    gy = (torch.randn(rows, n, generator=g, device=device, dtype=torch.float32) * n ** -0.5).bfloat16()
    gx, gw = torch.empty_like(x), torch.empty_like(w)
    ref_x, ref_w = gy.float() @ w.float(), gy.float().t() @ x.float()
    out = {"shape": name, "n": n, "k": k, "rows": rows, "ms": {}, "rel_l2_vs_fp32": {}, "errors": {},
           "tflops": {}}
    flops = 2 * 2 * rows * n * k

    def record(impl, fn):
        try:
            out["ms"][impl] = timed(fn, smoke)
            out["rel_l2_vs_fp32"][impl] = {"dX": rel_l2(gx, ref_x), "dW": rel_l2(gw, ref_w)}
            out["tflops"][impl] = flops / out["ms"][impl] / 1e9
        except Exception as e:  # noqa: BLE001 - one implementation's failure (a tile too big) loses only itself
            out["errors"][impl] = repr(e)[:300]

    def ours():
        root.linear_backward(x, w, gy, gx, gw)

    def cublas():
        torch.mm(gy, w, out=gx)
        torch.mm(gy.t(), x, out=gw)

    default_tile, default_kernel = root.BWD_TILE, root.BWD_KERNEL
    try:
        record("dedicated", ours)
        for tile in [] if smoke else TILES:
            root.BWD_TILE = tile
            record("dedicated_" + "x".join(map(str, tile)), ours)
        root.BWD_TILE = default_tile
        root.BWD_KERNEL = "transposed"
        record("transposed", ours)
    finally:
        root.BWD_TILE, root.BWD_KERNEL = default_tile, default_kernel
    record("cublas", cublas)
    base = out["ms"].get("cublas")
    out["x_cublas"] = {impl: ms / base for impl, ms in out["ms"].items()} if base else {}
    print(f"{name:24s} " + "  ".join(f"{impl} {ms:.3f} ms ({out['x_cublas'].get(impl, math.nan):.2f}x)"
                                     for impl, ms in out["ms"].items()) +
          (f"  errors: {sorted(out['errors'])}" if out["errors"] else ""), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="linear_backward.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (the code, not speed)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop timing (keep what is measured) after this")
    args = ap.parse_args(argv)
    if args.smoke:
        from tik_evo import interp
        interp.install()
    device = "cpu" if args.smoke else "cuda"
    t0, cells = time.time(), []
    for name, n, k, rows in SMOKE_SHAPES if args.smoke else SHAPES:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: {name} and later shapes not timed", flush=True)
            break
        cells.append(cell(name, n, k, rows, device, args.smoke))
    ratios = [c["x_cublas"]["dedicated"] for c in cells if "dedicated" in c.get("x_cublas", {})]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke,
        "root_bwd_tile": list(root.BWD_TILE), "cells": cells,
        "dedicated_x_cublas_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"dedicated / cuBLAS geomean {result['dedicated_x_cublas_geomean']}; wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
