"""GPU benchmark of the linear, logprob and moe_routing families: the roots and a small knob sweep against
peers (cuBLAS, torch eager, torch.compile, Liger-Kernel), with bitwise path-consistency checks at model
shapes. One run, one JSON file, a short table printed last.

    PYTHONUNBUFFERED=1 tik-evo bench ops-matmul --out $OUT/matmul_gpu.json

With `--linear-variants FILE` (a JSON {name: knob changes}) only the linear decode cells (M 1, 64, 256 of the five
shapes) are timed, each variant against cuBLAS, after its decode rows are checked bit for bit against a full pass.

`--dry-run` runs every code path on the CPU under the Triton interpreter at tiny sizes (`_dry_run_setup`): for CI
and for checking a change before a GPU session; its times are the interpreter's and mean nothing.

With `--extras JSON` ({family: {label: kernel file}}, as `tik-evo bench ops --best / --kernel` pass it) each
file is checked like the root and timed beside it on every cell of its family (rows named by its label, the
root timed back to back as "root"); RESULTS["extras"] gives each one's time over the root's per cell.

Imports only torch, triton and tik_evo.knobs (plus liger_kernel when it is installed). Every configuration
timed is also checked bit for bit (decode rows against the same rows of a full pass) before it may be chosen.
"""

# Closures built inside the timing loops are called before the loop variables move on.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from tik_evo_kernels import variants  # noqa: E402
from tik_evo_kernels.peers import logprob_torch, routing_torch  # noqa: E402
from tik_evo_kernels.variants import KernelFile, tag  # noqa: E402, F401 - the suites' names for them

RESULTS: dict = {"env": {}, "ceilings": {}, "linear": [], "logprob": [], "moe_routing": [], "consistency": [],
                 "chosen": {}, "errors": [], "extras": {}}
ROWS: list[tuple] = []  # (family, workload, impl, time_us, metric)
DEADLINE = [float("inf")]
_IMPLS: dict = {}
DEVICE = "cuda"  # "cpu" with --dry-run: every code path under the interpreter, at SIZES' dry-run values
# The run's sizes (GPU values); `_dry_run_setup` shrinks them so a CPU run takes seconds.
SIZES = {"copy": 1 << 30, "matmul": 8192, "linear_rows": 4096, "linear_prefix": 1000,
         "linear_ms": (1, 2, 3, 7, 16, 33, 64, 100, 128, 255, 256), "vocab": 151936, "logprob_rows": 2048,
         "logprob_prefix": 700, "logprob_ref": 128, "logprob_bs": (1, 2, 5, 16, 64, 100, 256),
         "logprob_sweep_rows": 16384, "routing_rows": 32768, "routing_bs": (1, 2, 7, 64, 100, 256),
         "full_ms": (4096, 16384), "decode_ms": (1, 64, 256), "logprob_full": (4096, 32768),
         "routing_full": (4096, 32768)}


EXTRAS: dict[str, list[KernelFile]] = {}  # family -> its extra implementations (--extras)


def with_root(family: str) -> list:
    """The root ({}) and the family's extra implementations, to time back to back on a cell; [] without extras."""
    return variants.with_root(EXTRAS.get(family, []))


def load(family: str, knobs: dict | KernelFile | None = None):
    return variants.load(family, knobs, _IMPLS)


def summarize_extras() -> None:
    """RESULTS["extras"][family][label]: each extra's time over the root's on every cell where both were timed."""
    for family, files in EXTRAS.items():
        RESULTS["extras"].setdefault(family, {}).update(variants.vs_root(RESULTS[family], files))


def timeit(fn, graph: bool) -> float:
    """Median seconds per call: CUDA-graph replays for launch-bound sizes, CUDA events otherwise."""
    if time.time() > DEADLINE[0]:
        raise TimeoutError("time budget of this run spent: remaining timings skipped")
    fn()
    if DEVICE != "cuda":  # a dry run: one call's wall clock (the interpreter's time, not a GPU's)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    if graph:
        return do_bench_cudagraph(fn, rep=25, return_mode="median") / 1e3
    return do_bench(fn, warmup=10, rep=30, return_mode="median") / 1e3


