"""The warp-specialised Gluon prefill (the family's FULL_IMPL="gluon_ws") on a Hopper GPU: bits, then speed.

1. Bits: the family's consistency checks (bf16 and pre-cast fp32; the Gluon prefill against the Triton decode)
   on cases of whole 128-row tiles; then, on every timed cell, its bf16 output against the Triton prefill's,
   bit for bit.
2. Speed: the prefill / train_forward cells of the paper grid, each Gluon variant against the Triton prefill
   (--variant knobs) and SDPA (cuDNN, flash), on the same inputs (`bench.time_prefill`).

    python benchmarks/attention_ws_gpu.py --out ws.json [--ws nb2,ov4] [--variant hopper_auto] [--max-seq N]

(`benchmarks/attention_ws_smoke.py` first: a hang then costs seconds.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ws", default="nb2,ov4", help="Gluon variants: nbN (N K/V slots), ovN (overlapped)")
    ap.add_argument("--variant", default="hopper_auto", help="Triton knobs (a name in bench.VARIANTS)")
    ap.add_argument("--max-seq", type=int, default=1 << 20)
    ap.add_argument("--budget-s", type=float, default=400)
    args = ap.parse_args()
    t0 = time.time()
    tmp = Path(tempfile.mkdtemp())
    tmod, knobs = bench.load_variant(args.variant, bench.VARIANTS[args.variant], tmp)
    variants = {f"ws_{n}": ws_variant(n, bench.VARIANTS[args.variant], tmp) for n in args.ws.split(",")}
    import triton

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
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
