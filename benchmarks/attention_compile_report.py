"""Compile the attention kernels for Hopper (sm_90a) on any machine, no GPU needed, and report what the
compiler did: shared memory, registers, spills, and the wgmma / TMA instructions in the SASS.

    tik-evo bench attention-compile [--source FILE] [--knobs '{"FULL_KV_LOADS": "tma"}']
        [--paths prefill,prefill_ws] [--page-size 16]

--knobs may also be a JSON list of knob changes: one report per entry, as a JSON list, from one process (Python
and Triton start once). --paths compiles only the kernels named (the others read null).

Integer and pointer arguments get the 16-byte divisibility the Triton runtime specialises on at launch (the
grid's sizes are multiples of 16); without it pointer loads cannot be vectorised, are not software-pipelined,
and the report would describe a kernel that never runs. Uses Triton's bundled ptxas and cuobjdump.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import triton

ROOT = Path(__file__).resolve().parents[1]
from tik_evo.sm90 import compile_sm90, load_variant  # noqa: E402

ALIGNED = {"Q", "K", "V", "CTX", "O", "O32", "M_WS", "L_WS", "ACC_WS", "ARRIVALS", "S", "S_CAP", "TOTAL_ROWS",
           "BT", "BT_STRIDE"}
PREFILL_SIG = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "O32": "*bf16", "S": "i32",
               "TOTAL_ROWS": "i32", "qk_scale": "fp32", "HQ": "i32", "HKV": "i32", "GROUP": "i32", "BH": "i32"}
DECODE_SIG = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "CTX": "*i32", "O": "*bf16", "O32": "*bf16",
              "M_WS": "*fp32", "L_WS": "*fp32", "ACC_WS": "*fp32", "ARRIVALS": "*i32", "S_CAP": "i32",
              "TOTAL_ROWS": "i32", "N_CHUNKS": "i32", "qk_scale": "fp32", "HQ": "i32", "HKV": "i32", "GROUP": "i32",
              "BT": "*i32", "BT_STRIDE": "i32"}
PACKED_SIG = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "O32": "*bf16", "CU": "*i32",
              "TOTAL_ROWS": "i32", "qk_scale": "fp32", "HQ": "i32", "HKV": "i32", "GROUP": "i32"}
MERGE_SIG = {"CTX": "*i32", "O": "*bf16", "O32": "*bf16", "M_WS": "*fp32", "L_WS": "*fp32", "ACC_WS": "*fp32",
             "N_CHUNKS": "i32", "qk_scale": "fp32", "HQ": "i32", "HKV": "i32", "GROUP": "i32"}


PATHS = ("prefill", "prefill_packed", "decode", "merge", "prefill_ws", "decode_ws", "decode_paged")


def report(source: Path, knobs: dict, head_dim: int, decode_split: int | None, paths=PATHS, page_size: int = 16) \
        -> dict:
    """Compile the kernels named in `paths` of `source` with `knobs` changed, as the launches would (decode_paged:
    pages of `page_size` keys, 8 KV heads, TMA where the knob asks for it and the pages hold whole blocks)."""
    mod = load_variant(source, knobs, "attention_report")
    kn = mod.KNOBS
    split = kn["SPLIT_TOKENS"] if decode_split is None else decode_split
    cpp = kn["DECODE_CHUNKS_PER_PROGRAM"] or 8  # "auto" resolves at launch; 8 is its value at B16 ctx 8K split 256
    group = 4  # 32 query / 8 KV heads
    rep = {"triton": triton.__version__, "knobs": kn, **{p: None for p in PATHS}}
    if "prefill" in paths:
        rep["prefill"] = compile_sm90(mod._prefill_kernel, PREFILL_SIG, {
            "HEAD_D": head_dim, "BLOCK_M": kn["BLOCK_M"], "BLOCK_N": kn["BLOCK_N"], "SPLIT": kn["SPLIT_TOKENS"],
            "SPLIT_LOOP": kn["FULL_SPLIT_LOOP"], "TMA": kn["FULL_KV_LOADS"] == "tma",
            "PERSISTENT": kn["FULL_PERSISTENT"], "WRITE32": False},
            kn["FULL_NUM_WARPS"], kn["FULL_NUM_STAGES"], ALIGNED)
    if "prefill_packed" in paths:  # 32 query / 8 KV heads, as the prefill report's GROUP
        rep["prefill_packed"] = compile_sm90(mod._prefill_packed_kernel, PACKED_SIG, {
            "Q_ROW": 32 * head_dim, "KV_ROW": 8 * head_dim, "HEAD_D": head_dim, "BLOCK_M": kn["BLOCK_M"],
            "BLOCK_N": kn["BLOCK_N"], "SPLIT": kn["SPLIT_TOKENS"], "SPLIT_LOOP": kn["FULL_SPLIT_LOOP"],
            "TMA": kn["FULL_KV_LOADS"] == "tma", "WRITE32": False},
            kn["FULL_NUM_WARPS"], kn["FULL_NUM_STAGES"], ALIGNED | {"CU"})
    for path, page in (("decode", 0), ("decode_paged", page_size)):
        if path not in paths:
            continue
        # The decode tile as decode() picks it (groups of 4 rows fit every tile).
        layout_free = kn["ROW_SUM"] != "reduce"
        block_m = kn["DECODE_BLOCK_M"] if layout_free else max(kn["DECODE_BLOCK_M"], 64)
        rep[path] = compile_sm90(mod._decode_kernel, DECODE_SIG, {
            "HEAD_D": head_dim, "BLOCK_M": block_m, "BLOCK_N": kn["BLOCK_N"], "SPLIT": split,
            "PACK_GQA": kn["DECODE_PACK_GQA"], "CHUNKS_PER_PROGRAM": cpp, "CHUNK_LOOP": kn["DECODE_CHUNK_LOOP"],
            "TMA": kn["DECODE_KV_LOADS"] == "tma" and page % kn["BLOCK_N"] == 0,
            "PDL": kn["DECODE_MERGE_LAUNCH"] == "pdl",
            "FINISH_SINGLE": kn["DECODE_FINISH_SINGLE"], "FUSED_MERGE": kn["DECODE_MERGE_LAUNCH"] == "fused",
            "MERGE_ROWS": max(kn["DECODE_MERGE_ROWS"], group), "MERGE_LOADS": kn["DECODE_MERGE_LOADS"],
            "WRITE32": False, "PAGE": page, "KV_ROW": 8 * head_dim if page else 0},
            kn["DECODE_NUM_WARPS"], 2 * kn["DECODE_NUM_STAGES"] - 1 if page else kn["DECODE_NUM_STAGES"], ALIGNED)
    if "merge" in paths:
        rep["merge"] = compile_sm90(mod._decode_merge_kernel, MERGE_SIG, {
            "HEAD_D": head_dim, "ROWS": max(kn["DECODE_MERGE_ROWS"], group), "SPLIT": split,
            "PDL": kn["DECODE_MERGE_LAUNCH"] == "pdl", "LOADS": kn["DECODE_MERGE_LOADS"], "WRITE32": False},
            4, 1, ALIGNED)
    desc = lambda rows: (f"tensordesc<bf16[1, {rows}, {head_dim}],NVMMASharedLayout(swizzle_byte_width=128, "  # noqa: E731
                         "element_bitwidth=16, rank=3, transposed=False, fp4_padded=False, cga_layout=[])>")
    if "prefill_ws" in paths:
        # The warp-specialised Gluon prefill (FULL_IMPL), as `_ws_prefill` launches it.
        ws_sig = {"q_desc": desc(64), "k_desc": desc(kn["BLOCK_N"]), "v_desc": desc(kn["BLOCK_N"]),
                  "o_desc": desc(64), "O": "*bf16", "O32": "*bf16", "S": "i32", "qk_scale": "fp32", "BH": "i32",
                  "HQ": "i32", "HKV": "i32", "GROUP": "i32", "HB": "i32"}
        cons, q_tiles, acc_smem, slots = mod._ws_plan(kn["BLOCK_N"], head_dim, kn["SPLIT_TOKENS"])
        cons_regs, loader_regs, maxnreg = mod._ws_regs(cons)
        rep["prefill_ws"] = compile_sm90(mod._ws_prefill_kernel, ws_sig, {
            "HEAD_D": head_dim, "BLOCK_N": kn["BLOCK_N"], "SPLIT": kn["SPLIT_TOKENS"], "NUM_BUF": slots,
            "OVERLAP": kn["FULL_WS_SCHEDULE"] == "overlap",
            "PERSISTENT": (2 if kn["FULL_WS_BANDS"] != "off" else 1) if kn["FULL_WS_PERSISTENT"] != "off" else 0,
            "WRITE32": False, "CONS": cons, "Q_TILES": q_tiles, "ACC_SMEM": acc_smem, "CONS_REGS": cons_regs,
            "LOADER_REGS": loader_regs, "ROW_SUM_DOT": kn["ROW_SUM"] == "dot",
            "DIAG": mod._ws_diag(cons, kn["BLOCK_N"]), "STORE_TMA": kn["FULL_WS_STORE"] == "tma"},
            4, 1, ALIGNED, maxnreg=maxnreg)
    # The Gluon decode (DECODE_IMPL), as `_dec_launch` launches it (partials for the merge launch, or folded by the
    # row group's last program with the fused merge), where `_dec_covers` sends a launch to it.
    if "decode_ws" in paths and kn["BLOCK_N"] == 128 and kn["ROW_SUM"] in ("dot", "tree"):
        dec_sig = {"Q": "*bf16", "k_desc": desc(64), "v_desc": desc(64), "CTX": "*i32", "O": "*bf16",
                   "O32": "*bf16", "M_WS": "*fp32", "L_WS": "*fp32", "ACC_WS": "*fp32", "ARRIVALS": "*i32",
                   "N_CHUNKS": "i32", "qk_scale": "fp32", "HQ": "i32", "HKV": "i32", "GROUP": "i32"}
        slots, maxnreg = mod._dec_plan(kn["BLOCK_N"], head_dim)
        rep["decode_ws"] = compile_sm90(mod._dec_kernel, dec_sig, {
            "HEAD_D": head_dim, "BLOCK_N": kn["BLOCK_N"], "SPLIT": split, "CPP": cpp, "NUM_BUF": slots,
            "ROW_SUM_DOT": kn["ROW_SUM"] == "dot", "FINISH": False, "WRITE32": False,
            "OVERLAP": kn["DECODE_WS_SCHEDULE"] == "overlap", "FUSED": kn["DECODE_MERGE_LAUNCH"] == "fused",
            "FOLD_ROWS": max(kn["DECODE_MERGE_ROWS"], group), "LOADS": kn["DECODE_MERGE_LOADS"]},
            4, 1, ALIGNED, maxnreg=maxnreg)
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "kernels" / "attention" / "root.py")
    ap.add_argument("--knobs", default="{}", help="JSON knob changes applied to the source's KNOBS, or a list of them")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--decode-split", type=int, default=None, help="decode's SPLIT (default: the knob)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"kernels to compile, of {','.join(PATHS)}")
    ap.add_argument("--page-size", type=int, default=16, help="decode_paged's keys per page")
    args = ap.parse_args(argv)
    paths = args.paths.split(",")
    if bad := [p for p in paths if p not in PATHS]:
        ap.error(f"--paths: unknown {bad}; choose from {list(PATHS)}")
    knobs = json.loads(args.knobs)
    reps = [report(args.source, k, args.head_dim, args.decode_split, paths, args.page_size)
            for k in (knobs if isinstance(knobs, list) else [knobs])]
    print(json.dumps(reps if isinstance(knobs, list) else reps[0], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
