"""The Gluon decode (DECODE_IMPL="gluon_ws") and the Gluon prefill with the layout-free row sums (dot, tree) against
the Triton kernels of the same contract, bit for bit, on a GPU. A quick gate before the family's full checks and
the timings: each knob set runs a few mixed-length decode batches (cache past every length filled with NaN,
lengths that are not multiples of any block) and a prefill, and counts rows whose bits differ between
- the Gluon decode and the Triton decode (bf16 output and pre-cast fp32),
- the decode and the prefill's row at the same position (the family's first consistency case),
- the Gluon prefill and the Triton prefill.
Writes JSON to --out; exits 1 if any row differs, a decode gives NaN or a set did not reach the Gluon decode.

    tik-evo bench attention-gluon-decode --out gluon_decode.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from tik_evo.sm90 import load_variant  # noqa: E402
from tik_evo_bench.common import header  # noqa: E402

SOURCE = ROOT / "kernels" / "attention" / "root.py"
DOT128 = {"BLOCK_N": 128, "ROW_SUM": "dot", "SPLIT_TOKENS": 1024, "FULL_WS_SCHEDULE": "serial",
          "FULL_NUM_STAGES": 2}  # (3 Triton prefill stages do not fit at 128-key blocks with the dot row sum)
KNOB_SETS = {
    "bn128_dot_s1024": DOT128,
    "bn128_dot_s1024_overlap": {**DOT128, "FULL_WS_SCHEDULE": "overlap", "DECODE_WS_SCHEDULE": "overlap"},
    "bn128_dot_s1024_b6_overlap": {**DOT128, "DECODE_WS_BUFFERS": 6, "DECODE_WS_SCHEDULE": "overlap"},
    "bn128_dot_s512_single": {**DOT128, "SPLIT_TOKENS": 512, "DECODE_FINISH_SINGLE": True},
    "bn128_tree_s1024": {**DOT128, "ROW_SUM": "tree", "FULL_NUM_STAGES": 3, "DECODE_WS_BUFFERS": 4},
    "bn128_tree_s1024_overlap": {**DOT128, "ROW_SUM": "tree", "DECODE_WS_SCHEDULE": "overlap"},
    # the persistent Gluon prefill over head bands (several bands in the last three cases), two decode programs
    # an SM
    "bn128_tree_bands": {**DOT128, "ROW_SUM": "tree", "FULL_NUM_STAGES": 3, "DECODE_WS_BUFFERS": 3,
                         "DECODE_CHUNKS_PER_PROGRAM": "waves", "FULL_WS_PERSISTENT": "snake",
                         "FULL_WS_LOADER_REGS": 24, "FULL_WS_BANDS": 4},
    # several chunks a Gluon program (cpp 2 and 4 in the last two cases) against the Triton decode's one
    "bn128_tree_s512_waves": {**DOT128, "ROW_SUM": "tree", "FULL_NUM_STAGES": 3, "DECODE_WS_BUFFERS": 4,
                              "SPLIT_TOKENS": 512, "DECODE_CHUNKS_PER_PROGRAM": "waves"},
    # the fused merge: each row group's last Gluon program folds the partials (against the Triton merge launch)
    "bn128_tree_s512_fused": {**DOT128, "ROW_SUM": "tree", "FULL_NUM_STAGES": 3, "DECODE_WS_BUFFERS": 4,
                              "SPLIT_TOKENS": 512, "DECODE_CHUNKS_PER_PROGRAM": "waves",
                              "DECODE_MERGE_LAUNCH": "fused", "DECODE_MERGE_LOADS": 8, "DECODE_MERGE_ROWS": 1},
}
# (64-key blocks are not sent to the Gluon decode, see `_dec_covers`; runs 36 and 39 checked them through it.)
# (batch lengths, cache capacity, query heads, KV heads, head dim)
CASES = [([1, 77, 1000, 2100], 2304, 8, 2, 128), ([513, 4095], 4100, 32, 8, 128), ([300, 64, 129], 512, 4, 4, 64),
         ([8192], 8192, 32, 8, 128), ([4096, 3001] * 8, 4096, 32, 8, 128)]


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows (last dim) whose bits differ anywhere."""
    return int((a.contiguous().view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32)
                != b.contiguous().view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))
               .reshape(-1, a.shape[-1]).any(-1).sum())


