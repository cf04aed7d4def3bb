"""Every one-knob move of each family's root, through the family's own checks on the GPU.

A `full` or `decode` knob claims to change one path's schedule and never a bit, and a `contract` knob to change
both paths' numerics together. The interpreter cannot test either claim where the compiler decides (FMA
contraction, instruction order), so this compiles each root with one knob turned to each other value of its
space and runs the family's consistency, reference and backward checks on the device. A move that fails a
check is a knob the search would keep proposing and the audit keep rejecting: fix the kernel or the knob's tag.

    tik-evo bench knob-moves rmsnorm,rope --out knob_moves.json [--workers 8]

Moves run in worker processes (compiles are CPU-bound), each move's checks on one seed; `--device cpu` runs the
same under Triton's interpreter (slow: for a handful of moves).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from tik_evo.knob_moves import check_move, moves


def run(families: list[str], roles: set[str], device: str, level: str, seed: int, workers: int, budget_s: float,
        limit: int | None = None, log=print) -> dict[str, Any]:
    todo = [m for f in families for m in moves(f, roles)][:limit]
    log(f"{len(todo)} one-knob moves over {len(families)} families on {device} ({workers} workers)")
    results, t0 = [], time.time()
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        pending = {pool.submit(check_move, m, device, level, seed): m for m in todo}
        while pending:
            left = budget_s - (time.time() - t0)
            if left <= 0:
                break
            done, _ = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for fut in done:
                m = pending.pop(fut)
                try:
                    r = fut.result()
                except Exception as e:  # the worker died (a crash in a launch): name the move
                    r = {**m, "checks": 0, "failed": [], "error": f"worker died: {e}"[:400]}
                results.append(r)
                if r["failed"] or r["error"]:
                    what = r["error"] or ", ".join(f["name"] for f in r["failed"][:2])
                    log(f"  {r['family']} {r['knob']}={r['value']!r} ({r['role']}): {what}")
        for fut in pending:
            fut.cancel()
    unrun = [pending[f] for f in pending]
    fams = {}
    for f in families:
        mine = [r for r in results if r["family"] == f]
        fams[f] = {"moves": len(mine), "checks": sum(r["checks"] for r in mine),
                   "failed": [r for r in mine if r["failed"]], "errors": [r for r in mine if r["error"]],
                   "not_run": [m for m in unrun if m["family"] == f]}
        log(f"{f}: {len(mine)} moves, {fams[f]['checks']} checks, {len(fams[f]['failed'])} moves failed a check, "
            f"{len(fams[f]['errors'])} raised, {len(fams[f]['not_run'])} not run")
    return {"families": fams, "moves": len(todo), "seconds": round(time.time() - t0, 1),
            "all_passed": all(not v["failed"] and not v["not_run"] for v in fams.values())}


def main(argv: list[str] | None = None) -> int:
    import torch
    import triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("families", help="comma-separated family names, or 'all'")
    ap.add_argument("--out", default="knob_moves.json")
    ap.add_argument("--roles", default="contract,full,decode", help="knob roles to move (comma-separated)")
    ap.add_argument("--level", default="full", choices=["small", "full"], help="the families' check cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=420, help="moves not finished by then are listed as not run")
    ap.add_argument("--limit", type=int, default=None, help="only the first N moves (a smoke run)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU here; the moves' bits are a GPU question (--device cpu runs the interpreter)")
        return 2
    from tik_evo.families import available

    families = available() if args.families == "all" else args.families.split(",")
    unknown = [f for f in families if f not in available()]
    if unknown:
        print(f"error: no such families: {', '.join(unknown)} (have: {', '.join(available())})")
        return 2
    roles = set(args.roles.split(","))
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (Triton interpreter)",
              "torch": torch.__version__, "triton": triton.__version__, "level": args.level, "seed": args.seed,
              "roles": sorted(roles),
              **run(families, roles, args.device, args.level, args.seed, args.workers, args.budget_s, args.limit)}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
