"""Attention's decode from a paged KV cache (`decode_paged`) against the same decode from a contiguous cache, torch
SDPA, and flash-attn's `flash_attn_with_kvcache` on the same pages with a block table.

Cells: 32 query / 8 KV heads / head dim 128 at batch 1, 4, 16, 64 and context 1K, 4K, 8K, 32K, and two GQA shapes
with fewer KV heads (32/4 and 32/2) at batch 4 and 64, context 8K and 32K; every sequence of a cell has the cell's
context. For each variant (--variants: the root or named sets of kernels/attention/sets.yaml) and page size
(--page-sizes), the cell's caches are dealt into pages in a shuffled order, as a serving engine's end up, and
- the paged output must equal the contiguous one bit for bit (bf16 and the fp32 pre-cast values), checked first;
- `decode_paged`, `decode` on the contiguous caches, SDPA on them and flash-attn on the pages are timed as CUDA-graph
  replays (median per call; small cells rotate over input copies so the L2 does not flatter them).
flash-attn is timed where it imports (`flash_attn_interface`, else `flash_attn`) and takes the page size (FA2 asks
for multiples of 256); otherwise the JSON and the table say why not. With a variant whose decode runs on the Gluon
kernel (DECODE_IMPL "gluon_ws"), the paged path runs the Triton decode (same bits): `paged_impl` says so.
Writes JSON (date, GPU, versions, every figure) to --out and prints a table.

    tik-evo bench paged-decode --out results/attention/paged_decode.json
    tik-evo bench paged-decode --variants root,hopper_bn128_tma_s1024 --page-sizes 16,256 --out x.json
    tik-evo bench paged-decode --smoke --out x.json   # tiny shapes on the CPU interpreter: the code, not speed
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from tik_evo import checks  # noqa: E402
from tik_evo_bench.common import header, write_json  # noqa: E402

# (q_heads, kv_heads, head_dim), batch, context
CELLS = [((32, 8, 128), B, ctx) for B in (1, 4, 16, 64) for ctx in (1024, 4096, 8192, 32768)] + \
    [((32, kv, 128), B, ctx) for kv in (4, 2) for B in (4, 64) for ctx in (8192, 32768)]
PAGE_SIZES = (16, 256)  # vLLM's default block, and flash-attn 2's smallest paged block
SMOKE_CELLS = [((4, 2, 64), 2, 45)]
SMOKE_PAGE_SIZES = (16,)
SETS_BYTES = 256 << 20  # input copies of a cell up to this many bytes (one copy past half of it)


def flash_attn_kvcache() -> tuple[Any, str]:
    """(flash_attn_with_kvcache, "module version") of flash-attn 3's interface or flash-attn 2, or (None, why not)."""
    import importlib

    why = []
    for name in ("flash_attn_interface", "flash_attn"):
        try:
            mod = importlib.import_module(name)
            return mod.flash_attn_with_kvcache, f"{name} {getattr(mod, '__version__', '(no version)')}"
        except Exception as e:  # noqa: BLE001 - missing or broken: the reason is the result
            why.append(f"{name}: {type(e).__name__}: {e}"[:200])
    return None, "not importable (" + "; ".join(why) + ")"


def _table_arg(fa) -> str:
    """The block table's keyword: flash-attn 2 calls it block_table, flash-attn 3 page_table."""
    params = inspect.signature(fa).parameters
    return "block_table" if "block_table" in params else "page_table"


def _time_us(call, n_sets: int, smoke: bool) -> float:
    """Median microseconds per call of call(i) (i: the input copy) from CUDA-graph replays, as many calls a graph
    and replays as bound its GPU time; under the interpreter one call's wall clock (meaningless as speed)."""
    if smoke:
        t0 = time.perf_counter()
        call(0)
        return (time.perf_counter() - t0) * 1e6
    from tik_evo_kernels.attention.bench import graph_plan, graph_time_us

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call(0)
    start.record()
    call(0)
    end.record()
    end.synchronize()
    return graph_time_us(call, n_sets, **graph_plan(start.elapsed_time(end), n_sets))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(checks.bits(a), checks.bits(b)))


