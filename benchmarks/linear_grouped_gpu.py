"""An MoE layer's expert projections as grouped launches (linear_grouped_full / _decode of the linear root, and
variants of its knobs) against what a trainer would otherwise run: torch._grouped_mm (CUTLASS grouped GEMM, one
launch) and a Python loop of cuBLAS matmuls, one per expert. Qwen3-30B-A3B's expert shapes (128 experts, top-8;
gate/up K 2048 -> N 768, down K 768 -> N 2048), rows routed by a real top-8 of random router logits (balanced)
and of logits with a per-expert bias (skewed: a few hot experts).

Bits: every variant's grouped rows, in both paths, must equal the root's linear_full on each expert's rows alone.
Times: full-sequence cells by CUDA events over back-to-back calls (median); decode cells also as CUDA-graph
replays (GPU time without the host). Writes JSON.

    tik-evo bench linear-grouped --out linear_grouped.json [--variants-json F]
    tik-evo bench linear-grouped --smoke --out x.json   # the backward cell on the CPU interpreter, tiny sizes

`--smoke` runs only the backward cell, on the CPU under the Triton interpreter: 4 experts (one of them empty),
N 48, K 64, one dW tile for each kernel (pointer and TMA), one call's wall clock for a time (the code, not speed).
Its JSON gives the cell and the root's dW kernel and tile before and after it (the cell must restore them).

Imports only torch/triton and the linear root (+ the engine's knob file helpers), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

from tik_evo_bench.common import header, write_json  # noqa: E402
from tik_evo_bench.ops_matmul_gpu import load, mismatches, randn  # noqa: E402

EXPERTS, TOP_K = 128, 8
SHAPES = {"gate": (768, 2048), "down": (2048, 768)}  # (N, K) of Qwen3-30B-A3B's expert projections
FULL_TOKENS = (1024, 8192)
DECODE_BATCH = (1, 16, 64, 256)
# --smoke (`smoke`): row offsets of 4 experts (the second empty), the backward cell's (name, N, K), one dW tile
SMOKE = False
SMOKE_STARTS = (0, 9, 9, 40, 53)
SMOKE_CELL = ("tiny", 48, 64)
SMOKE_DW_TILE = (64, 64, 32, 4, 2)


def routed_starts(tokens: int, skew: bool, seed: int) -> torch.Tensor:
    """[E + 1] row offsets of tokens x top-8 rows sorted by expert, from a top-8 of random router logits (with
    --smoke: SMOKE_STARTS on the CPU)."""
    if SMOKE:
        return torch.tensor(SMOKE_STARTS, dtype=torch.int32)
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(tokens, EXPERTS, generator=g, device="cuda")
    if skew:  # a few experts much hotter than the rest, as routers drift during training
        logits += 2.0 * torch.randn(EXPERTS, generator=g, device="cuda")
    ids = torch.topk(logits, TOP_K, dim=-1).indices.flatten()
    starts = torch.zeros(EXPERTS + 1, dtype=torch.int32, device="cuda")
    torch.cumsum(torch.bincount(ids, minlength=EXPERTS), 0, out=starts[1:])
    return starts


def grouped_mm_peer():
    """torch._grouped_mm(x [T, K], w^T [E, K, N], offs = end rows [E]) where this torch has it, else None."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None or torch.cuda.get_device_capability()[0] < 9:
        return None
    return lambda x, w, starts, y: y.copy_(fn(x, w.transpose(1, 2), offs=starts[1:]))


def loop_peer(bounds: list[int]):
    """One cuBLAS matmul per expert with rows (host-side bounds, as a Python MoE layer dispatches)."""
    def run(x, w, starts, y):
        for e in range(EXPERTS):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                torch.matmul(x[lo:hi], w[e].t(), out=y[lo:hi])
    return run


def per_expert_reference(root, x, w, bounds) -> torch.Tensor:
    """The contract's bits: the root's linear_full on each expert's rows alone."""
    y = torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16, device="cuda")
    for e in range(EXPERTS):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out = torch.empty(hi - lo, w.shape[1], dtype=torch.bfloat16, device="cuda")
            root.linear_full(x[lo:hi].contiguous(), w[e], None, out)
            y[lo:hi] = out
    return y


# Alternatives to the grouped dW kernel's tile (BLOCK_N, BLOCK_K, BLOCK_R, warps, stages): wider tiles read each
# expert's rows fewer times.
DW_TILES = [(64, 64, 64, 4, 3), (128, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 128, 32, 8, 4), (128, 256, 32, 8, 3)]
# The TMA dW kernel (DW_KERNEL "tma": descriptors over each expert's rows) with these tiles.
TMA_DW_TILES = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
                (128, 64, 64, 4, 4)]


