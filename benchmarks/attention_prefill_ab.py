"""Interleaved A/B of prefill variants against cuDNN SDPA on the grid's prefill and train-forward cells (GPU).

    tik-evo bench attention-ab --variants-json F.json [--cells REGEX] [--rounds 7] --out X.json

Variants that differ by a few percent cannot be told apart by timing them one after another: the GPU's clock
drifts between implementations by as much (H200 run 54: the same kernel read 0.81 and 0.89x cuDNN in one run).
Here, as in the bench's graph timing (`interleaved_graph_fields`), every implementation of a cell is captured
once as a CUDA graph (calls cycling over input sets that do not fit L2) and the graphs are replayed in rounds,
each round in a rotated order; the figure is the median over rounds of each round's per-call time. This script
skips the bench's checks and event timings and takes more rounds. Bits are not checked here (run the bench's
gate first); the JSON records whether each variant's output equals the first variant's on the cell's first
input set.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
from tik_evo_kernels.attention import bench  # noqa: E402


def _call_ms(fn) -> float:
    """Wall time of one call after warm-up (to size the graph plan only)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return max((time.perf_counter() - t0) / 3 * 1e3, 1e-3)


def run_cell(phase: str, B: int, S: int, modules: dict, rounds: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    sets = bench.prefill_sets(B, S)
    scale = 1 / math.sqrt(bench.D)
    out = torch.empty_like(sets[0][0])

    def cudnn(i: int) -> None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(*sets[i], is_causal=True, scale=scale, enable_gqa=True)

    impls = {"sdpa_cudnn": cudnn}
    outputs = {}
    for name, mod in modules.items():
        mod.prefill(*sets[0], scale, out)
        outputs[name] = out.clone()
        impls[name] = lambda i, mod=mod: mod.prefill(*sets[i], scale, out)
    rows = {n: {"impl": n} for n in impls}
    bench.interleaved_graph_fields(
        [(rows[n], fn, len(sets), _call_ms(lambda fn=fn: fn(0))) for n, fn in impls.items()], rounds=rounds)
    bad = {n: r["graph_error"] for n, r in rows.items() if "graph_error" in r}
    if bad:
        raise RuntimeError(f"{phase} B{B} S{S}: not captured: {bad}")
    med = {n: r["graph_ms"] for n, r in rows.items()}
    first = next(iter(outputs.values()))
    return {"phase": phase, "cell": f"{phase} B{B} S{S}", "graph": rows, "median_ms": med,
            "cudnn_over": {n: med["sdpa_cudnn"] / med[n] for n in modules},
            "same_bits_as_first": {n: bool(torch.equal(o, first)) for n, o in outputs.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants-json", required=True)
    ap.add_argument("--cells", default="", help="regex over cell names, e.g. 'B(8|16) S1(024|152)$'")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    t_start = time.time()
    variants = json.loads(Path(args.variants_json).read_text())
    folder = Path(tempfile.mkdtemp(prefix="attention_ab_"))
    modules = {n: bench.load_variant(n, knobs, folder)[0] for n, knobs in variants.items()}
    _, cells = bench.grid_cells()
    cells = [c for c in cells if re.search(args.cells, f"{c[0]} B{c[1]} S{c[2]}")]
    rows, skipped = [], []
    for phase, B, S in cells:
        if time.time() - t_start > args.budget_s:
            skipped.append(f"{phase} B{B} S{S}")
            continue
        row = run_cell(phase, B, S, modules, args.rounds)
        rows.append(row)
        print(f"{row['cell']:28s}", " ".join(f"{n}={x:.3f}" for n, x in row["cudnn_over"].items()), flush=True)
    summary = {}
    for phase in sorted({r["phase"] for r in rows}):
        got = [r for r in rows if r["phase"] == phase]
        summary[phase] = {n: math.exp(statistics.fmean(math.log(r["cudnn_over"][n]) for r in got)) for n in modules}
        summary[phase]["cells"] = len(got)
        print(f"geomean cuDNN/ours {phase:14s}", " ".join(f"{n}={summary[phase][n]:.3f}" for n in modules))
    Path(args.out).write_text(json.dumps({
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shape": {"q_heads": bench.HQ, "kv_heads": bench.HKV, "head_dim": bench.D},
        "variants": variants, "rounds": args.rounds, "geomean_cudnn_over": summary, "cells": rows,
        "skipped": skipped, "seconds": time.time() - t_start}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