def run_set(name: str, knobs: dict) -> dict:
    gl_mod = load_variant(SOURCE, {**knobs, "DECODE_IMPL": "gluon_ws", "FULL_IMPL": "gluon_ws"}, f"g_{name}")
    tr_mod = load_variant(SOURCE, {**knobs, "DECODE_IMPL": "triton", "FULL_IMPL": "triton",
                                   "DECODE_MERGE_LAUNCH": "plain"}, f"t_{name}")  # the reference: a merge launch
    out = {"knobs": knobs, "cases": []}
    for lens, s_cap, hq, hkv, d in CASES:
        g = torch.Generator(device="cuda").manual_seed(sum(lens) + d)
        B = len(lens)
        k = torch.randn(B, hkv, s_cap, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, hkv, s_cap, d, device="cuda", dtype=torch.bfloat16, generator=g)
        q_all = torch.randn(B, hq, s_cap, d, device="cuda", dtype=torch.bfloat16, generator=g)
        ctx = torch.tensor(lens, dtype=torch.int32, device="cuda")
        kc, vc = k.clone(), v.clone()
        for b, n in enumerate(lens):  # the cache past each length may hold anything
            kc[b, :, n:] = float("nan")
            vc[b, :, n:] = float("nan")
        q = torch.stack([q_all[b, :, n - 1] for b, n in enumerate(lens)])[:, :, None]  # [B, HQ, 1, D]
        scale = 1 / math.sqrt(d)
        res = {"lens": lens, "s_cap": s_cap, "heads": [hq, hkv], "head_dim": d}
        dec = {}
        for tag, mod in (("gluon", gl_mod), ("triton", tr_mod)):
            o = torch.empty(B, hq, 1, d, device="cuda", dtype=torch.bfloat16)
            o32 = torch.empty(B, hq, 1, d, device="cuda", dtype=torch.float32)
            mod.decode(q, kc, vc, ctx, scale, o, o32)
            dec[tag] = (o, o32)
        pre = {}
        for tag, mod in (("gluon", gl_mod), ("triton", tr_mod)):
            o = torch.empty_like(q_all)
            o32 = torch.empty(q_all.shape, device="cuda", dtype=torch.float32)
            mod.prefill(q_all, k, v, scale, o, o32)
            pre[tag] = (o, o32)
        torch.cuda.synchronize()
        last = [torch.stack([p[b, :, n - 1] for b, n in enumerate(lens)])[:, :, None] for p in pre["triton"]]
        res["decode_gluon_vs_triton"] = [differing_rows(dec["gluon"][i], dec["triton"][i]) for i in (0, 1)]
        res["decode_gluon_vs_prefill_row"] = [differing_rows(dec["gluon"][i], last[i]) for i in (0, 1)]
        res["decode_triton_vs_prefill_row"] = [differing_rows(dec["triton"][i], last[i]) for i in (0, 1)]
        # Rows past each sequence's length are meaningless in prefill only through padding; here every row is a
        # real position of a full-length sequence, so all of them compare.
        res["prefill_gluon_vs_triton"] = [differing_rows(pre["gluon"][i], pre["triton"][i]) for i in (0, 1)]
        res["rows"] = {"decode": B * hq, "prefill": B * hq * s_cap}
        res["gluon_decode_ran"] = bool(gl_mod._dec_covers(q, kc, vc))  # else both sides ran the Triton decode
        res["nan_in_decode"] = bool(torch.isnan(dec["gluon"][1]).any())
        out["cases"].append(res)
        print(name, res, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sets", default=",".join(KNOB_SETS))
    args = ap.parse_args(argv)
    report = {**header(),
              "sets": {}}
    bad = 0
    for name in args.sets.split(","):
        try:
            report["sets"][name] = r = run_set(name, KNOB_SETS[name])
            bad += sum(sum(c[key]) for c in r["cases"] for key in
                       ("decode_gluon_vs_triton", "decode_gluon_vs_prefill_row", "prefill_gluon_vs_triton"))
            bad += sum(c["nan_in_decode"] or not c["gluon_decode_ran"] for c in r["cases"])
        except Exception as e:  # noqa: BLE001 - one set's failure is a finding, the others still run
            report["sets"][name] = {"knobs": KNOB_SETS[name], "error": repr(e)[:2000]}
            print(name, "ERROR", repr(e)[:2000], flush=True)
            bad += 1
        args.out.write_text(json.dumps(report, indent=1))
    print("differing or failed:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
