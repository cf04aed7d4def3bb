"""Every named family's own checks (its check_cases("full"): consistency between paths, fp32/fp64 reference,
backward where it has one) on the GPU with the family's root, over two seeds. Writes JSON: checks run, failures.
The audit runs the same checks on a candidate; this runs them on the roots after a root change.

    PYTHONPATH=$PWD python3 benchmarks/family_checks_gpu.py linear,logprob --out family_checks.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import time
from pathlib import Path

import torch
import triton

from kernels.decoder import roots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("families", help="comma-separated family names (kernels/<name>)")
    ap.add_argument("--out", default="family_checks.json")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this runs the families' checks on a CUDA GPU (the CPU run is the test suite)")
        return 2
    names = args.families.split(",")
    impls = roots(tuple(names))
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "families": {}}
    for name in names:
        fam = importlib.import_module(f"kernels.{name}").FAMILY
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
    result["all_passed"] = all(not f["failed"] for f in result["families"].values())
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