def backward_cell(root, shape: str, n: int, k: int, peer_available: bool) -> dict:
    """linear_grouped_backward (dX through the grouped kernel, dW per expert) against torch._grouped_mm's two
    grouped GEMMs at T 8192, balanced routing; relative L2 difference between the two (backward has no bitwise
    contract)."""
    starts = routed_starts(8192, False, seed=8192)
    rows = int(starts[-1])
    x, w, gy = randn((rows, k), 3), randn((EXPERTS, n, k), 4, k ** -0.5), randn((rows, n), 5)
    gx, gw = torch.empty_like(x), torch.empty_like(w)
    cell = {"shape": shape, "n": n, "k": k, "rows": rows,
            "us": {"root": timed(lambda: root.linear_grouped_backward(x, w, starts, gy, gx, gw), False)}}
    ref_gw, default = gw.clone(), (root.DW_TILE, root.DW_KERNEL)
    # the dW kernel and its tile (dX unchanged): time, and agreement with the root's dW
    for kernel, tile in [("pointer", t) for t in DW_TILES] + [("tma", t) for t in TMA_DW_TILES]:
        name = ("dw_tile_" if kernel == "pointer" else "dw_tma_") + "x".join(map(str, tile))
        try:
            root.DW_TILE, root.DW_KERNEL = tile, kernel
            gw.fill_(float("nan"))
            cell["us"][name] = timed(lambda: root.linear_grouped_backward(x, w, starts, gy, gx, gw), False)
            cell.setdefault("dw_rel_l2_vs_root_tile", {})[name] = float(
                (gw.float() - ref_gw.float()).norm() / ref_gw.float().norm())
        except Exception as e:  # noqa: BLE001 - a tile that does not fit (shared memory) loses only itself
            cell.setdefault("errors", {})[name] = repr(e)[:300]
        finally:
            root.DW_TILE, root.DW_KERNEL = default
    if peer_available:
        offs = starts[1:]

        def torch_backward():
            return torch._grouped_mm(gy, w, offs=offs), torch._grouped_mm(gy.t(), x, offs=offs)

        try:  # the 2D x 2D form (dW) has layout rules of its own; a refusal loses only the peer's figure
            cell["us"]["torch_grouped_mm"] = timed(torch_backward, False)
            tx, tw = torch_backward()
            cell["rel_l2_vs_torch"] = {"dX": float((gx.float() - tx.float()).norm() / tx.float().norm()),
                                       "dW": float((gw.float() - tw.float()).norm() / tw.float().norm())}
        except RuntimeError as e:
            cell["torch_error"] = repr(e)[:300]
    print(f"backward {shape}: {cell}", flush=True)
    return cell


def timed(fn, graph: bool) -> float:
    if SMOKE:  # one call's wall clock: the interpreter's time, which means nothing
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    fn()
    torch.cuda.synchronize()
    if graph:
        return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
    return do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e3


