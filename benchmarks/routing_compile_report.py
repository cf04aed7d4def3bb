"""Compile the MoE routing kernel (kernels/moe_routing) for Hopper (sm_90a) on any machine, no GPU needed, and
count its instructions per token: with one tile per program the kernel is loop-free (every round unrolled), so
the SASS of one program is what each program issues, and BLOCK_T tokens share it (with several tiles per program
the counts are left out). With the launch's program count this gives the issue time
a routing launch cannot go below (warp-instructions / (SMs x 4 schedulers x clock)).

    tik-evo bench routing-compile [--knobs '{"FULL_BLOCK_T": 16}'] [--tokens 32768]

Arguments are specialised as the Triton runtime does at launch: 16-byte divisibility on the pointers and the
expert count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from tik_evo.sm90 import compile_sm90, load_variant  # noqa: E402

SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "w32_ptr": "*fp32", "id_ptr": "*i32", "T": "i32", "E": "i32"}
SMS, SCHEDULERS, CLOCK_HZ = 132, 4, 1.98e9  # H200


def report(mod, path: str, experts: int, top_k: int, tokens: int) -> dict:
    block_t, warps = mod._tile(path, True)
    contract = {**mod._contract(experts), "BLOCK_T": block_t}
    consts = {"RENORM": True, "WRITE32": True, "TOP_K": top_k, "K_PAD": mod.pow2(top_k),
              "TILES_PER_PROGRAM": mod.KNOBS[path + "_TILES_PER_PROGRAM"], "PREFETCH": mod.KNOBS[path + "_PREFETCH"],
              "TOPK_NET": mod.KNOBS.get(path + "_TOPK_NET", False),
              "STAGE_KEYS": mod._stage_keys(contract["BLOCK_E"], contract["GROUP"], path, block_t, warps), **contract}
    with tempfile.TemporaryDirectory() as d:
        os.environ["SM90_SASS_DIR"] = d
        try:
            out = compile_sm90(mod._route_kernel, SIG, consts, warps, mod.KNOBS[path + "_NUM_STAGES"],
                               {"x_ptr", "w_ptr", "w32_ptr", "id_ptr", "E"})
            sass = (Path(d) / "_route_kernel.sass").read_text()
        finally:
            del os.environ["SM90_SASS_DIR"]
    ops = Counter(m.split(".")[0] for m in re.findall(r"/\*[0-9a-f]{4,}\*/\s+([A-Z][A-Z0-9_.]*)", sass))
    per_program = out["instructions"] * warps  # every warp of the program issues the whole SASS
    counts = {"warp_instructions_per_token": per_program / block_t,
              "issue_us_at_full_rate": per_program * -(-tokens // block_t) / (SMS * SCHEDULERS * CLOCK_HZ) * 1e6}
    if mod.KNOBS[path + "_TILES_PER_PROGRAM"] > 1:  # a loop over tiles: the SASS is not what a program issues
        counts = {k: None for k in counts}
    return {"path": path, "BLOCK_T": block_t, "warps": warps, "registers": out["registers"],
            "spill_store_bytes": out["spill_store_bytes"], "SHFL": out["SHFL"], "instructions": out["instructions"],
            **counts, "tokens": tokens, "top_ops": dict(ops.most_common(12))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--source", type=Path, default=ROOT / "kernels" / "moe_routing" / "root.py")
    ap.add_argument("--knobs", default="{}", help="JSON knob changes applied to the source's KNOBS")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32768, help="tokens of the launch the issue time is given for")
    args = ap.parse_args(argv)
    mod = load_variant(args.source, json.loads(args.knobs), "routing_report")
    for path in ("FULL", "DECODE"):
        print(json.dumps(report(mod, path, args.experts, args.top_k, args.tokens)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
