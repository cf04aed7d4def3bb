"""Compile the linear kernel's decode (and full) launch for Hopper (sm_90a) on any machine, no GPU needed, and
report shared memory, registers, spills and the wgmma / TMA instructions, for the root or knob variants.

    tik-evo bench linear-compile [--knobs '{"DECODE_K_UNROLL": 4}'] [--variants FILE] [--m 1]

Arguments are specialised as the Triton runtime does at launch (see attention_compile_report.py): 16-byte
divisibility on pointers and on N, K and the row strides (model shapes), unit inner strides as constants.
`sass_sha` identifies the generated instructions (e.g. to confirm that a decode-only change left the full path alone).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from tik_evo.sm90 import compile_sm90, load_variant  # noqa: E402

SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ws_ptr": "*fp32", "b_ptr": "*bf16", "y_ptr": "*bf16", "y32_ptr": "*bf16",
       "M": "i32", "N": "i32", "K": "i32", "sxm": "i32", "swn": "i32", "sym": "i32"}
ALIGNED = {"x_ptr", "w_ptr", "ws_ptr", "b_ptr", "y_ptr", "y32_ptr", "N", "K", "sxm", "swn", "sym"}
SMEM_LIMIT = 232448  # bytes of shared memory one block may use on an H100/H200


def report(mod, path: str, m: int, k: int = 4096, n: int = 4096, write32: bool = False) -> dict:
    sch = mod._schedule(m, n, k, path, write32=write32)  # the launch's schedule, as the root picks it
    consts = {"sxk": 1, "swk": 1, "syn": 1, "K_CHUNK": sch["k_chunk"], "N_CHUNKS": sch["n_chunks"],
              "FLAT_CHUNKS": sch["flat"], "HAS_BIAS": False, "WRITE32": write32, "BLOCK_M": sch["bm"],
              "BLOCK_N": sch["bn"], "BLOCK_K": mod.KNOBS["BLOCK_K"], "GROUP_M": sch["group_m"], "EVEN_K": True,
              "USE_TMA": mod.KNOBS[path + "_USE_TMA"], "UNROLL": sch["unroll"]}
    # The kernel's argument order, with the unit strides placed where the signature has them.
    names = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "y32_ptr", "M", "N", "K", "sxm", "sxk", "swn", "swk", "sym", "syn"]
    kernel = mod._linear_kernel
    if sch["parallel"]:  # one K chunk per program (the merge launch is a plain elementwise kernel)
        kernel, names = mod._linear_chunk_kernel, ["x_ptr", "w_ptr", "ws_ptr", "M", "N", "K", "sxm", "sxk", "swn",
                                                   "swk"]
        consts = {k: v for k, v in consts.items() if k not in ("syn", "N_CHUNKS", "FLAT_CHUNKS", "HAS_BIAS",
                                                                "WRITE32")}
    elif sch["persistent_per_sm"]:  # full path: persistent programs over tiles (and in-program K chunks)
        kernel, names = mod._linear_persistent_kernel, ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "y32_ptr", "M", "N",
                                                        "K", "sxm", "swn", "sym", "syn"]
        consts = {k: v for k, v in consts.items() if k not in ("sxk", "swk", "FLAT_CHUNKS", "EVEN_K", "USE_TMA",
                                                                "UNROLL")}
    sig = {n: SIG.get(n, "constexpr") for n in names}
    if write32 and "y32_ptr" in sig:
        sig["y32_ptr"] = "*fp32"
    out = compile_sm90(kernel, sig, consts, sch["warps"], sch["stages"], ALIGNED)
    return {"BLOCK_M": sch["bm"], "BLOCK_N": sch["bn"], "UNROLL": sch["unroll"], "warps": sch["warps"],
            "stages": sch["stages"], "parallel_chunks": sch["parallel"], "persistent": bool(sch["persistent_per_sm"]),
            **out,
            "fits_smem": out["shared_bytes"] <= SMEM_LIMIT}


def report_grouped(mod, path: str, k: int, n: int, write32: bool = False) -> dict:
    """The grouped launch (linear_grouped_*: several weights, an MoE layer's experts) with the path's tiles."""
    bm, bn, stages = mod._grouped_tile(path, k)
    k_chunk = mod._k_chunk(k)
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "y32_ptr": "*fp32" if write32 else "*bf16",
           "starts_ptr": "*i32", "E": "i32", "T": "i32", "N": "i32", "K": "i32", "sxm": "i32",
           "sxk": "i32", "swe": "i32", "swn": "i32", "swk": "i32", "sym": "i32", "syn": "i32"}
    consts = {"sxk": 1, "swk": 1, "syn": 1, "K_CHUNK": k_chunk, "WRITE32": write32, "BLOCK_M": bm, "BLOCK_N": bn,
              "BLOCK_K": mod.KNOBS["BLOCK_K"], "EVEN_K": k % mod.KNOBS["BLOCK_K"] == 0, "E_PAD": 128,
              "USE_TMA": mod.KNOBS[path + "_USE_TMA"]}
    aligned = {"x_ptr", "w_ptr", "y_ptr", "y32_ptr", "starts_ptr", "N", "K", "sxm", "swe", "swn", "sym"}
    return {"tile": f"{bm}x{bn}", "k_chunk": k_chunk,
            **compile_sm90(mod._linear_grouped_kernel, sig, consts, mod.KNOBS[path + "_NUM_WARPS"], stages, aligned)}


def report_backward(mod, tile: tuple | None = None) -> dict:
    """The dense backward's GEMM (_linear_bwd_kernel) with BWD_TILE (or `tile`): dX (A row-major) and dW
    (A transposed in shared memory), one pass over R and split into fp32 partials; and the grouped dW kernels."""
    bp, bq, br, group, warps, stages, _ = tile or mod.BWD_TILE
    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "ws_ptr": "*fp32", "P": "i32", "Q": "i32",
           "R": "i32", "sa": "i32", "sb": "i32", "sc": "i32", "r_split": "i32"}
    aligned = {"a_ptr", "b_ptr", "c_ptr", "ws_ptr", "Q", "sa", "sb", "sc", "r_split"}
    out = {}
    for a_t in (False, True):
        for split in (1, 2):
            # Split launches take at most 128x128 tiles (the root's _bwd_schedule).
            p, q = (bp, bq) if split == 1 else (min(bp, 128), min(bq, 128))
            consts = {"A_T": a_t, "SPLIT": split, "BLOCK_P": p, "BLOCK_Q": q, "BLOCK_R": br, "GROUP_P": group}
            out[f"{'dW' if a_t else 'dX'}.split{split}"] = {"tile": f"{p}x{q}x{br}", **compile_sm90(
                mod._linear_bwd_kernel, sig, consts, warps, stages, aligned)}
    # The grouped launch's dW kernels (DW_TILE): pointer loads, and TMA over each expert's own rows.
    bn, bk, br, warps, stages = mod.DW_TILE
    ptrs = {"gy_ptr": "*bf16", "x_ptr": "*bf16", "gw_ptr": "*bf16", "starts_ptr": "*i32"}
    consts = {"BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_R": br}
    strides = {"tma": ("sgm", "sxm", "swe", "swn"), "pointer": ("sgm", "sgn", "sxm", "sxk", "swe", "swn", "swk")}
    for name, fn in (("pointer", mod._linear_grouped_dw_kernel), ("tma", mod._linear_grouped_dw_tma_kernel)):
        sig = {**ptrs, "N": "i32", "K": "i32", **{st: "i32" for st in strides[name]}}
        out[f"grouped_dW.{name}"] = {"tile": f"{bn}x{bk}x{br}", **compile_sm90(
            fn, sig, consts, warps, stages, {*ptrs, "N", "K", "sgm", "sxm", "swe", "swn"})}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", type=Path, default=ROOT / "kernels" / "linear" / "root.py")
    ap.add_argument("--knobs", default="{}", help="JSON knob changes applied to the source's KNOBS")
    ap.add_argument("--variants", type=Path, help="JSON {name: knob changes}: report decode for each")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 64], help="decode rows (pick DECODE_SMALL_* or not)")
    ap.add_argument("--full", action="store_true", help="also report the full path")
    ap.add_argument("--k", type=int, default=4096, help="K of the launch (sets the number of K_CHUNK chunks)")
    ap.add_argument("--n", type=int, default=4096, help="N of the launch (the schedule may follow it)")
    ap.add_argument("--write32", action="store_true", help="with the fp32 output (the family's checks ask for it)")
    ap.add_argument("--grouped", action="store_true",
                    help="report the grouped launch (linear_grouped_*) of both paths at --k / --n instead")
    ap.add_argument("--backward", action="store_true",
                    help="report the dense backward's GEMM (BWD_TILE, or each tile of --tiles JSON) instead")
    ap.add_argument("--tiles", default=None, help='JSON list of BWD_TILE tuples for --backward')
    args = ap.parse_args(argv)
    if args.backward:
        mod = load_variant(args.source, json.loads(args.knobs), "linear_report_backward")
        for tile in json.loads(args.tiles) if args.tiles else [None]:
            print(json.dumps({"tile": tile or list(mod.BWD_TILE), **report_backward(mod, tile)}), flush=True)
        return 0
    variants = json.loads(args.variants.read_text()) if args.variants else {"cli": json.loads(args.knobs)}
    for name, knobs in variants.items():
        mod = load_variant(args.source, knobs, f"linear_report_{name}")
        if args.grouped:
            print(json.dumps({"variant": name, **{f"grouped.{p.lower()}": report_grouped(mod, p, args.k, args.n,
                                                                                        args.write32)
                                                   for p in ("FULL", "DECODE")}}), flush=True)
            continue
        row = {"variant": name, **{f"decode.M{m}": report(mod, "DECODE", m, args.k, args.n, args.write32)
                                      for m in args.m}}
        if args.full:
            row["full"] = report(mod, "FULL", 4096, args.k, args.n, args.write32)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