def smoke(out: str) -> int:
    """The backward cell on the CPU under the interpreter at SMOKE_* sizes; writes the cell and the root's
    (DW_KERNEL, DW_TILE) before and after it. Restores this module's settings (and ops_matmul_gpu's DEVICE)."""
    global SMOKE, EXPERTS, DW_TILES, TMA_DW_TILES
    from tik_evo import interp
    from tik_evo_bench import ops_matmul_gpu

    interp.install()
    saved = SMOKE, EXPERTS, DW_TILES, TMA_DW_TILES, ops_matmul_gpu.DEVICE
    SMOKE, EXPERTS, DW_TILES, TMA_DW_TILES = True, len(SMOKE_STARTS) - 1, [SMOKE_DW_TILE], [SMOKE_DW_TILE]
    ops_matmul_gpu.DEVICE = "cpu"
    try:
        root = load("linear", {})
        before = {"kernel": root.DW_KERNEL, "tile": list(root.DW_TILE)}
        cell = backward_cell(root, *SMOKE_CELL, False)
        after = {"kernel": root.DW_KERNEL, "tile": list(root.DW_TILE)}
    finally:
        SMOKE, EXPERTS, DW_TILES, TMA_DW_TILES, ops_matmul_gpu.DEVICE = saved
    result = {**header(gpu="cpu (interpreter)"), "smoke": True, "experts": len(SMOKE_STARTS) - 1,
              "starts": list(SMOKE_STARTS), "dw_tiles": [list(SMOKE_DW_TILE)], "tma_dw_tiles": [list(SMOKE_DW_TILE)],
              "root_dw": {"before": before, "after": after}, "backward": [cell]}
    write_json(out, result)
    print(f"wrote {out}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="linear_grouped.json")
    ap.add_argument("--variants-json", default="",
                    help="a JSON object {name: {KNOB: value}} of linear knob variants to time besides the root")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop timing (keep what is measured) after this")
    ap.add_argument("--backward-only", action="store_true",
                    help="only the backward cells (the root's dW tile and DW_TILES against torch._grouped_mm)")
    ap.add_argument("--smoke", action="store_true",
                    help="only the backward cell, tiny, on the CPU interpreter (the code, not speed); no GPU needed")
    args = ap.parse_args(argv)
    if args.smoke:
        return smoke(args.out)
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (the grouped launch's CPU checks are in tests/families/)")
        return 2
    deadline = time.time() + args.budget_s
    variants = {"root": {}}
    if args.variants_json:
        variants.update(json.loads(Path(args.variants_json).read_text()))
    impls = {name: load("linear", knobs) for name, knobs in variants.items()}
    root = impls["root"]
    peer = grouped_mm_peer()
    result = {**header(device=0),
              "experts": EXPERTS, "top_k": TOP_K, "variants": variants, "grouped_mm": peer is not None,
              "cells": [], "skipped": []}
    cells = [("full", t, skew) for t in FULL_TOKENS for skew in (False, True)]
    cells += [("decode", b, False) for b in DECODE_BATCH]
    if args.backward_only:
        cells = []
    for shape, (n, k) in SHAPES.items():
        w = randn((EXPERTS, n, k), 1, k ** -0.5)
        for phase, tokens, skew in cells:
            if time.time() > deadline:
                result["skipped"].append(f"{shape} {phase} {tokens}")
                continue
            starts = routed_starts(tokens, skew, seed=tokens)
            rows = int(starts[-1])
            bounds = starts.tolist()
            x = randn((rows, k), 2 + tokens)
            y = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
            ref = per_expert_reference(root, x, w, bounds)
            cell = {"shape": shape, "n": n, "k": k, "phase": phase, "tokens": tokens, "skewed": skew, "rows": rows,
                    "active_experts": sum(bounds[e + 1] > bounds[e] for e in range(EXPERTS)),
                    "max_rows_per_expert": max(bounds[e + 1] - bounds[e] for e in range(EXPERTS)), "us": {},
                    "us_graph": {}, "mismatches": {}}
            runs = {}
            for name, impl in impls.items():
                try:
                    for path in ("full", "decode"):
                        fn = getattr(impl, f"linear_grouped_{path}")
                        y.fill_(float("nan"))
                        fn(x, w, starts, y)
                        cell["mismatches"][f"{name}.{path}"] = mismatches(y, ref)
                except Exception as e:  # noqa: BLE001 - a variant that fails to build (resources) loses only itself
                    cell.setdefault("errors", {})[name] = repr(e)[:500]
                    continue
                runs[name] = partial(getattr(impl, f"linear_grouped_{phase}"), x, w, starts, y)
            if peer is not None:
                runs["torch_grouped_mm"] = partial(peer, x, w, starts, y)
            runs["cublas_loop"] = partial(loop_peer(bounds), x, w, starts, y)
            flops = 2.0 * rows * n * k
            for name, fn in runs.items():
                cell["us"][name] = timed(fn, graph=False)
                if phase == "decode":
                    cell["us_graph"][name] = timed(fn, graph=True)
            cell["tflops"] = {name: flops / (us * 1e-6) / 1e12 for name, us in cell["us"].items()}
            result["cells"].append(cell)
            bad = {key: v for key, v in cell["mismatches"].items() if v}
            times = "  ".join(f"{name} {us:8.1f}" + (f" ({cell['us_graph'][name]:6.1f} graph)" if phase == "decode"
                                                      else "") for name, us in cell["us"].items())
            print(f"{shape:<4} {phase:<6} T{tokens:<5}{' skew' if skew else '     '} rows {rows:>6}  us: {times}  "
                  f"bits: {bad or 'all equal'}" + (f"  errors: {cell['errors']}" if "errors" in cell else ""),
                  flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    if time.time() < deadline:
        result["backward"] = [backward_cell(root, shape, n, k, peer is not None) for shape, (n, k) in SHAPES.items()]
    result["all_bit_exact"] = all(not v for c in result["cells"] for v in c["mismatches"].values())
    print("all bit-exact:", result["all_bit_exact"], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
