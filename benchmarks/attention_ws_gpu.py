"""The warp-specialised Gluon prefill (the family's FULL_IMPL="gluon_ws") on a Hopper GPU: bits, then speed.

1. Bits: the family's consistency checks (bf16 and pre-cast fp32; the Gluon prefill against the Triton decode)
   on cases of whole 128-row tiles; then, on every timed cell, its bf16 output against the Triton prefill's,
   bit for bit.
2. Speed: the prefill / train_forward cells of the paper grid, each Gluon variant against the Triton prefill
   (--variant knobs) and SDPA (cuDNN, flash), on the same inputs (`bench.time_prefill`).

    tik-evo bench attention-ws --out ws.json [--ws nb2,ov4] [--variant hopper_auto] [--max-seq N]
    tik-evo bench attention-ws --smoke   # first, in its own process: a hang then costs seconds
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
from tik_evo_bench.common import header  # noqa: E402
from tik_evo_kernels.attention import bench  # noqa: E402
from tik_evo_kernels.attention.family import AttentionFamily  # noqa: E402

FAMILY = AttentionFamily()
# Consistency cases of whole 128-row tiles: GQA 4 and 8, MHA, head dims 64 and 128, three input scales.
CASES = [
    {"batch": 2, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "prompt": 1920, "answer": 128, "scale": 1.0},
    {"batch": 1, "q_heads": 8, "kv_heads": 1, "head_dim": 128, "prompt": 4096, "answer": 128, "scale": 3.0},
    {"batch": 3, "q_heads": 4, "kv_heads": 4, "head_dim": 64, "prompt": 896, "answer": 128, "scale": 0.3},
]


def ws_variant(name: str, changes: dict, folder: Path):
    """"nb4": the Gluon prefill with 4 K/V slots, one MMA at a time; "ov4": the next QK^T overlapping this
    block's PV (FULL_WS_SCHEDULE), on top of the Triton variant's knob changes."""
    if name[:2] not in ("nb", "ov") or not name[2:].isdigit():
        raise SystemExit(f"--ws: unknown variant {name!r} (nbN or ovN)")
    mod, _ = bench.load_variant(f"ws_{name}", {**changes, "FULL_IMPL": "gluon_ws", "FULL_WS_BUFFERS": int(name[2:]),
                                               "FULL_WS_SCHEDULE": "overlap" if name[:2] == "ov" else "serial"},
                                folder)
    return mod


def checks(mod, seeds: list[int]) -> dict:
    res = {"checks": 0, "failed": []}
    for case in CASES:
        for seed in seeds:
            for c in FAMILY.run_checks(mod, case, seed, "cuda"):
                res["checks"] += 1
                if not c.passed:
                    res["failed"].append(c.to_dict())
    return res


def time_cell(phase: str, B: int, S: int, modules: dict, rows: list, bits: list) -> None:
    """The bench's prefill timing of one cell, then every Gluon variant's bf16 output against the Triton one's."""
    outs: dict[str, torch.Tensor] = {}
    bench.time_prefill(modules, phase, B, S, rows, keep=outs)
    ref = outs.get("triton")
    for name, out in outs.items():
        if name != "triton" and ref is not None:
            differ = int((out.view(torch.int16) != ref.view(torch.int16)).sum())
            bits.append({"cell": f"{phase} B{B} S{S}", "impl": name, "elements_differing_from_triton": differ})


def _diff(a, b, view):
    return int((a.view(view) != b.view(view)).sum())


