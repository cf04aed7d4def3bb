"""Every named family's own checks (its check_cases("full"): consistency between paths, fp32/fp64 reference,
backward where it has one) on the GPU with the family's root, over two seeds. Writes JSON: checks run, failures.
The audit runs the same checks on a candidate; this runs them on the roots after a root change.

    tik-evo bench family-checks linear,logprob --out family_checks.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

import torch

import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
from tik_evo_bench.common import header
from tik_evo_kernels.decoder import roots


def large_rows(rows: int = 16384, vocab: int = 151936, k: int = 256) -> dict:
    """Outputs past 2**31 elements (an lm_head over 16384 packed tokens at a 151936-wide vocabulary): linear_full's
    last rows must equal linear_decode on those rows alone and torch's fp32 matmul to bf16 accuracy, and the
    log-prob over those logits must equal its decode path's on the same rows."""
    from tik_evo import checks

    lin, lp_impl = roots(("linear", "logprob")).values()
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, k, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(vocab, k, generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    logits = torch.empty(rows, vocab, device="cuda", dtype=torch.bfloat16)
    lin.linear_full(x, w, None, logits)
    tail = torch.arange(rows - 64, rows, device="cuda")
    dec = torch.empty(64, vocab, device="cuda", dtype=torch.bfloat16)
    lin.linear_decode(x[tail].contiguous(), w, None, dec)
    target = torch.randint(0, vocab, (rows,), generator=g, device="cuda", dtype=torch.int32)
    lp, ent = (torch.empty(rows, device="cuda") for _ in range(2))
    lp_impl.logprob_full(logits, target, 1.0, lp, ent)
    dlp, dent = (torch.empty(64, device="cuda") for _ in range(2))
    lp_impl.logprob_decode(logits[tail].contiguous(), target[tail].contiguous(), 1.0, dlp, dent)
    out = [checks.bitwise("linear: last rows of a 2.5e9-element output == decode on them", logits[tail], dec),
           checks.reference("linear: last rows vs fp32 matmul", logits[tail], x[tail].float() @ w.float().t()),
           checks.bitwise("logprob: last rows of those logits == decode on them", lp[tail], dlp),
           checks.bitwise("logprob entropy: last rows == decode on them", ent[tail], dent)]
    return {"rows": rows, "vocab": vocab, "elements": rows * vocab,
            "checks": [c.to_dict() for c in out], "passed": all(c.passed for c in out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("families", help="comma-separated family names (kernels/<name>)")
    ap.add_argument("--out", default="family_checks.json")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--graphs", action="store_true",
                    help="also the audit's graph stage: the small cases with every forward entry point replayed "
                         "from a CUDA graph, bit-equal to its eager call (tik_evo.graph_replay)")
    ap.add_argument("--large", action="store_true",
                    help="also check linear and logprob on an output past 2**31 elements (needs about 15 GB)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this runs the families' checks on a CUDA GPU (the CPU run is the test suite)")
        return 2
    names = args.families.split(",")
    impls = roots(tuple(names))
    result = {**header(device=0),
              "families": {}}
    for name in names:
        fam = importlib.import_module(f"tik_evo_kernels.{name}").FAMILY
        t0, n, failed = time.time(), 0, []
        for case in fam.check_cases("full"):
            for seed in range(args.seeds):
                for c in fam.run_checks(impls[name], case, seed, "cuda"):
                    n += 1
                    if not c.passed:
                        failed.append({"case": case, "seed": seed, **c.to_dict()})
        result["families"][name] = {"checks": n, "failed": failed, "seconds": round(time.time() - t0, 1)}
        print(f"{name}: {n - len(failed)} of {n} checks passed in {time.time() - t0:.1f} s"
              + "".join(f"\n  FAILED {f['name']}: {f['details']}" for f in failed[:10]), flush=True)
        if args.graphs:
            from tik_evo.graph_replay import audit_checks

            t0 = time.time()
            got = audit_checks(fam, impls[name], 0, "cuda")
            bad = [c.to_dict() for c in got if not c.passed]
            replays = {c.name: c.details for c in got if c.name.startswith("graph replay")}
            result["families"][name]["graphs"] = {"checks": len(got), "failed": bad, "replays": replays,
                                                  "seconds": round(time.time() - t0, 1)}
            print(f"{name} from graph replays: {len(got) - len(bad)} of {len(got)} checks passed in "
                  f"{time.time() - t0:.1f} s" + "".join(f"\n  {k}: {v}" for k, v in replays.items())
                  + "".join(f"\n  FAILED {f['name']}: {f['details']}" for f in bad[:10]), flush=True)
    if args.large:
        result["large_rows"] = large_rows()
        print("large rows:", [(c["name"], c["passed"]) for c in result["large_rows"]["checks"]], flush=True)
    result["all_passed"] = (all(not f["failed"] and not f.get("graphs", {}).get("failed") for f in
                                result["families"].values())
                            and result.get("large_rows", {}).get("passed", True))
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
