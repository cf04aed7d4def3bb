"""`tik-evo bench attention`: bitwise checks and timings of the root (and knob variants) against torch SDPA.

Run on a GPU. For every variant: every consistency case of the family at level "full" (bitwise, bf16 and
pre-cast fp32), then prefill / train_forward timed against SDPA's cuDNN and flash backends (CUDA events, `ms`,
one implementation after another; and CUDA-graph replays, `graph_ms`, a cell's graphs replayed in rounds of
rotating order), the grid's packed training batches (`prefill_packed`) against torch's varlen flash attention,
and decode timed as CUDA-graph replays against default SDPA, on the same inputs. Decode and the
short prefill cells (at most EAGER_MAX_MS by events) also get `eager_us`: the wall time per call of calls made
back to back, what a caller without CUDA graphs sees (the larger of host and GPU time). Also measures the
copy-bandwidth and bf16 matmul ceilings. Writes one JSON file and prints a table last. Needs torch, triton and
numpy only.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import math
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tik_evo import checks
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.timing import capture_graph, graph_replay_us, replay_us
from tik_evo_kernels.attention.autograd import varlen_flash
from tik_evo_kernels.attention.family import AttentionFamily

FAMILY = AttentionFamily()

# Grid subset (the paper grid is 32 q heads, 8 kv heads, head dim 128): the cells the targets name plus a spread.
PREFILL_CELLS = [("prefill", 1, 16384), ("prefill", 1, 1024), ("prefill", 1, 4096), ("prefill", 1, 8192),
                 ("prefill", 8, 4096), ("prefill", 16, 16384), ("train_forward", 1, 16384 + 128),
                 ("train_forward", 4, 4096 + 128)]
DECODE_CELLS = [(1, 8192), (1, 128), (1, 1024), (1, 4096), (4, 8192), (16, 1024), (16, 8192)]
HQ, HKV, D = 32, 8, 128

# The family's named sets (kernels/attention/sets.yaml), timed by `--variants NAME`.
VARIANTS: dict[str, dict[str, Any]] = FAMILY.named_sets()
# A wider sweep (--sweep): prefill-schedule variants (timed on prefill cells) and decode-schedule variants
# (timed on decode cells); "x_" variants are timed on both.
SWEEP: dict[str, dict[str, Any]] = {
    "x_root": {},
    "x_nosplit_s3": {"SPLIT_TOKENS": 0, "FULL_NUM_STAGES": 3},
    "x_split1024_flat_s3": {"SPLIT_TOKENS": 1024, "FULL_NUM_STAGES": 3, "DECODE_NUM_STAGES": 3},
    "x_split1024_nested_s3": {"SPLIT_TOKENS": 1024, "FULL_SPLIT_LOOP": "nested", "FULL_NUM_STAGES": 3,
                              "DECODE_NUM_STAGES": 3},
    "x_split512_flat_s3": {"SPLIT_TOKENS": 512, "FULL_NUM_STAGES": 3, "DECODE_NUM_STAGES": 3},
    "p_split2048_flat_s3": {"SPLIT_TOKENS": 2048, "FULL_NUM_STAGES": 3},
    "p_split1024_flat_s4": {"SPLIT_TOKENS": 1024, "FULL_NUM_STAGES": 4},
    "p_split1024_bm64_w4_s3": {"SPLIT_TOKENS": 1024, "BLOCK_M": 64, "FULL_NUM_WARPS": 4, "FULL_NUM_STAGES": 3},
    "p_bn128_split1024_s3": {"BLOCK_N": 128, "SPLIT_TOKENS": 1024, "FULL_NUM_STAGES": 3},
    "d_split256_s3": {"SPLIT_TOKENS": 256, "DECODE_NUM_STAGES": 3},
    "d_split256_s4": {"SPLIT_TOKENS": 256, "DECODE_NUM_STAGES": 4},
    "d_split512_s4": {"SPLIT_TOKENS": 512, "DECODE_NUM_STAGES": 4},
    "d_split512_w8_s3": {"SPLIT_TOKENS": 512, "DECODE_NUM_WARPS": 8, "DECODE_NUM_STAGES": 3},
    "d_split1024_s4": {"SPLIT_TOKENS": 1024, "DECODE_NUM_STAGES": 4},
    "d_split512_unpacked_s3": {"SPLIT_TOKENS": 512, "DECODE_PACK_GQA": False, "DECODE_NUM_STAGES": 3},
    "d_bn32_split256_s4": {"BLOCK_N": 32, "SPLIT_TOKENS": 256, "DECODE_NUM_STAGES": 4},
}
SWEEP_CHECKS = ("x_root", "x_split1024_flat_s3", "x_split1024_nested_s3", "d_split256_s4", "p_bn128_split1024_s3")


def load_variant(name: str, changes: dict[str, Any], folder: Path, source: str | None = None):
    """Write ``source`` (default: the root) with ``changes`` applied to KNOBS as a real file (Triton needs one)
    and import it."""
    FAMILY.check_knobs(changes, f"attention variant {name!r}")
    source = FAMILY.root_source() if source is None else source
    knobs = {**read_knobs(source), **changes}
    path = folder / f"attention_{name}.py"
    path.write_text(write_knobs(source, knobs))
    spec = importlib.util.spec_from_file_location(f"attention_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, knobs


def ceilings() -> dict[str, float]:
    from triton.testing import do_bench

    x = torch.randn(1 << 28, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=25, rep=200, return_mode="median")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return {"copy_TBps": 2 * x.numel() * 2 / ms / 1e9, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm / 1e9}


def graph_time_us(fn: Callable[[int], None], n_sets: int, **plan: int) -> float:
    """Median time of one call, from CUDA-graph replays of 20 calls (or ``plan``'s) cycling over the input sets."""
    return graph_replay_us(checks.rotate(fn, list(range(n_sets))), **plan)


# Prefill's graph timing: extra input sets up to this many bytes, so consecutive replayed calls read memory the
# L2 (60 MB) no longer holds, as do_bench's flush ensures. Cells whose one set passes half of it (B16 S16K: 3 GB)
# get no copy: they read several times the L2 per call anyway, and a second set would cost gigabytes.
PREFILL_SETS_BYTES = 512 << 20
GRAPH_REPLAY_MS = 2.0  # calls per captured graph: about this much GPU time per replay, so one graph launch is noise
GRAPH_BUDGET_MS = 50.0  # timed replays: about this much GPU time per implementation and cell (5 at least)


def graph_plan(ms: float, n_sets: int = 1) -> dict[str, int]:
    """graph_replay_us's calls, replays and warm-ups for a call of ``ms`` (its event timing): 20 calls x 30 replays
    for the short cells; one call, 5 replays and 1 warm-up for a B16 S16K call (~60 ms), 7 calls instead of 663.
    At least one call per input set, so replays never re-read the set the last one did."""
    calls = min(20, max(1, n_sets, round(GRAPH_REPLAY_MS / ms)))
    replays = min(30, max(5, round(GRAPH_BUDGET_MS / (calls * ms))))
    return {"calls": calls, "replays": replays, "warmup": 3 if calls * ms < 10 else 1}


GRAPH_ROUNDS = 5  # prefill: a cell's graphs replayed in this many rounds, the order rotating each round


def interleaved_graph_fields(jobs: list[tuple[dict, Callable[[int], None], int, float]],
                             rounds: int = GRAPH_ROUNDS) -> None:
    """Graph figures of one cell's implementations, jobs (row, fn, input sets, event ms): each captured once with
    its `graph_plan`, then all replayed in `rounds` rounds, each round in a rotated order and with 1/rounds of the
    plan's replays; ``graph_ms`` is the median of the rounds' per-call times. Implementations timed one after
    another drift with the GPU's clock by as much as they differ (the same kernel read 0.81 and 0.89x cuDNN in one
    H200 run); rounds spread that drift over all of them. A job that cannot be captured (a backend that syncs,
    say) gets ``graph_error`` instead; the event figure stands either way."""
    graphs = {}
    for i, (row, fn, n_sets, ms) in enumerate(jobs):
        plan = graph_plan(ms, n_sets)
        try:
            graphs[i] = (capture_graph(checks.rotate(fn, list(range(n_sets))), plan["calls"], plan["warmup"]), plan)
        except Exception as e:  # noqa: BLE001 - an uncapturable implementation is a result, not a crash
            row["graph_error"] = repr(e)[:300]
    order = list(graphs)
    times: dict[int, list[float]] = {i: [] for i in order}
    for r in range(rounds if order else 0):
        for i in order[r % len(order):] + order[:r % len(order)]:
            graph, plan = graphs[i]
            times[i].append(replay_us(graph, max(1, plan["replays"] // rounds), plan["calls"]))
    for i, (_graph, plan) in graphs.items():
        jobs[i][0].update({"graph_ms": statistics.median(times[i]) / 1e3, "graph_calls": plan["calls"],
                           "graph_replays": max(1, plan["replays"] // rounds) * rounds, "graph_rounds": rounds,
                           "graph_round_ms": [t / 1e3 for t in times[i]]})


def n_prefill_sets(B: int, S: int) -> int:
    """Input sets of a prefill cell: up to 8 within PREFILL_SETS_BYTES, one for cells past half of it."""
    return max(1, min(8, PREFILL_SETS_BYTES // (B * (HQ + 2 * HKV) * S * D * 2)))


def prefill_sets(B: int, S: int) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v) input sets of one cell on the GPU: set 0 drawn first (the event timings' inputs, the same as
    before graph timing existed), then the graph timing's extra sets."""
    gen = torch.Generator(device="cuda").manual_seed(B * 100003 + S)

    def draw() -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn((B, h, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
                     for h in (HQ, HKV, HKV))

    return [draw() for _ in range(n_prefill_sets(B, S))]


def _sdpa(backend: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend])


def time_prefill(modules: dict[str, Any], phase: str, B: int, S: int, rows: list[dict],
                 keep: dict[str, torch.Tensor] | None = None) -> None:
    """Time cuDNN/flash SDPA and every module's prefill on one cell's inputs, by CUDA events (``ms``) and by
    CUDA-graph replays (``graph_ms``); `keep` collects each module's output (for bit comparisons between
    implementations)."""
    sets = prefill_sets(B, S)
    q, k, v = sets[0]
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(D)
    flops = 4 * B * HQ * D * S * (S + 1) / 2
    base = {"phase": phase, "cell": f"{phase} B{B} S{S}"}
    ref = None
    jobs: list[tuple[dict, Callable[[int], None], int, float]] = []  # graph timing, interleaved at the end
    for backend in ("cudnn", "flash"):  # the last that runs is the reference of rel_l2_vs_sdpa
        peer_out = _time_peer(backend, sets, scale, flops, base, rows, jobs)
        ref = ref if peer_out is None else peer_out
    for name, mod in modules.items():
        row = {**base, "impl": name}
        rows.append(row)
        try:
            mod.prefill(q, k, v, scale, out)
            if keep is not None:
                keep[name] = out.clone()
            ms = _event_ms(functools.partial(mod.prefill, q, k, v, scale, out))
            # Before the graph timing, which leaves another input set's output in `out`.
            err = float((out.float() - ref.float()).norm() / ref.float().norm()) if ref is not None else None
            row.update({"ms": ms, "TFLOPs": flops / ms / 1e9, "rel_l2_vs_sdpa": err})
            if ms <= EAGER_MAX_MS:
                row["eager_us"] = eager_us(functools.partial(mod.prefill, q, k, v, scale, out))
        except Exception as e:  # noqa: BLE001
            row["error"] = repr(e)[:300]
            continue
        jobs.append((row, lambda i, mod=mod: mod.prefill(*sets[i], scale, out), len(sets), ms))
    interleaved_graph_fields(jobs)


EAGER_CALLS = 200
EAGER_MAX_MS = 0.5  # prefill cells longer than this by events are GPU-bound: their eager time is their GPU time


def eager_us(fn: Callable[[], Any], calls: int = EAGER_CALLS) -> float:
    """Wall time per call of `calls` calls back to back, one synchronisation at the end (after 10 warm-up calls)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _event_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def _time_peer(backend: str, sets: list[tuple[torch.Tensor, ...]], scale: float, flops: float,
               base: dict[str, Any], rows: list[dict], jobs: list) -> torch.Tensor | None:
    """Time one SDPA backend on set 0 by events, append its row and its graph job (`interleaved_graph_fields`) and
    return its output (None if the backend failed)."""
    F = torch.nn.functional
    row = {**base, "impl": f"sdpa_{backend}"}
    rows.append(row)
    peer_sets = sets

    def call(i: int) -> torch.Tensor:
        return F.scaled_dot_product_attention(*peer_sets[i], is_causal=True, scale=scale, enable_gqa=True)

    try:
        with _sdpa(backend):
            try:
                ref = call(0)
            except RuntimeError:  # backend without GQA: expand K/V outside the timed region, of set 0 only
                q, k, v = sets[0]  # (expanding every set would take 4x their K/V memory)
                peer_sets = [(q, k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1))]
                ref = call(0)
            ms = _event_ms(functools.partial(call, 0))
            row.update({"ms": ms, "TFLOPs": flops / ms / 1e9, "gqa_expanded": peer_sets is not sets})
            if ms <= EAGER_MAX_MS:
                row["eager_us"] = eager_us(functools.partial(call, 0))

        def in_backend(i: int) -> None:  # the backend is chosen per call, so the capture needs it too
            with _sdpa(backend):
                call(i)
        jobs.append((row, in_backend, len(peer_sets), ms))
        return ref
    except Exception as e:  # noqa: BLE001 - a missing backend is a result, not a crash
        row["error"] = repr(e)[:300]
        return None


def time_decode(modules: dict[str, Any], B: int, ctx: int, rows: list[dict]) -> None:
    F = torch.nn.functional
    gen = torch.Generator(device="cuda").manual_seed(B * 7919 + ctx)
    set_bytes = 2 * B * HKV * ctx * D * 2
    n_sets = max(1, min(8, (256 << 20) // set_bytes))
    sets = []
    for _ in range(n_sets):
        sets.append((torch.randn((B, HQ, 1, D), generator=gen, device="cuda", dtype=torch.bfloat16),
                     torch.randn((B, HKV, ctx, D), generator=gen, device="cuda", dtype=torch.bfloat16),
                     torch.randn((B, HKV, ctx, D), generator=gen, device="cuda", dtype=torch.bfloat16),
                     torch.full((B,), ctx, dtype=torch.int32, device="cuda")))
    out = torch.empty((B, HQ, 1, D), device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(D)
    cell = f"decode B{B} ctx{ctx}"

    def peer(i: int) -> None:
        q, k, v, _ = sets[i]
        out.copy_(F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True))

    calls = {"sdpa": peer, **{name: lambda i, mod=mod: mod.decode(*sets[i], scale, out)
                              for name, mod in modules.items()}}
    for name, call in calls.items():
        try:
            us = graph_time_us(call, n_sets)
            rows.append({"phase": "decode", "cell": cell, "impl": name, "us": us, "TBps": set_bytes / us / 1e6,
                         "eager_us": eager_us(functools.partial(call, 0))})
        except Exception as e:  # noqa: BLE001
            rows.append({"phase": "decode", "cell": cell, "impl": name, "error": repr(e)[:300]})


def packed_cells() -> list[tuple[str, list[int]]]:
    """(name, sequence lengths) of the grid's packed training batches (`train_packed` workloads)."""
    import yaml

    grid = yaml.safe_load((Path(__file__).resolve().parents[2] / "workloads" / "attention_grid.yaml").read_text())
    return [(w["name"], w["lengths"]) for w in grid["workloads"] if w["phase"] == "train_packed"]


def time_packed(modules: dict[str, Any], lengths: list[int], rows: list[dict]) -> None:
    """Every module's `prefill_packed` on one packed batch against torch's varlen flash attention, by CUDA events
    (``ms``) and interleaved graph replays (``graph_ms``); ``rel_l2_vs_varlen`` compares the outputs."""
    T, longest = sum(lengths), max(lengths)
    gen = torch.Generator(device="cuda").manual_seed(T)
    n_sets = max(1, min(8, PREFILL_SETS_BYTES // (T * (HQ + 2 * HKV) * D * 2)))
    sets = [tuple(torch.randn((T, h, D), generator=gen, device="cuda", dtype=torch.bfloat16) for h in (HQ, HKV, HKV))
            for _ in range(n_sets)]
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    out = torch.empty_like(sets[0][0])
    scale = 1 / math.sqrt(D)
    flops = sum(4 * HQ * D * n * (n + 1) / 2 for n in lengths)
    base = {"phase": "train_packed", "cell": f"train_packed B{len(lengths)} T{T}"}
    calls = {"varlen_flash": lambda i: varlen_flash(*sets[i], cu, longest, scale),
             **{name: lambda i, mod=mod: mod.prefill_packed(*sets[i], cu, longest, scale, out)
                for name, mod in modules.items()}}
    ref = None
    jobs: list[tuple[dict, Callable[[int], None], int, float]] = []
    for name, call in calls.items():
        row = {**base, "impl": name}
        rows.append(row)
        try:
            got = call(0)
            got = out if got is None else got
            if ref is None and name == "varlen_flash":
                ref = got.float().clone()
            ms = _event_ms(functools.partial(call, 0))
            err = float((got.float() - ref).norm() / ref.norm()) if ref is not None else None
            row.update({"ms": ms, "TFLOPs": flops / ms / 1e9, "rel_l2_vs_varlen": err})
        except Exception as e:  # noqa: BLE001 - a torch without the peer, or a failing module, is a result
            row["error"] = repr(e)[:300]
            continue
        jobs.append((row, call, n_sets, ms))
    interleaved_graph_fields(jobs)


def consistency(mod, seeds: list[int], cases: list[dict]) -> dict[str, Any]:
    result: dict[str, Any] = {"checks": 0, "failed": [], "seconds": 0.0}
    t0 = time.time()
    for case in cases:
        for seed in seeds:
            try:
                for c in FAMILY.run_checks(mod, case, seed, "cuda"):
                    result["checks"] += 1
                    if not c.passed:
                        result["failed"].append(c.to_dict())
            except Exception as e:  # noqa: BLE001
                result["failed"].append({"name": f"crash {case}", "error": repr(e)[:500]})
    result["seconds"] = time.time() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tik-evo bench attention", description=__doc__)
    ap.add_argument("--out", default="attention_bench.json", help="JSON file to write")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variant names")
    ap.add_argument("--sweep", action="store_true", help="run the wider knob sweep instead (fewer cells)")
    ap.add_argument("--variants-json", default=None,
                    help="JSON file {name: {knob: value}} of variants to run instead (the sweep's cells; names "
                         "starting p_ / d_ are timed on prefill / decode cells only, others on both)")
    ap.add_argument("--check-variants", default=None, help="variants to check (default: all timed ones)")
    ap.add_argument("--check-seeds", default="0,1", help="seeds of the root's consistency checks (others: 0)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new work after this")
    ap.add_argument("--quick", action="store_true", help="consistency on the small case only, fewer cells")
    ap.add_argument("--best", metavar="RUN_DIR", default=None,
                    help="also time (and check) the best implementation of an attention run directory")
    ap.add_argument("--kernel", metavar="FILE", action="append", default=[],
                    help="also time (and check) a kernel file, e.g. from `tik-evo kernel attention ... -o FILE` "
                         "(repeatable)")
    ap.add_argument("--grid", action="store_true",
                    help="time every cell of workloads/attention_grid.yaml (48, and the packed batches, which run "
                         "without it too) and report per-phase geomeans against the peers")
    ap.add_argument("--decode-only", action="store_true", help="time the decode cells only (no prefill cells)")
    ap.add_argument("--cells", default=None, metavar="REGEX",
                    help="time only the cells whose name matches (names as printed, e.g. 'S1024|S1152' or "
                         "'decode.B1.ctx': '.' for a space, since gpu_session.sh splits ATTN_ARGS on spaces); the "
                         "geomeans then cover those cells")
    args = ap.parse_args(argv)
    kernel_files = {}
    for f in args.kernel:  # read before anything runs, so a wrong path or file is named at once
        try:
            kernel_files[f"file_{Path(f).stem}"] = source = Path(f).read_text()
            FAMILY.check_knobs(read_knobs(source), "its KNOBS")
        except OSError as e:
            print(f"--kernel {f}: {e.strerror or e}", file=sys.stderr)
            return 2
        except ValueError as e:  # no KNOBS dict, or a knob outside the family's space (KnobsError is one too)
            print(f"--kernel {f}: {e}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("tik-evo bench attention needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    t_start = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    out_path = Path(args.out)
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D},
        "variants": {}, "consistency": {}, "timings": [], "skipped": [],
    }

    def save() -> None:
        out_path.write_text(json.dumps(report, indent=1, default=str))

    def left() -> float:
        return args.budget_s - (time.time() - t_start)

    report["ceilings"] = ceilings()
    print("ceilings", report["ceilings"], flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="attention_variants_"))
    table = SWEEP if args.sweep else VARIANTS
    names = list(SWEEP) if args.sweep else args.variants.split(",")
    if args.variants_json:
        table = json.loads(Path(args.variants_json).read_text())
        names, args.sweep = list(table), True
        sweep_checks = [n for n in names if not n.startswith(("p_", "d_"))]
    else:
        sweep_checks = list(SWEEP_CHECKS)
    modules = {}
    for name in names:
        modules[name], report["variants"][name] = load_variant(name, table[name], tmp)
    checked = [n for n in names if n in sweep_checks] if args.sweep else list(names)
    if args.check_variants is not None:
        checked = [n for n in args.check_variants.split(",") if n]
    if args.best:
        best_id, best_source = best_of(Path(args.best))
        name = f"best_{best_id}"
        modules[name], report["variants"][name] = load_variant(name, {}, tmp, best_source)
        report["best_run"] = {"run_dir": str(args.best), "impl": best_id}
        checked.append(name)  # an implementation from a run is always re-checked on this GPU
    for name, source in kernel_files.items():  # so is a kernel file
        modules[name], report["variants"][name] = load_variant(name, {}, tmp, source)
        checked.append(name)
    prefill_mods = {n: m for n, m in modules.items() if not n.startswith("d_")}
    decode_mods = {n: m for n, m in modules.items() if not n.startswith("p_")}

    cases = FAMILY.check_cases("small" if args.quick else "full")
    root_seeds = [int(x) for x in args.check_seeds.split(",")]
    report["check_seeds"] = {"root": root_seeds, "others": [0]}
    for name in checked:
        if left() < args.budget_s * 0.55:
            report["skipped"].append(f"consistency {name}")
            continue
        report["consistency"][name] = consistency(modules[name], root_seeds if name == "root" else [0], cases)
        r = report["consistency"][name]
        print(f"consistency {name}: {r['checks']} checks, {len(r['failed'])} failed, {r['seconds']:.0f}s",
              flush=True)
        for f in r["failed"][:3]:
            print("   FAIL", f.get("name"), {k: v for k, v in f.get("details", {}).items()
                                          if k in ("mismatches", "positions_mismatched", "rel_l2", "error")},
                  f.get("error", ""), flush=True)
        save()

    decode_cells = DECODE_CELLS[:1] + DECODE_CELLS[4:] if args.sweep else DECODE_CELLS
    if args.grid:
        decode_cells, grid_prefill = grid_cells()
    wanted = re.compile(args.cells).search if args.cells else (lambda name: True)
    decode_cells = [(B, ctx) for B, ctx in decode_cells if wanted(f"decode B{B} ctx{ctx}")]
    for B, ctx in decode_cells:
        if left() < 20:
            report["skipped"].append(f"decode B{B} ctx{ctx}")
            continue
        time_decode(decode_mods, B, ctx, report["timings"])
        torch.cuda.empty_cache()
        save()
    cells = PREFILL_CELLS[:4] if args.quick else PREFILL_CELLS
    if args.sweep:
        cells = [PREFILL_CELLS[0], PREFILL_CELLS[2], PREFILL_CELLS[4], PREFILL_CELLS[6]]
    if args.grid:
        cells = grid_prefill
    if args.decode_only:
        cells = []
    cells = [(phase, B, S) for phase, B, S in cells if wanted(f"{phase} B{B} S{S}")]
    for phase, B, S in cells:
        if left() < 25:
            report["skipped"].append(f"{phase} B{B} S{S}")
            continue
        time_prefill(prefill_mods, phase, B, S, report["timings"])
        torch.cuda.empty_cache()
        save()

    packed = [] if args.decode_only or args.quick else \
        [(name, lens) for name, lens in packed_cells() if wanted(f"train_packed B{len(lens)} T{sum(lens)}")]
    for name, lens in packed:
        if left() < 25:
            report["skipped"].append(name)
            continue
        time_packed(prefill_mods, lens, report["timings"])
        torch.cuda.empty_cache()
        save()

    # The family's own benches (fresh-input verification) on two cells, as the engine would run them.
    for wl in ({"phase": "decode", "batch": 4, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "context": 1000},
               {"phase": "prefill", "batch": 2, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "seq": 3001}):
        bench = FAMILY.make_bench(next(iter(modules.values())), wl, 0, "cuda")
        bench.run()
        report.setdefault("verify", []).append({"workload": wl, "checks": [c.to_dict() for c in bench.verify()]})
    report["seconds"] = time.time() - t_start
    report["geomean_speedup_vs_peer"] = geomeans(report["timings"])
    save()
    print_table(report)
    return 0


def best_of(run_dir: Path) -> tuple[str, str]:
    """(id, source) of the best implementation a run directory holds; it must be an attention run."""
    from tik_evo.store import StoreError
    from tik_evo.store import best_of as store_best_of

    try:
        _, impl_id, source = store_best_of(run_dir, FAMILY.name)
    except StoreError as e:
        raise SystemExit(str(e)) from None
    return impl_id, source


def grid_cells() -> tuple[list[tuple[int, int]], list[tuple[str, int, int]]]:
    """Decode (batch, context) and prefill/train_forward (phase, batch, length) cells of the paper grid (the
    set's packed training batches are not part of it)."""
    import yaml

    grid = yaml.safe_load((Path(__file__).resolve().parents[2] / "workloads" / "attention_grid.yaml").read_text())
    decode, prefill = [], []
    for w in grid["workloads"]:
        assert (w["q_heads"], w["kv_heads"], w["head_dim"]) == (HQ, HKV, D), w["name"]
        if w["phase"] == "decode":
            decode.append((w["batch"], w["context"]))
        elif w["phase"] == "prefill":
            prefill.append(("prefill", w["batch"], w["seq"]))
        elif w["phase"] == "train_forward":
            prefill.append(("train_forward", w["batch"], w["prompt"] + w["answer"]))
    return decode, prefill


PEER_OF = {"prefill": "sdpa_cudnn", "train_forward": "sdpa_cudnn", "train_packed": "varlen_flash", "decode": "sdpa"}


def _figures(phase: str) -> dict[str, str]:
    """Summary key -> timing field of a phase: decode's graph-replay "us"; prefill's and train_forward's event
    "ms", and their graph-replay "graph_ms" under "<phase>_graph"; every phase's back-to-back "eager_us" under
    "<phase>_eager" (over the cells that have it)."""
    main = {phase: "us"} if phase == "decode" else {phase: "ms", f"{phase}_graph": "graph_ms"}
    return {**main, f"{phase}_eager": "eager_us"}


def geomeans(timings: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per summary key (phase, or "<phase>_graph") and implementation: geometric mean over the timed cells of peer
    time / implementation time (> 1: faster than the peer), with "<name>_cells" the cells it covers. Peers: cuDNN
    SDPA for prefill and train_forward, torch's varlen flash for train_packed, default SDPA for decode. A graph
    key also counts, in "<name>_graph_errors", the cells left out because ours or the peer's capture failed
    (graph_error)."""
    by_cell: dict[str, dict[str, dict]] = {}
    for r in timings:
        by_cell.setdefault(r["cell"], {})[r["impl"]] = r
    logs: dict[tuple[str, str], list[float]] = {}
    graph_errors: dict[tuple[str, str], int] = {}
    for impls in by_cell.values():
        for name, r in impls.items():
            if name.startswith("sdpa") or name == "varlen_flash":
                continue
            peer = impls.get(PEER_OF[r["phase"]], {})
            for key, unit in _figures(r["phase"]).items():
                if unit in r and unit in peer:
                    logs.setdefault((key, name), []).append(math.log(peer[unit] / r[unit]))
                elif unit == "graph_ms" and ("graph_error" in r or "graph_error" in peer):
                    graph_errors[(key, name)] = graph_errors.get((key, name), 0) + 1
    out: dict[str, dict[str, float]] = {}
    for (key, name), xs in logs.items():
        out.setdefault(key, {})[name] = math.exp(sum(xs) / len(xs))
        out[key][name + "_cells"] = len(xs)
    for (key, name), n in graph_errors.items():
        out.setdefault(key, {})[name + "_graph_errors"] = n
    return out


def geomean_parts(g: dict[str, float]) -> list[str]:
    """One summary key's geomeans as "name=0.861 over 16 cells" (", 2 without a graph time" where captures
    failed; "name=none" where every one did)."""
    names = dict.fromkeys(k.removesuffix("_cells").removesuffix("_graph_errors") for k in g
                          if k.endswith(("_cells", "_graph_errors")))
    parts = []
    for n in names:
        part = f"{n}={g[n]:.3f} over {g[n + '_cells']} cells" if n in g else f"{n}=none"
        if g.get(n + "_graph_errors"):
            part += f", {g[n + '_graph_errors']} without a graph time"
        parts.append(part)
    return parts


def cell_lines(cell: str, impls: dict[str, dict[str, Any]]) -> list[str]:
    """A cell's printed timings: one line of its main figure (us for decode, event ms otherwise), and for
    prefill/train_forward a second of graph ms where any row has a graph figure (ERR: failed or not captured)."""
    unit = "us" if cell.startswith("decode") else "ms"
    lines = [f"{cell:28s} {unit}: " + " ".join(f"{n}={r[unit]:.3g}" if unit in r else f"{n}=ERR"
                                               for n, r in impls.items())]
    if any("graph_ms" in r or "graph_error" in r for r in impls.values()):
        lines.append(f"{'':28s} graph ms: " + " ".join(f"{n}={r['graph_ms']:.3g}" if "graph_ms" in r else f"{n}=ERR"
                                                        for n, r in impls.items()))
    if any("eager_us" in r for r in impls.values()):
        lines.append(f"{'':28s} eager us: " + " ".join(f"{n}={r['eager_us']:.3g}" if "eager_us" in r else f"{n}=-"
                                                        for n, r in impls.items()))
    return lines


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['gpu']} torch {report['torch']} triton {report['triton']}  ceilings: "
          f"copy {report['ceilings']['copy_TBps']:.2f} TB/s, bf16 mm {report['ceilings']['bf16_matmul_TFLOPs']:.0f} "
          "TFLOP/s")
    for name, r in report["consistency"].items():
        print(f"consistency {name:16s} {r['checks'] - len(r['failed'])}/{r['checks']} passed")
    by_cell: dict[str, dict[str, Any]] = {}
    for row in report["timings"]:
        by_cell.setdefault(row["cell"], {})[row["impl"]] = row
    for cell, impls in by_cell.items():
        print("\n".join(cell_lines(cell, impls)))
    for key, g in report.get("geomean_speedup_vs_peer", {}).items():
        print(f"geomean peer/ours {key:19s} " + " ".join(geomean_parts(g)))
    for v in report.get("verify", []):
        print("verify", v["workload"]["phase"], all(c["passed"] for c in v["checks"]))
    if report["skipped"]:
        print("skipped:", report["skipped"])


if __name__ == "__main__":
    raise SystemExit(main())