def smoke() -> None:
    """Quick GPU smoke of the Gluon prefill (FULL_IMPL) against the Triton one, bits compared, on whole-block and
    ragged lengths (two and three consumer warpgroups, splits 1024 and 512), then the fused decode merge against
    the merge launch; run before the long benchmark so that a hang costs seconds, not the whole call. Prints one
    line per case (it changes the root module's KNOBS: run it in its own process)."""
    import triton

    import tik_evo_kernels.attention.root as r

    diff = _diff
    r.KNOBS.update({"FULL_SPLIT_LOOP": "flatten"})
    CONFIGS = (("triton", "overlap", "off", 2), ("gluon_ws", "overlap", "off", 2),
               ("gluon_ws", "serial", "off", 2), ("gluon_ws", "overlap", "snake", 2),
               ("gluon_ws", "serial", "snake", 2), ("gluon_ws", "overlap", "off", 3),
               ("gluon_ws", "serial", "off", 3), ("gluon_ws", "overlap", "snake", 3))
    for split in (1024, 512):  # at split 512 only the three-consumer kernels (compiling each costs seconds)
        r.KNOBS["SPLIT_TOKENS"] = split
        configs = CONFIGS if split == 1024 else [c for c in CONFIGS if c[0] == "triton" or c[3] == 3]
        for S, D, HQ, HKV in ((1984, 128, 32, 8), (1088, 64, 8, 8), (4096, 128, 32, 8), (192, 128, 4, 1),
                              (2076, 128, 32, 8), (1070, 128, 4, 4), (4113, 64, 8, 2), (77, 128, 4, 1)):
            q = torch.randn(2, HQ, S, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
            outs = {}
            for impl, sched, pers, cons in configs:
                r.KNOBS.update({"FULL_IMPL": impl, "FULL_WS_SCHEDULE": sched, "FULL_WS_PERSISTENT": pers,
                                "FULL_WS_CONSUMERS": cons})
                o = torch.empty_like(q)
                o32 = torch.empty(q.shape, device="cuda", dtype=torch.float32)
                used = r._ws_prefill(q, k, v, 0.1, o, o32) if impl != "triton" else r.prefill(q, k, v, 0.1, o, o32)
                torch.cuda.synchronize()
                outs[(impl, sched, pers, cons)] = (o, o32, used)
            ref = outs[CONFIGS[0]]
            for key, (o, o32, used) in outs.items():
                print(f"split {split}", S, D, key, "ws ran" if used else "", "bf16 diff", diff(o, ref[0], torch.int16),
                      "fp32 diff", diff(o32, ref[1], torch.int32), flush=True)
    r.KNOBS.update({"SPLIT_TOKENS": 1024, "FULL_WS_CONSUMERS": 2})

    # Ragged lengths, timed: the Gluon kernel (overlapped, 4 slots, persistent by the auto rule) against Triton.
    r.KNOBS.update({"FULL_KV_LOADS": "auto", "FULL_PERSISTENT": "auto", "FULL_WS_SCHEDULE": "overlap",
                    "FULL_WS_PERSISTENT": "auto"})
    for B, S in ((1, 16000), (4, 4077), (16, 1000)):
        q = torch.randn(B, 32, S, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, 8, S, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, 8, S, 128, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        ms = {}
        for impl, cons in (("triton", 2), ("gluon_ws", 2), ("gluon_ws", 3), ("gluon_ws", 2), ("gluon_ws", 3)):
            r.KNOBS.update({"FULL_IMPL": impl, "FULL_WS_CONSUMERS": cons})
            ms.setdefault(f"{impl}{cons}", []).append(triton.testing.do_bench(
                lambda q=q, k=k, v=v, o=o: r.prefill(q, k, v, 0.088, o), warmup=50, rep=300))
        print(f"ragged prefill B{B} S{S} ms: " + ", ".join(f"{k} {' / '.join(f'{x:.4f}' for x in v)}"
                                                           for k, v in ms.items()), flush=True)
    r.KNOBS["FULL_WS_CONSUMERS"] = 2

    # The fused decode merge (the last chunk program folds) against the PDL merge launch: bits, mixed lengths.
    r.KNOBS.update({"DECODE_FINISH_SINGLE": True, "DECODE_MERGE_LOADS": 8, "DECODE_MERGE_ROWS": 1})
    for split in (1024, 512):  # at split 512 only the three-consumer kernels (compiling each costs seconds)
        r.KNOBS["SPLIT_TOKENS"] = split
        configs = CONFIGS if split == 1024 else [c for c in CONFIGS if c[0] == "triton" or c[3] == 3]
        for B, cap in ((1, 8192), (16, 8192), (7, 3000)):
            q = torch.randn(B, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
            kc = torch.randn(B, 8, cap, 128, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn(B, 8, cap, 128, device="cuda", dtype=torch.bfloat16)
            ctx = torch.randint(1, cap + 1, (B,), device="cuda", dtype=torch.int32)
            ctx[0] = cap
            res = {}
            for launch in ("pdl", "fused", "fused"):  # fused twice: the counters must be back at zero
                r.KNOBS["DECODE_MERGE_LAUNCH"] = launch
                o = torch.empty_like(q)
                o32 = torch.empty(q.shape, device="cuda", dtype=torch.float32)
                r.decode(q, kc, vc, ctx, 0.088, o, o32)
                torch.cuda.synchronize()
                res.setdefault(launch, []).append((o, o32))
            for i, (o, o32) in enumerate(res["fused"]):
                print(f"decode split {split} B{B} cap{cap} fused #{i}: bf16 diff "
                      f"{diff(o, res['pdl'][0][0], torch.int16)} fp32 diff {diff(o32, res['pdl'][0][1], torch.int32)}",
                      flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", help="the JSON results (required but with --smoke)")
    ap.add_argument("--smoke", action="store_true", help="only the quick bits smoke (no --out: it prints)")
    ap.add_argument("--ws", default="nb2,ov4", help="Gluon variants: nbN (N K/V slots), ovN (overlapped)")
    ap.add_argument("--variant", default="hopper_auto", help="Triton knobs (a name in bench.VARIANTS)")
    ap.add_argument("--max-seq", type=int, default=1 << 20)
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args(argv)
    if args.smoke:
        smoke()
        return 0
    if not args.out:
        ap.error("--out is required")
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp())
    tmod, knobs = bench.load_variant(args.variant, bench.VARIANTS[args.variant], tmp)
    variants = {f"ws_{n}": ws_variant(n, bench.VARIANTS[args.variant], tmp) for n in args.ws.split(",")}

    report = {**header(),
              "triton_variant": args.variant, "knobs": knobs, "consistency": {}, "bits_vs_triton": [], "timings": []}
    for name, mod in variants.items():
        r = checks(mod, [0, 1])
        report["consistency"][name] = r
        print(f"consistency {name}: {r['checks'] - len(r['failed'])}/{r['checks']} passed "
              f"({time.time() - t0:.0f} s)", flush=True)
        for fail in r["failed"][:4]:
            print("  FAILED", str(fail)[:300])
    modules = {"triton": tmod, **variants}
    _, cells = bench.grid_cells()
    for phase, B, S in sorted(cells, key=lambda c: c[2] * c[1]):
        if args.max_seq < S:
            continue
        if time.time() - t0 > args.budget_s:
            report.setdefault("skipped", []).append(f"{phase} B{B} S{S}")
            continue
        time_cell(phase, B, S, modules, report["timings"], report["bits_vs_triton"])
        cell = f"{phase} B{B} S{S}"
        print("\n".join(bench.cell_lines(cell, {r["impl"]: r for r in report["timings"] if r["cell"] == cell})),
              flush=True)
    report["geomean_speedup_vs_peer"] = bench.geomeans(report["timings"])
    Path(args.out).write_text(json.dumps(report, indent=1))
    for key, g in report["geomean_speedup_vs_peer"].items():
        print(key, " ".join(bench.geomean_parts(g)))
    bad = [b for b in report["bits_vs_triton"] if b["elements_differing_from_triton"]]
    print("cells whose bits differ from the Triton prefill:", len(bad), "of", len(report["bits_vs_triton"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