def rotating(make, n_bytes: int, budget: int = 512 << 20, most: int = 8):
    """Several input sets, so repeated runs are not served from L2 (60 MB)."""
    return [make(i) for i in range(max(1, min(most, budget // max(1, n_bytes))))]


def cycler(sets, f):
    st = {"i": 0}

    def run():
        st["i"] = (st["i"] + 1) % len(sets)
        f(*sets[st["i"]])
    return run


def randn(shape, seed, scale=1.0):
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    t = torch.randn(shape, generator=g, device=DEVICE, dtype=torch.bfloat16)
    return t.mul_(scale) if scale != 1.0 else t


def mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    view = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.int32: torch.int32}[a.dtype]
    return int((a.contiguous().view(view) != b.contiguous().view(view)).sum())


def record(family, workload, impl, t, **metric):
    RESULTS[family].append({"workload": workload, "impl": impl, "time_us": t * 1e6, **metric})
    ROWS.append((family, workload, impl, t * 1e6, metric))


def copy_time(nbytes: int, graph: bool) -> float:
    """A device copy of the same bytes (read + write): the honest ceiling for small memory-bound launches."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    sets = rotating(lambda i: (src,), nbytes, most=1)
    return timeit(cycler(sets, lambda s: dst.copy_(s)), graph)


def guard(name):
    def deco(f):
        def run(*a, **k):
            t0 = time.time()
            try:
                return f(*a, **k)
            except Exception as e:  # noqa: BLE001 - keep going: one broken section must not lose the others' numbers
                RESULTS["errors"].append({"section": name, "error": repr(e), "trace": traceback.format_exc()[-3000:]})
                print(f"!! {name} failed: {e!r}", flush=True)
            finally:
                print(f"-- {name} done in {time.time() - t0:.1f}s", flush=True)
        return run
    return deco


def guarded(section: str, f):
    """f() or, if it raises, None with the error recorded: an extra implementation that fails on one cell loses
    that cell only. The time budget still stops the run."""
    try:
        return f()
    except TimeoutError:
        raise
    except Exception as e:  # noqa: BLE001
        RESULTS["errors"].append({"section": section, "error": repr(e)[:500]})
        print(f"!! {section}: {e!r}"[:300], flush=True)
        return None


def gmean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("inf")


@guard("ceilings")
def ceilings():
    n = SIZES["copy"]  # 2 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), False)
    RESULTS["ceilings"]["copy_TBps"] = 2 * n * 2 / t / 1e12
    mm = SIZES["matmul"]
    a, b = randn((mm, mm), 1), randn((mm, mm), 2)
    t = timeit(lambda: a @ b, False)
    RESULTS["ceilings"]["matmul_TFLOPs"] = 2 * mm ** 3 / t / 1e12
    print("ceilings", RESULTS["ceilings"], flush=True)


# ---------------------------------------------------------------- linear
# Qwen3-4B projections (hidden 2560, 32x128 q, 8x128 kv, MLP 9728) and Llama-3.1-8B's down projection.
LINEAR_SHAPES = [("qwen3-4b.qkv", 6144, 2560), ("qwen3-4b.o", 2560, 4096), ("qwen3-4b.gate_up", 19456, 2560),
                 ("qwen3-4b.down", 2560, 9728), ("llama3-8b.down", 4096, 14336)]
# Comparison entries around the committed root: the previous root's full-path depth (3 stages for every K),
# wider full tiles, and decode without the full path's tiles for large batches.
LINEAR_FULL = {"root": {}, "stages3": {"FULL_SHORT_K": 0, "FULL_NUM_STAGES": 3},
               "128x256": {"FULL_BLOCK_N": 256, "FULL_NUM_STAGES": 3, "FULL_SHORT_K": 0}}
LINEAR_DECODE = {"root": {}, "no_full_tiles": {"DECODE_FULL_TILES_M": 0}, "pointers": {"DECODE_USE_TMA": False}}
K_CHUNKS = (0, 4096)  # 0: no K split (set explicitly; the root splits at 4096)


def _linear_decode_vs_full(impl, x, w, bias, yf, yf32, ms=None, last=0):
    """Mismatches (bf16, fp32) of decode launches of M rows at scattered positions against a full pass's rows
    (and of the `last` rows at the end, where a split full launch puts its second range)."""
    n, bad16, bad32 = w.shape[0], 0, 0
    for m, at_end in [(m, False) for m in ms or SIZES["linear_ms"]] + ([(last, True)] if last else []):
        rows = (torch.arange(x.shape[0] - m, x.shape[0], device=DEVICE) if at_end
                else torch.randperm(x.shape[0], device=DEVICE)[:m].sort().values)
        yd = torch.empty((m, n), dtype=torch.bfloat16, device=DEVICE)
        yd32 = torch.empty((m, n), dtype=torch.float32, device=DEVICE)
        impl.linear_decode(x[rows].contiguous(), w, bias, yd, yd32)
        bad16 += mismatches(yd, yf[rows])
        bad32 += mismatches(yd32, yf32[rows])
    return bad16, bad32


def _linear_inputs(n, k):
    return randn((SIZES["linear_rows"], k), 7), randn((n, k), 8, k ** -0.5), randn((n,), 9)


def linear_consistency(knobs: dict, shapes=None, label: str | None = None):
    """Decode rows (M = 1..256 at scattered positions) and a 1000-row prefix pass against an M=4096 pass."""
    impl = load("linear", knobs)
    shapes = shapes or LINEAR_SHAPES
    total = {"bf16": 0, "fp32": 0, "prefix_fp32": 0}
    rels = []
    for _, n, k in shapes:
        x, w, b = _linear_inputs(n, k)
        for bias in (None, b):
            yf = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device=DEVICE)
            yf32 = torch.empty((x.shape[0], n), dtype=torch.float32, device=DEVICE)
            impl.linear_full(x, w, bias, yf, yf32)
            ref = x.double() @ w.double().t() + (bias.double() if bias is not None else 0)
            rels.append(float((yf32.double() - ref).norm() / ref.norm()))
            bad16, bad32 = _linear_decode_vs_full(impl, x, w, bias, yf, yf32)
            total["bf16"] += bad16
            total["fp32"] += bad32
            pre = SIZES["linear_prefix"]
            yp = torch.empty((pre, n), dtype=torch.bfloat16, device=DEVICE)
            yp32 = torch.empty((pre, n), dtype=torch.float32, device=DEVICE)
            impl.linear_full(x[:pre].contiguous(), w, bias, yp, yp32)
            total["prefix_fp32"] += mismatches(yp32, yf32[:pre])
    entry = {"family": "linear", "impl": label or tag(knobs), "shapes": [s[0] for s in shapes],
             "decode_vs_full_bf16_mismatches": total["bf16"], "decode_vs_full_fp32_mismatches": total["fp32"],
             "prefix_vs_full_fp32_mismatches": total["prefix_fp32"], "max_fp32_rel_l2_vs_fp64": max(rels)}
    RESULTS["consistency"].append(entry)
    return sum(total.values()) == 0


_FULL_PASSES: dict = {}


def linear_decode_consistency(knobs: dict, label: str):
    """Decode rows of a variant against an M=4096 full pass, no bias (the fp32 values then expose every dot
    step). Decode-only knobs leave the full path as it is, so its pass is shared by the variants."""
    impl = load("linear", knobs)
    full_knobs = {k: v for k, v in knobs.items() if not k.startswith("DECODE_")}
    total = [0, 0]
    for name, n, k in LINEAR_SHAPES:
        key = (tag(full_knobs), name)
        if key not in _FULL_PASSES:
            x, w, _ = _linear_inputs(n, k)
            yf = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device=DEVICE)
            yf32 = torch.empty((x.shape[0], n), dtype=torch.float32, device=DEVICE)
            load("linear", full_knobs).linear_full(x, w, None, yf, yf32)
            _FULL_PASSES[key] = (x, w, yf, yf32)
        x, w, yf, yf32 = _FULL_PASSES[key]
        for i, bad in enumerate(_linear_decode_vs_full(impl, x, w, None, yf, yf32)):
            total[i] += bad
    RESULTS["consistency"].append({"family": "linear", "impl": label, "shapes": [s[0] for s in LINEAR_SHAPES],
                                   "decode_vs_full_bf16_mismatches": total[0],
                                   "decode_vs_full_fp32_mismatches": total[1]})
    return sum(total) == 0


@guard("linear")
def bench_linear(full_ms, decode_ms):
    peak = RESULTS["ceilings"].get("matmul_TFLOPs", 0)
    times: dict = {}  # (phase, cfg, chunk) -> {workload: time / cublas}
    failed: set = set()  # configurations that could not run (e.g. out of shared memory): dropped, not averaged
    for name, n, k in LINEAR_SHAPES:
        for m in full_ms + decode_ms:
            decode = m <= 256
            wl, _, _, _, sets, y, t_cublas = _cublas_cell(name, n, k, m, decode)
            flops = 2 * m * n * k
            cfgs = LINEAR_DECODE if decode else LINEAR_FULL
            for cname, kn in cfgs.items():
                for chunk in K_CHUNKS:
                    if not decode and cname == "128x256" and chunk:
                        continue
                    key = ("decode" if decode else "full", cname, chunk)
                    if key in failed:
                        continue
                    knobs = {**kn, "K_CHUNK": chunk}  # explicit: 0 is "no split", not the root's split
                    impl = load("linear", knobs)
                    fn = impl.linear_decode if decode else impl.linear_full
                    try:
                        t = timeit(cycler(sets, lambda x, w, fn=fn: fn(x, w, None, y)), decode)
                    except OutOfResources as e:
                        failed.add(key)
                        times.pop(key, None)
                        RESULTS["errors"].append({"section": f"linear {key}", "error": repr(e)[:300]})
                        continue
                    times.setdefault(key, {})[wl] = t / t_cublas
                    record("linear", wl, ("decode:" if decode else "full:") + tag(knobs), t,
                           tflops=flops / t / 1e12, vs_cublas=t / t_cublas,
                           bw_TBps=((m + n) * k * 2 + m * n * 2) / t / 1e12,
                           pct_matmul_peak=flops / t / 1e12 / peak if peak else None)
            for spec in with_root("linear"):  # the root and each extra implementation, back to back
                def run(spec=spec):
                    fn = getattr(load("linear", spec), "linear_decode" if decode else "linear_full")
                    return timeit(cycler(sets, lambda x, w: fn(x, w, None, y)), decode)
                t = guarded(f"linear {tag(spec)} {wl}", run)
                if t is not None:
                    record("linear", wl, ("decode:" if decode else "full:") + tag(spec), t, tflops=flops / t / 1e12,
                           vs_cublas=t / t_cublas)
    # Choose per K_CHUNK the best full and decode schedules, then the K_CHUNK whose pair is best overall.
    best = None
    for chunk in K_CHUNKS:
        full = {c: gmean(v.values()) for (p, c, ch), v in times.items() if p == "full" and ch == chunk}
        dec = {c: gmean(v.values()) for (p, c, ch), v in times.items() if p == "decode" and ch == chunk}
        if not full or not dec:
            continue
        fc, dc = min(full, key=full.get), min(dec, key=dec.get)
        score = gmean([full[fc]] * len(full_ms) + [dec[dc]] * len(decode_ms))
        RESULTS["chosen"].setdefault("linear_by_chunk", {})[chunk] = {
            "full": fc, "decode": dc, "full_gmean_vs_cublas": full[fc], "decode_gmean_vs_cublas": dec[dc]}
        if best is None or score < best[0]:
            best = (score, chunk, fc, dc)
    if best:
        _, chunk, fc, dc = best
        knobs = {**LINEAR_FULL[fc], **LINEAR_DECODE[dc], "K_CHUNK": chunk}
        RESULTS["chosen"]["linear"] = knobs
        print("linear chosen", knobs, flush=True)
        linear_consistency(knobs, label="chosen:" + tag(knobs))


def _small_knobs(k: str) -> bool:
    return k.startswith("DECODE_SMALL_")


def _linear_cell(name: str, n: int, k: int, m: int):
    """A cell's workload name, rotated (x, W) input sets and output buffer."""
    sets = rotating(lambda i: (randn((m, k), 10 + i), randn((n, k), 50 + i, k ** -0.5)), (m + n) * k * 2)
    return f"{name}.M{m}", sets, torch.empty((m, n), dtype=torch.bfloat16, device=DEVICE)


def _cublas_cell(name: str, n: int, k: int, m: int, graph: bool):
    """A cell with cuBLAS timed on it (recorded): (workload, m, n, k, sets, out, cuBLAS seconds)."""
    wl, sets, y = _linear_cell(name, n, k, m)
    t = timeit(cycler(sets, lambda x, w: torch.matmul(x, w.t(), out=y)), graph)
    record("linear", wl, "cublas", t, tflops=2 * m * n * k / t / 1e12)
    return wl, m, n, k, sets, y, t


@guard("linear variants")
def bench_linear_variants(variants: dict, decode_ms=(1, 64, 256), full_ms=(4096,)):
    """Each variant's decode on the decode cells, against cuBLAS, once its bits match the full path. Variants
    pair a schedule for small launches (DECODE_SMALL_*, M <= DECODE_SMALL_M) with one for the others, so the
    best of each is picked from its own cells and the pair is checked and timed last as "combined".
    The full path is timed on `full_ms` rows once per distinct set of non-decode knobs (a contract knob such as
    K_CHUNK changes both paths, and its cost on the full path is part of the trade)."""
    full_cells = [_cublas_cell(name, n, k, m, False) for name, n, k in LINEAR_SHAPES for m in full_ms]
    cells = [_cublas_cell(name, n, k, m, True) for name, n, k in LINEAR_SHAPES for m in decode_ms]
    full_done: dict = {}
    ratios: dict = {}  # variant -> {workload: time / cublas}

    def run_variant(vname, knobs):
        t0 = time.time()
        try:
            ok = linear_decode_consistency(knobs, vname)
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: the next variant may still run
            RESULTS["errors"].append({"section": f"linear variant {vname}", "error": repr(e)[:500]})
            print(f"!! {vname}: {e!r}"[:300], flush=True)
            return
        if not ok:
            print(f"!! {vname}: decode bits differ from the full path; not timed", flush=True)
            return
        impl = load("linear", knobs)
        full_tag = tag({k: v for k, v in knobs.items() if not k.startswith("DECODE_")})
        if full_tag not in full_done:
            full_done[full_tag] = {}
            for wl, m, n, k, sets, y, t_cublas in full_cells:
                t = timeit(cycler(sets, lambda x, w: impl.linear_full(x, w, None, y)), False)
                full_done[full_tag][wl] = t / t_cublas
                record("linear", wl, "full:" + vname, t, vs_cublas=t / t_cublas, tflops=2 * m * n * k / t / 1e12)
            RESULTS["chosen"].setdefault("linear_full_variants", {})[vname] = {
                "full_knobs": full_tag, "gmean_vs_cublas": gmean(full_done[full_tag].values()),
                "max_vs_cublas": max(full_done[full_tag].values())}
            print(f"{vname} full: " + " ".join(f"{wl}={v:.2f}" for wl, v in full_done[full_tag].items()), flush=True)
        for wl, m, n, k, sets, y, t_cublas in cells:
            t = timeit(cycler(sets, lambda x, w: impl.linear_decode(x, w, None, y)), True)
            ratios.setdefault(vname, {})[wl] = t / t_cublas
            record("linear", wl, "decode:" + vname, t, vs_cublas=t / t_cublas,
                   bw_TBps=((m + n) * k * 2 + m * n * 2) / t / 1e12)
        r = ratios[vname]
        print(f"{vname}: " + " ".join(f"{wl}={v:.2f}" for wl, v in r.items())
              + f"  ({time.time() - t0:.1f}s)", flush=True)

    for vname, knobs in variants.items():
        try:
            run_variant(vname, knobs)
        except TimeoutError as e:
            ratios.pop(vname, None)  # a partly timed variant would skew the comparison
            RESULTS["errors"].append({"section": "linear variants", "error": f"{e} (at {vname})"})
            print(f"!! {e} (at {vname})", flush=True)
            break

    def score(v, small):
        return gmean([x for wl, x in ratios[v].items() if (int(wl.rsplit(".M", 1)[1]) <= 16) == small])

    summary = {v: {"small_M_gmean": score(v, True), "other_M_gmean": score(v, False), "all_gmean": gmean(r.values())}
               for v, r in ratios.items()}
    RESULTS["chosen"]["linear_variants"] = summary
    if not ratios:
        return
    small = min(ratios, key=lambda v: score(v, True))
    other = min(ratios, key=lambda v: score(v, False))
    if small == other or not variants[small].get("DECODE_SMALL_M"):
        # One variant wins both, or the small-launch winner has no small schedule to graft: nothing to combine.
        combined = variants[small] if small == other else None
    else:
        combined = {**{k: v for k, v in variants[other].items() if not _small_knobs(k)},
                    **{k: v for k, v in variants[small].items() if _small_knobs(k)}}
    RESULTS["chosen"]["linear_decode"] = {"small_from": small, "other_from": other, "knobs": combined}
    print("linear decode: small launches from", small, "others from", other, "->", combined, flush=True)
    if combined is not None and small != other:
        try:
            run_variant("combined", combined)
        except TimeoutError as e:
            ratios.pop("combined", None)
            RESULTS["errors"].append({"section": "linear variants", "error": f"{e} (at combined)"})
        if "combined" in ratios:
            RESULTS["chosen"]["linear_variants"]["combined"] = {"all_gmean": gmean(ratios["combined"].values())}


@guard("linear full A/B")
def bench_linear_full_ab(variants: dict, full_ms=(4096, 16384), repeats: int = 5):
    """The full path of a few variants against cuBLAS, interleaved: every repeat times cuBLAS and each variant
    on every cell, in an order rotated per repeat, so clock and thermal drift hit all of them alike; the
    median ratio per cell is reported. For full-path claims, where single runs moved ratios by up to 20%."""
    impls = {v: load("linear", kn) for v, kn in variants.items()}
    cells = [_linear_cell(name, n, k, m) for name, n, k in LINEAR_SHAPES for m in full_ms]
    ratios: dict = {}  # variant -> workload -> [ratio per repeat]
    for v in list(impls):  # a variant that does not build or launch (e.g. out of shared memory) leaves the A/B
        try:
            for _, sets, y in cells:
                impls[v].linear_full(*sets[0], None, y)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            RESULTS["chosen"].setdefault("linear_full_ab_failed", {})[v] = f"{type(e).__name__}: {e}"[:300]
            print(f"{v}: dropped ({type(e).__name__})", flush=True)
            del impls[v]
    names = list(impls)
    for v in names:  # each variant's full pass of every cell against its own decode rows, the last 256 included
        bad = [0, 0]
        for _, sets, y in cells:
            x, w = sets[0]
            yf, yf32 = torch.empty_like(y), torch.empty(y.shape, dtype=torch.float32, device=DEVICE)
            impls[v].linear_full(x, w, None, yf, yf32)
            for i, b in enumerate(_linear_decode_vs_full(impls[v], x, w, None, yf, yf32, ms=(1, 64, 256), last=256)):
                bad[i] += b
        RESULTS["consistency"].append({"family": "linear", "impl": f"full_ab:{v}", "cells": [c[0] for c in cells],
                                       "decode_vs_full_bf16_mismatches": bad[0],
                                       "decode_vs_full_fp32_mismatches": bad[1]})
        print(f"{v}: decode rows vs full passes of the A/B cells: {bad[0]} bf16, {bad[1]} fp32 mismatches", flush=True)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for wl, sets, y in cells:
            t_cublas = timeit(cycler(sets, lambda x, w: torch.matmul(x, w.t(), out=y)), False)
            for v in order:
                t = timeit(cycler(sets, lambda x, w, f=impls[v].linear_full: f(x, w, None, y)), False)
                ratios.setdefault(v, {}).setdefault(wl, []).append(t / t_cublas)
                record("linear", wl, f"full_ab:{v}:r{r}", t, vs_cublas=t / t_cublas, cublas_us=t_cublas * 1e6)
        print(f"repeat {r + 1}/{repeats} done", flush=True)
    summary = {}
    for v, per in ratios.items():
        med = {wl: sorted(x)[len(x) // 2] for wl, x in per.items()}
        summary[v] = {"median_vs_cublas": med, "gmean": gmean(med.values()), "max": max(med.values()),
                      "within_1.25": sum(x <= 1.25 for x in med.values()), "cells": len(med),
                      "spread": {wl: [min(x), max(x)] for wl, x in per.items()}}
        print(f"{v}: gmean {summary[v]['gmean']:.3f}, within 1.25x {summary[v]['within_1.25']}/{len(med)}: "
              + " ".join(f"{wl}={x:.2f}" for wl, x in med.items()), flush=True)
    RESULTS["chosen"]["linear_full_ab"] = summary


# ---------------------------------------------------------------- logprob
def logprob_consistency(knobs: dict, label: str | None = None):
    V, T = SIZES["vocab"], SIZES["logprob_rows"]
    impl = load("logprob", knobs)
    x = randn((T, V), 5, 4.0)
    tg = torch.randint(0, V, (T,), device=DEVICE)
    bad, rel = 0, []
    for temp in (1.0, 0.7):
        outs = [torch.empty(T, dtype=torch.float32, device=DEVICE) for _ in range(3)]
        impl.logprob_full(x, tg, temp, *outs)
        for b in SIZES["logprob_bs"]:
            rows = torch.randperm(T, device=DEVICE)[:b].sort().values
            d = [torch.empty(b, dtype=torch.float32, device=DEVICE) for _ in range(3)]
            impl.logprob_decode(x[rows].contiguous(), tg[rows].contiguous(), temp, *d)
            bad += sum(mismatches(a, o[rows]) for a, o in zip(d, outs))
        pre, ref = SIZES["logprob_prefix"], SIZES["logprob_ref"]
        part = [torch.empty(pre, dtype=torch.float32, device=DEVICE) for _ in range(3)]
        impl.logprob_full(x[:pre].contiguous(), tg[:pre].contiguous(), temp, *part)
        bad += sum(mismatches(a, o[:pre]) for a, o in zip(part, outs))
        ref_lp, ref_ent = logprob_torch(x[:ref].double(), tg[:ref], temp)
        rel += [float((outs[0][:ref].double() - ref_lp).norm() / ref_lp.norm()),
                float((outs[1][:ref].double() - ref_ent).norm() / ref_ent.norm())]
    RESULTS["consistency"].append({"family": "logprob", "impl": label or tag(knobs), "temperatures": [1.0, 0.7],
                                   "decode_and_prefix_vs_full_fp32_mismatches": bad, "max_rel_l2_vs_fp64": max(rel)})
    return bad == 0


# Root: exp2 form, 2048-wide chunks, prefetch (82.5% of copy bandwidth at 16K tokens, 2026-12-02). The previous
# root (4096-wide, no prefetch: ~188 registers, 2 programs and 16 KB of logits in flight per SM), other widths and
# warps, and the exp form, to compare.
LOGPROB_SWEEP = [{}, {"VOCAB_CHUNK": 4096, "FULL_PREFETCH": False, "DECODE_PREFETCH": False},
                 {"VOCAB_CHUNK": 1024}, {"NUM_WARPS": 8}, {"SOFTMAX_FORM": "exp"}]


def _logprob_sets(t_rows, V):
    return rotating(lambda i: (randn((t_rows, V), 100 + i, 4.0), torch.randint(0, V, (t_rows,), device=DEVICE)),
                    t_rows * V * 2)


@guard("logprob")
def bench_logprob(full_ts, decode_bs, eager_max, compile_ts):
    V = SIZES["vocab"]
    copy_bw = RESULTS["ceilings"].get("copy_TBps", 0)
    lp_ent = {}

    def rec(wl, name, t, nbytes):
        record("logprob", wl, name, t, bw_TBps=nbytes / t / 1e12,
               pct_copy=nbytes / t / 1e12 / copy_bw if copy_bw else None)

    def outs(n):
        if n not in lp_ent:
            lp_ent[n] = (torch.empty(n, dtype=torch.float32, device=DEVICE),
                         torch.empty(n, dtype=torch.float32, device=DEVICE))
        return lp_ent[n]

    # 1. Sweep the chunk width, warps and pipelining depth on the full path at 16K tokens.
    sweep_rows = SIZES["logprob_sweep_rows"]
    sets = _logprob_sets(sweep_rows, V)
    sweep = {}
    for kn in LOGPROB_SWEEP:
        impl = load("logprob", kn)
        t = timeit(cycler(sets, lambda x, tg, impl=impl: impl.logprob_full(x, tg, 1.0, *outs(sweep_rows))), False)
        sweep[tag(kn)] = (t, kn)
        rec(f"full.T{sweep_rows}.V{V}", "sweep:" + tag(kn), t, sweep_rows * V * 2)
    del sets
    base = min(sweep.values(), key=lambda v: v[0])[1]
    base = {**base, "DECODE_NUM_STAGES": base.get("FULL_NUM_STAGES", 1)}
    # 2. The vocabulary split (contract) with that schedule, on every workload, against the peers.
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    except Exception as e:  # noqa: BLE001 - a missing peer must not stop the run
        LigerCrossEntropyFunction = None
        RESULTS["errors"].append({"section": "liger import", "error": repr(e)})
    compiled = torch.compile(logprob_torch, dynamic=False)
    split_times: dict = {}
    for t_rows in full_ts + decode_bs:
        decode = t_rows <= 256
        nbytes = t_rows * V * 2
        sets = _logprob_sets(t_rows, V)
        wl = f"{'decode.B' if decode else 'full.T'}{t_rows}.V{V}"
        lp, ent = outs(t_rows)
        rec(wl, "copy_same_bytes", copy_time(nbytes // 2, decode), nbytes)
        for split in (0, 16384, 32768):
            kn = {**base, "VOCAB_SPLIT": split}  # explicit: the root's own split must not stand in for 0
            impl = load("logprob", kn)
            fn = impl.logprob_decode if decode else impl.logprob_full
            t = timeit(cycler(sets, lambda x, tg, fn=fn: fn(x, tg, 1.0, lp, ent)), decode)
            split_times.setdefault(split, {})[wl] = t
            rec(wl, tag(kn), t, nbytes)
        for spec in with_root("logprob"):  # the root and each extra implementation, back to back
            def run(spec=spec, sets=sets):
                fn = getattr(load("logprob", spec), "logprob_decode" if decode else "logprob_full")
                return timeit(cycler(sets, lambda x, tg: fn(x, tg, 1.0, lp, ent)), decode)
            t = guarded(f"logprob {tag(spec)} {wl}", run)
            if t is not None:
                rec(wl, tag(spec), t, nbytes)
        if t_rows <= eager_max:
            rec(wl, "torch_eager", timeit(cycler(sets, lambda x, tg: logprob_torch(x, tg)), decode), nbytes)
            if t_rows in compile_ts:
                rec(wl, "torch_compile", timeit(cycler(sets, lambda x, tg: compiled(x, tg)), decode), nbytes)
        if LigerCrossEntropyFunction is not None:  # loss only (no entropy); not graph-capturable: events
            rec(wl, "liger_ce_none(no entropy)", timeit(cycler(sets, lambda x, tg: LigerCrossEntropyFunction.apply(
                x, tg, None, -100, 0.0, 0.0, "none")), False), nbytes)
        del sets
    ref = split_times.get(0, {})
    score = {s: gmean([v[w] / ref[w] for w in v if w in ref]) for s, v in split_times.items()}
    split = min(score, key=score.get)
    chosen = {**base, "VOCAB_SPLIT": split}
    RESULTS["chosen"]["logprob"] = chosen
    RESULTS["chosen"]["logprob_split_gmean_vs_nosplit"] = score
    print("logprob chosen", chosen, flush=True)
    logprob_consistency(chosen, label="chosen:" + tag(chosen))


# ---------------------------------------------------------------- moe_routing
def routing_consistency(knobs: dict, label: str | None = None):
    E, K = 128, 8
    impl = load("moe_routing", knobs)
    T = SIZES["routing_rows"]
    x = randn((T, E), 3, 0.3)  # small scale: many bf16 ties
    outs = (torch.empty((T, K), dtype=torch.bfloat16, device=DEVICE),
            torch.empty((T, K), dtype=torch.int32, device=DEVICE),
            torch.empty((T, K), dtype=torch.float32, device=DEVICE))
    impl.moe_routing_full(x, *outs)
    bad = 0
    for b in SIZES["routing_bs"]:
        rows = torch.randperm(T, device=DEVICE)[:b].sort().values
        d = (torch.empty((b, K), dtype=torch.bfloat16, device=DEVICE),
             torch.empty((b, K), dtype=torch.int32, device=DEVICE),
             torch.empty((b, K), dtype=torch.float32, device=DEVICE))
        impl.moe_routing_decode(x[rows].contiguous(), *d)
        bad += sum(mismatches(a, o[rows]) for a, o in zip(d, outs))
    p = torch.softmax(x.double(), -1)
    ref_v, ref_i = torch.sort(p, dim=-1, descending=True, stable=True)
    ref_v = ref_v[:, :K] / ref_v[:, :K].sum(-1, keepdim=True)
    RESULTS["consistency"].append({
        "family": "moe_routing", "impl": label or tag(knobs), "decode_vs_full_mismatches": bad,
        "ids_vs_fp64_stable_topk_mismatches": int((outs[1].long() != ref_i[:, :K]).sum()),
        "weights_rel_l2_vs_fp64": float((outs[2].double() - ref_v).norm() / ref_v.norm())})
    return bad == 0


# Root: logit keys on a grouped tile, 4 tokens per warp, weights renormalised from the logits (no whole-row exp
# and sum). The probability form, wider tiles and the first root (max + argmin rounds, flat tile) to compare.
ROUTING_SWEEP = [{}, {"RENORM_FROM": "probs"}, {"BLOCK_T": 8}, {"BLOCK_T": 16},
                 {"SELECT": "rounds", "EXPERT_GROUP": 0, "RENORM_FROM": "probs"}]


@guard("moe_routing")
def bench_routing(full_ts, decode_bs, compile_ts, sweep=None, check_all=False):
    E, K = 128, 8
    compiled = torch.compile(routing_torch, dynamic=False)
    copy_bw = RESULTS["ceilings"].get("copy_TBps", 0)
    sweep = ROUTING_SWEEP if sweep is None else sweep
    if check_all:  # every variant's bits before any timing (cheap: one 32K-token pass and six decode batches)
        sweep = [kn for kn in sweep if not kn or routing_consistency(kn)]
    per_cfg: dict = {}
    for t_rows in full_ts + decode_bs:
        nbytes = t_rows * E * 2 + t_rows * K * (2 + 4 + 4)
        sets = rotating(lambda i: (randn((t_rows, E), 200 + i),), t_rows * E * 2, 256 << 20, 32)
        w = torch.empty((t_rows, K), dtype=torch.bfloat16, device=DEVICE)
        w32 = torch.empty((t_rows, K), dtype=torch.float32, device=DEVICE)
        ids = torch.empty((t_rows, K), dtype=torch.int32, device=DEVICE)
        wl = f"{'decode.B' if t_rows <= 256 else 'full.T'}{t_rows}.E{E}.k{K}"

        def rec(name, t):
            record("moe_routing", wl, name, t, bw_TBps=nbytes / t / 1e12,
                   pct_copy=nbytes / t / 1e12 / copy_bw if copy_bw else None)

        rec("copy_same_bytes", copy_time(nbytes // 2, True))
        for kn in sweep:
            impl = load("moe_routing", kn)
            fn = impl.moe_routing_decode if t_rows <= 256 else impl.moe_routing_full
            t = timeit(cycler(sets, lambda x, fn=fn: fn(x, w, ids, w32)), True)
            per_cfg.setdefault(tag(kn), {})[wl] = t
            rec(tag(kn), t)
        # each extra implementation right after the sweep, whose {} is the root (or the root first, if it is not)
        for spec in EXTRAS.get("moe_routing", []) if {} in sweep else with_root("moe_routing"):
            def run(spec=spec):
                fn = getattr(load("moe_routing", spec), "moe_routing_decode" if t_rows <= 256 else "moe_routing_full")
                return timeit(cycler(sets, lambda x: fn(x, w, ids, w32)), True)
            t = guarded(f"moe_routing {tag(spec)} {wl}", run)
            if t is not None:
                rec(tag(spec), t)
        rec("torch_eager", timeit(cycler(sets, lambda x: routing_torch(x)), True))
        if t_rows in compile_ts:
            rec("torch_compile", timeit(cycler(sets, lambda x: compiled(x)), True))
    score = {c: gmean(v.values()) for c, v in per_cfg.items()}
    best = min(score, key=score.get)
    chosen = next(kn for kn in sweep if tag(kn) == best)
    RESULTS["chosen"]["moe_routing"] = chosen
    print("moe_routing chosen", chosen, flush=True)
    if chosen and not check_all:
        routing_consistency(chosen, label="chosen:" + tag(chosen))


def _dry_run_setup() -> None:
    """A CPU run under the Triton interpreter at tiny sizes (every code path, no measurement): for CI and for
    checking a change before a GPU session."""
    global DEVICE, LINEAR_SHAPES
    from tik_evo import interp

    interp.install()
    DEVICE = "cpu"
    LINEAR_SHAPES = [("tiny.qkv", 96, 64), ("tiny.down", 64, 160)]
    del ROUTING_SWEEP[2:], LOGPROB_SWEEP[2:]  # two of each sweep: the loops run, the interpreter's time stays short
    SIZES.update({"copy": 1 << 16, "matmul": 64, "linear_rows": 300, "linear_prefix": 100, "linear_ms": (1, 3, 7),
                  "vocab": 1000, "logprob_rows": 300, "logprob_prefix": 70, "logprob_ref": 16, "logprob_bs": (1, 5),
                  "logprob_sweep_rows": 280, "routing_rows": 300, "routing_bs": (1, 7), "full_ms": (300,),
                  "decode_ms": (1, 3), "logprob_full": (290,), "routing_full": (300,)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="matmul_gpu.json")
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop timing after this many seconds")
    ap.add_argument("--compile-logprob", type=int, nargs="*", default=[4096], help="token counts to torch.compile")
    ap.add_argument("--compile-routing", type=int, nargs="*", default=[32768], help="token counts to torch.compile")
    ap.add_argument("--linear-variants", type=Path, default=None,
                    help="JSON {name: knob changes}: time only these linear decode variants (bits checked first)")
    ap.add_argument("--full-ab-ms", type=int, nargs="+", default=[4096, 16384],
                    help="rows of the full-path A/B's cells (--linear-full-ab)")
    ap.add_argument("--linear-full-ms", type=int, nargs="*", default=[4096],
                    help="rows of the full-path launches timed for each variant's full-path knobs")
    ap.add_argument("--linear-full-ab", type=Path, default=None,
                    help="JSON {name: knob changes}: interleaved full-path timing of these variants vs cuBLAS")
    ap.add_argument("--repeats", type=int, default=5, help="repeats of --linear-full-ab")
    ap.add_argument("--routing-variants", type=Path, default=None,
                    help="JSON [knob changes, ...]: the moe_routing sweep to time instead of the built-in one "
                         "(every variant bit-checked first; a failing one is not timed)")
    ap.add_argument("--families", default="linear,logprob,moe_routing",
                    help="comma-separated families to check and time (default: all three)")
    ap.add_argument("--extras", type=json.loads, default={},
                    help="JSON {family: {label: kernel file}}: check these and time them beside the root")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, the Triton interpreter, tiny sizes: exercises every code path, measures nothing")
    args = ap.parse_args(argv)
    if args.dry_run:
        _dry_run_setup()
    elif DEVICE == "cuda" and not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (--dry-run runs its code on the CPU)")
        return 2
    fams = set(args.families.split(","))
    for value in RESULTS.values():  # a fresh record for each run in this process
        value.clear()
    ROWS.clear()
    EXTRAS.clear()
    for family, files in args.extras.items():
        EXTRAS[family] = [KernelFile(label, path) for label, path in files.items()]
    t0 = time.time()
    DEADLINE[0] = t0 + args.budget_s
    props = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    RESULTS["env"] = {"gpu": props.name if props else "cpu (interpreter dry run)",
                      "sms": props.multi_processor_count if props else None, "torch": torch.__version__,
                      "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(RESULTS["env"], flush=True)
    if args.linear_full_ab:
        RESULTS["env"]["linear_full_ab"] = str(args.linear_full_ab)
        bench_linear_full_ab(json.loads(args.linear_full_ab.read_text()), full_ms=tuple(args.full_ab_ms),
                             repeats=args.repeats)
    elif args.linear_variants:
        RESULTS["env"]["linear_variants"] = str(args.linear_variants)
        bench_linear_variants(json.loads(args.linear_variants.read_text()), full_ms=tuple(args.linear_full_ms))
    else:
        ceilings()
        checks = {"linear": linear_consistency, "logprob": logprob_consistency, "moe_routing": routing_consistency}
        for fam in (f for f in checks if f in fams):
            guard(f"{fam} consistency")(checks[fam])({})
            for f in EXTRAS.get(fam, []):  # an implementation from elsewhere is always checked on this GPU
                guard(f"{fam} consistency {f.label}")(checks[fam])(f)
        if "linear" in fams:
            bench_linear(list(SIZES["full_ms"]), list(SIZES["decode_ms"]))
        # torch.compile peers were timed in the first run (compile time is too dear for a second lease).
        if "logprob" in fams:
            bench_logprob(list(SIZES["logprob_full"]), list(SIZES["decode_ms"]), eager_max=SIZES["logprob_full"][0],
                          compile_ts=args.compile_logprob if DEVICE == "cuda" else [])
        if "moe_routing" in fams:
            sweep = json.loads(args.routing_variants.read_text()) if args.routing_variants else None
            bench_routing(list(SIZES["routing_full"]), list(SIZES["decode_ms"]),
                          compile_ts=args.compile_routing if DEVICE == "cuda" else [], sweep=sweep,
                          check_all=sweep is not None)
    summarize_extras()
    RESULTS["env"]["wall_s"] = time.time() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(RESULTS, indent=1))
    print(f"\n{'family':<12}{'workload':<24}{'impl':<58}{'us':>9}  metric")
    for fam, wl, impl, us, metric in ROWS:
        extra = " ".join(f"{k}={v:.3g}" for k, v in metric.items() if isinstance(v, float) and k != "pct_matmul_peak")
        print(f"{fam:<12}{wl:<24}{impl[:57]:<58}{us:>9.2f}  {extra}")
    print("\nconsistency:")
    for c in RESULTS["consistency"]:
        print(" ", {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in c.items() if k != "shapes"})
    print("chosen:", json.dumps({k: v for k, v in RESULTS["chosen"].items()}))
    for family, per in RESULTS["extras"].items():
        for label, e in per.items():
            g = e["gmean_vs_root"]
            print(f"{family} {label}: time over the root's, geomean {g:.3f} over {len(e['vs_root'])} cells" if g
                  else f"{family} {label}: not timed (see errors)")
    print(f"errors: {[e['section'] + ': ' + e['error'][:200] for e in RESULTS['errors']]}; "
          f"wall {RESULTS['env']['wall_s']:.0f}s; json {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