def run_cell(modules: dict[str, Any], heads: tuple[int, int, int], B: int, ctx: int, page_sizes: tuple[int, ...],
             fa, smoke: bool, device: str) -> tuple[list[dict], list[dict]]:
    """One cell: (timing rows, bit checks)."""
    from tik_evo_kernels.attention.family import paged_cache

    HQ, HKV, D = heads
    cell = f"HQ{HQ} HKV{HKV} D{D} B{B} ctx{ctx}"
    set_bytes = 2 * B * HKV * ctx * D * 2
    n_sets = 1 if smoke else max(1, min(8, SETS_BYTES // set_bytes))
    g = torch.Generator(device=device).manual_seed(B * 7919 + ctx * 31 + HKV)
    sets = [tuple(torch.randn(s, generator=g, device=device, dtype=torch.bfloat16)
                  for s in ((B, HQ, 1, D), (B, HKV, ctx, D), (B, HKV, ctx, D))) for _ in range(n_sets)]
    lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    scale = 1 / math.sqrt(D)
    out = torch.empty((B, HQ, 1, D), dtype=torch.bfloat16, device=device)
    rows: list[dict] = []
    bits: list[dict] = []
    base = {"cell": cell, "q_heads": HQ, "kv_heads": HKV, "head_dim": D, "batch": B, "context": ctx}

    def timed(impl: str, call, **extra) -> None:
        row = {**base, "impl": impl, **extra}
        rows.append(row)
        try:
            us = _time_us(call, n_sets, smoke)
            row.update({"us": us, "TBps": set_bytes / us / 1e6})
        except Exception as e:  # noqa: BLE001 - a peer or variant that fails (memory, capture) is a result
            row["error"] = f"{type(e).__name__}: {e}"[:300]

    F = torch.nn.functional
    table_kw = _table_arg(fa) if fa is not None else None
    timed("sdpa", lambda i: out.copy_(F.scaled_dot_product_attention(*sets[i], scale=scale, enable_gqa=True)))
    sdpa = F.scaled_dot_product_attention(*sets[0], scale=scale, enable_gqa=True).float()
    for name, mod in modules.items():
        timed(f"{name}.contiguous", lambda i, mod=mod: mod.decode(*sets[i], lens, scale, out))
    for page in page_sizes:
        cg = torch.Generator().manual_seed(page)
        pages = [paged_cache(kc, vc, lens, page, cg, wider=0) for _, kc, vc in sets]
        for name, mod in modules.items():
            want, want32 = torch.empty_like(out), torch.empty((B, HQ, 1, D), device=device)
            got, got32 = torch.empty_like(out), torch.empty_like(want32)
            check = {**base, "variant": name, "page_size": page}
            try:
                mod.decode(*sets[0], lens, scale, want, want32)
                mod.decode_paged(sets[0][0], *pages[0], lens, scale, got, got32)
                check.update({"bf16_equal": _bits_equal(got, want), "fp32_equal": _bits_equal(got32, want32),
                              "rel_l2_vs_sdpa": float((got.float() - sdpa).norm() / sdpa.norm())})
            except Exception as e:  # noqa: BLE001
                check["error"] = f"{type(e).__name__}: {e}"[:300]
            bits.append(check)
            timed(f"{name}.paged{page}",
                  lambda i, mod=mod, pages=pages: mod.decode_paged(sets[i][0], *pages[i], lens, scale, out),
                  page_size=page, paged_impl=_paged_impl(mod))
        if fa is not None:
            timed(f"flash_attn.paged{page}", lambda i, pages=pages: out.copy_(fa(
                sets[i][0].view(B, 1, HQ, D), pages[i][0], pages[i][1], cache_seqlens=lens,
                **{table_kw: pages[i][2]}, softmax_scale=scale, causal=True).view(B, HQ, 1, D)), page_size=page)
        del pages
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows, bits


def _paged_impl(mod) -> str:
    return "triton (the Gluon decode reads contiguous caches only)" if mod.KNOBS["DECODE_IMPL"] == "gluon_ws" \
        else "triton"


def summary(rows: list[dict]) -> dict[str, dict[str, Any]]:
    """Per timed implementation: the geometric mean over cells of its time against the cell's contiguous decode of
    the same variant (paged rows), SDPA's, and flash-attn's at the same page size; and the cells it covers."""
    by_cell: dict[str, dict[str, dict]] = {}
    for r in rows:
        if "us" in r:
            by_cell.setdefault(r["cell"], {})[r["impl"]] = r
    logs: dict[tuple[str, str], list[float]] = {}
    for impls in by_cell.values():
        for name, r in impls.items():
            peers = {"sdpa": impls.get("sdpa")}
            if "page_size" in r and not name.startswith("flash_attn"):
                peers["contiguous"] = impls.get(name.split(".")[0] + ".contiguous")
                peers["flash_attn"] = impls.get(f"flash_attn.paged{r['page_size']}")
            for peer, p in peers.items():
                if p is not None and p is not r:
                    logs.setdefault((name, peer), []).append(math.log(r["us"] / p["us"]))
    out: dict[str, dict[str, Any]] = {}
    for (name, peer), xs in logs.items():
        out.setdefault(name, {})[f"time_x_{peer}"] = math.exp(sum(xs) / len(xs))
        out[name][f"cells_vs_{peer}"] = len(xs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tik-evo bench paged-decode", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="paged_decode.json", help="the JSON results")
    ap.add_argument("--variants", default="root", help="comma-separated named sets of kernels/attention/sets.yaml")
    ap.add_argument("--page-sizes", default=None,
                    help=f"comma-separated keys per page (default {','.join(map(str, PAGE_SIZES))}; --smoke: "
                         f"{','.join(map(str, SMOKE_PAGE_SIZES))})")
    ap.add_argument("--cells", default=None, help="only cells whose name contains this (e.g. 'B64', 'HKV2')")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new cell after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (the code, not speed)")
    args = ap.parse_args(argv)
    from tik_evo_kernels.attention.bench import FAMILY, load_variant

    sets = FAMILY.named_sets()
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in sets]
    if unknown or not names:
        print(f"--variants {args.variants!r}: {unknown or 'none given'} not among the named sets {list(sets)}",
              file=sys.stderr)
        return 2
    try:
        page_sizes = tuple(int(p) for p in args.page_sizes.split(",")) if args.page_sizes else \
            (SMOKE_PAGE_SIZES if args.smoke else PAGE_SIZES)
        if not page_sizes or min(page_sizes) < 1:
            raise ValueError
    except ValueError:
        print(f"--page-sizes {args.page_sizes!r}: expected positive integers, comma-separated", file=sys.stderr)
        return 2
    if args.smoke:
        from tik_evo import interp

        interp.install()
        device = "cpu"
    elif not torch.cuda.is_available():
        print("tik-evo bench paged-decode needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device = "cuda"
    tmp = Path(tempfile.mkdtemp(prefix="paged_decode_"))
    modules = {n: load_variant(n, sets[n], tmp)[0] for n in names}
    fa, fa_about = flash_attn_kvcache()
    print(f"flash-attn: {fa_about}", flush=True)
    cells = [c for c in (SMOKE_CELLS if args.smoke else CELLS)
             if args.cells is None or args.cells in "HQ{} HKV{} D{} B{} ctx{}".format(*c[0], c[1], c[2])]
    report: dict[str, Any] = {
        **header(gpu="cpu (interpreter)" if args.smoke else None), "smoke": args.smoke, "flash_attn": fa_about,
        "variants": {n: sets[n] for n in names}, "page_sizes": list(page_sizes), "timer": "wall-interpreter" if
        args.smoke else "cuda-graph replays, median us per call", "timings": [], "bits": [], "skipped": []}
    t0 = time.time()
    for heads, B, ctx in cells:
        name = "HQ{} HKV{} D{} B{} ctx{}".format(*heads, B, ctx)
        if time.time() - t0 > args.budget_s:
            report["skipped"].append(name)
            continue
        try:
            rows, bits = run_cell(modules, heads, B, ctx, page_sizes, fa, args.smoke, device)
        except Exception as e:  # noqa: BLE001 - a cell that cannot be set up (memory) loses itself only
            report["skipped"].append(f"{name}: {type(e).__name__}: {e}"[:300])
            print(f"{name:34s} failed: {report['skipped'][-1]}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        report["timings"] += rows
        report["bits"] += bits
        line = " ".join(f"{r['impl']}={r['us']:.1f}" if "us" in r else f"{r['impl']}=ERR" for r in rows)
        equal = all(b.get("bf16_equal") and b.get("fp32_equal") for b in bits)
        print(f"{name:34s} us: {line}  paged==contiguous: {equal}", flush=True)
        report["summary"] = summary(report["timings"])
        write_json(args.out, report)
    report["seconds"] = time.time() - t0
    report["all_bits_equal"] = bool(report["bits"]) and all(b.get("bf16_equal") and b.get("fp32_equal")
                                                            for b in report["bits"])
    report["summary"] = summary(report["timings"])
    write_json(args.out, report)
    for impl, s in report["summary"].items():
        print(f"geomean time {impl:24s} " + " ".join(f"x{k.removeprefix('time_x_')}={v:.3f}" for k, v in s.items()
                                                        if k.startswith("time_x_")))
    if fa is None:
        print(f"flash-attn not timed: {fa_about}")
    print(f"paged == contiguous on every cell: {report['all_bits_equal']}; wrote {args.out}", flush=True)
    return 0 if report["all_bits_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
