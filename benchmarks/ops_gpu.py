"""GPU benchmark of the operator families: one entry point, suites register their families.

Each suite is a module in this folder, listed in ``SUITES`` with the families it covers. A suite either
defines ``run(families: list[str], out_dir: Path) -> dict`` (``ops_rowwise_gpu``) or a ``main(argv)`` taking
``--out FILE`` (``ops_matmul_gpu``: linear, logprob, moe_routing; run whole). Missing suites are skipped, so
each can be developed alone; each suite also runs on its own.

    PYTHONPATH=$PWD python3 benchmarks/ops_gpu.py [--families rope,silu_mul] [--out DIR] [--dry-run]

Imports only torch/triton/numpy (+ tik_evo.family/checks), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

SUITES = {
    "ops_rowwise_gpu": ("add_rmsnorm", "silu_mul", "rope", "qk_rmsnorm", "embedding", "kv_append"),
    "ops_matmul_gpu": ("linear", "logprob", "moe_routing"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--families", default="", help="comma-separated family names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON results")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter run of the suites that support it")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    wanted = [f for f in args.families.split(",") if f] or None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for suite, families in SUITES.items():
        fams = [f for f in families if wanted is None or f in wanted]
        if not fams:
            continue
        try:
            mod = importlib.import_module(suite)
        except ModuleNotFoundError as e:
            if e.name == suite:
                continue
            raise
        if args.dry_run:
            if not hasattr(mod, "_dry_run_setup"):
                continue
            mod._dry_run_setup()
        if hasattr(mod, "run"):
            results[suite] = mod.run(fams, out)
        else:  # a suite with its own command line: run it whole
            results[suite] = {"rc": mod.main(["--out", str(out / f"{suite}.json")]),
                              "json": f"{suite}.json"}
    (out / "ops_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
