"""RMSNorm's backward kernel (`kernels/norm_backward.py`) at the policy step's shapes, one schedule against another.

The policy step (tik-evo bench policy, 4 x 2048 tokens) takes this kernel for the final norm, each layer's
add + RMSNorm (with the residual output's gradient) and QK norm (128-wide heads, q and k separately). Each
schedule (a dict of the module's KNOBS) is timed on every shape, with inputs rotated out of L2, against a copy of
the same number of bytes (the bandwidth ceiling); each schedule's dx and dw are compared with the first
schedule's (relative L2) and, on the first shape, with an fp64 autograd reference. Writes JSON.

    tik-evo bench norm-backward --out norm_backward.json
    tik-evo bench norm-backward --smoke --out x.json   # tiny shapes under the CPU interpreter
    tik-evo bench norm-backward --offline --out x.json # no GPU: each schedule compiled for sm_90a

`--offline` is not a timing: per shape and schedule it reports the registers and spills of an sm_90a compile,
how many programs an H200's SM holds at once, and how many it would be handed (PROGRAMS_PER_SM, or 0: as many as
it holds), so how many rounds of programs a persistent grid takes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from tik_evo import checks  # noqa: E402
from tik_evo_kernels import norm_backward as nb  # noqa: E402
from tik_evo_kernels.norm_backward import H200  # noqa: E402
from tik_evo_kernels.norm_backward import offline_schedules as offline  # noqa: E402

T = 8192
# name -> (rows, width, with the residual output's gradient)
SHAPES = {
    "qk q (4B/30B: 32 heads)": (T * 32, 128, False),
    "qk k (4B: 8 kv heads)": (T * 8, 128, False),
    "add+norm 4B (hidden 2560)": (T, 2560, True),
    "final norm 4B": (T, 2560, False),
    "add+norm 30B-A3B (hidden 2048)": (T, 2048, True),
}
SMOKE_SHAPES = {"qk": (37, 128, False), "add+norm": (9, 300, True), "norm": (5, 1000, False)}

BEFORE = {"PREFETCH": False, "DW_IN_TILE": False, "PROGRAMS_PER_SM": 4, "NUM_WARPS": 0,  # the kernel until 12-06
          "MIN_TILES_PER_PROGRAM": 1}
# Around the 2026-12-06 H100 sweep's best (prefetch, dw per tile position): PROGRAMS_PER_SM 0 is as many as the SMs
# hold at once (from the compiled kernel's registers), MIN_TILES_PER_PROGRAM caps the grid so no program takes a
# single tile.
SCHEDULES = [BEFORE] + [{"PREFETCH": True, "DW_IN_TILE": True, "PROGRAMS_PER_SM": p, "NUM_WARPS": w,
                         "MIN_TILES_PER_PROGRAM": m} for p in (0, 8) for w in (0, 4, 16) for m in (1, 2, 4)]
SMOKE_SCHEDULES = [BEFORE, {"PREFETCH": True, "DW_IN_TILE": True, "PROGRAMS_PER_SM": 0, "NUM_WARPS": 4,
                             "MIN_TILES_PER_PROGRAM": 2}]


def time_us(fn, smoke: bool) -> float:
    if smoke:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def copy_us(n_bytes: int, device: str, smoke: bool) -> float:
    """A device copy moving n_bytes (half read, half written): the bandwidth ceiling."""
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return time_us(lambda: dst.copy_(src), smoke)


def inputs(rows: int, width: int, res: bool, device: str, seed: int) -> tuple:
    g = checks.generator(seed)
    x = checks.randn((rows, width), g, torch.bfloat16, device, scale=2.0)
    w = checks.randn((width,), g, torch.bfloat16, device, scale=0.5) + 1.0
    gy = checks.randn((rows, width), g, torch.bfloat16, device)
    gres = checks.randn((rows, width), g, torch.bfloat16, device) if res else None
    return x, w, gy, gres


def fp64_reference(x, w, gy, gres) -> tuple[torch.Tensor, torch.Tensor]:
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
    torch.autograd.backward([y] + ([xd * 1.0] if gres is not None else []),
                            [gy.double()] + ([gres.double()] if gres is not None else []))
    return xd.grad, wd.grad


def run(shapes: dict, schedules: list[dict], device: str, smoke: bool, save=lambda rows: None) -> list[dict]:
    """Every schedule on every shape; `save(rows)` after each shape (a cut-off run keeps what it measured)."""
    default = dict(nb.KNOBS)
    rows_out = []
    try:
        for si, (name, (rows, width, res)) in enumerate(shapes.items()):
            n_bytes = rows * width * 2 * (4 if res else 3)  # x, dy (, grad_res) read; dx written
            copies = checks.input_copies(device, n_bytes)
            sets = [inputs(rows, width, res, device, s) for s in range(copies)]
            row = {"shape": name, "rows": rows, "width": width, "residual": res, "bytes": n_bytes,
                   "copy_us": copy_us(n_bytes, device, smoke), "schedules": []}
            first = None
            ref = fp64_reference(*sets[0]) if si == 0 else None
            for sched in schedules:
                nb.KNOBS.update(default, **sched)
                call = checks.rotate(lambda x, w, gy, gres: nb.rms_backward(x, w, gy, 1e-6, gres), *zip(*sets))
                entry = {"knobs": dict(sched)}
                try:
                    dx, dw = nb.rms_backward(*sets[0][:3], 1e-6, sets[0][3])
                    if first is None:
                        first = (dx, dw)
                    entry["dx_rel_l2_vs_first"] = checks.rel_l2(dx, first[0])
                    entry["dw_rel_l2_vs_first"] = checks.rel_l2(dw, first[1])
                    if ref is not None:
                        entry["dx_rel_l2_vs_fp64"] = checks.rel_l2(dx, ref[0])
                        entry["dw_rel_l2_vs_fp64"] = checks.rel_l2(dw, ref[1])
                    entry["us"] = time_us(call, smoke)
                    entry["pct_of_copy"] = 100.0 * row["copy_us"] / entry["us"]
                except Exception as e:  # noqa: BLE001 - one schedule's failure is reported, the others go on
                    entry["error"] = repr(e)[:300]
                row["schedules"].append(entry)
            best = min((e for e in row["schedules"] if "us" in e), key=lambda e: e["us"], default=None)
            row["best"] = best["knobs"] if best else None
            print(f"{name}: copy {row['copy_us']:.1f} us; before {row['schedules'][0].get('us', float('nan')):.1f}"
                  f" us; best {best and best['us']:.1f} us ({best and best['pct_of_copy']:.0f}% of copy) "
                  f"{best and best['knobs']}", flush=True)
            rows_out.append(row)
            save(rows_out)
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        nb.KNOBS.update(default)
    return rows_out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes under the CPU interpreter")
    ap.add_argument("--offline", action="store_true", help="no GPU: compile each schedule for sm_90a and report "
                    "registers and residency (not a timing)")
    args = ap.parse_args(argv)
    if args.offline:
        out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "what": "offline sm_90a compile (no GPU, not a timing); residency for an H200", "h200": H200,
               "triton": triton.__version__, "shapes": offline(SHAPES, SCHEDULES)}
        Path(args.out).write_text(json.dumps(out, indent=1))
        return 0
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        from tik_evo import interp
        interp.install()
    t0 = time.time()
    head = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "triton": triton.__version__, "root_knobs": dict(nb.KNOBS)}

    def save(rows: list[dict]) -> None:
        out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **head,
               "wall_s": round(time.time() - t0, 1), "shapes": rows}
        Path(args.out).write_text(json.dumps(out, indent=1))
    run(SMOKE_SHAPES if args.smoke else SHAPES, SMOKE_SCHEDULES if args.smoke else SCHEDULES, device, args.smoke,
        save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
