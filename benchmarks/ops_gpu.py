"""GPU benchmark of the operator families: one entry point, suites register their families.

Each suite is a module in this folder, listed in ``SUITES`` with the families it covers. A suite either
defines ``run(families: list[str], out_dir: Path, extras=...) -> dict`` (``ops_rowwise_gpu``) or a ``main(argv)``
taking ``--out FILE``, ``--families`` and ``--extras JSON`` (``ops_matmul_gpu``: linear, logprob, moe_routing).
Missing suites are skipped, so each can be developed alone; each suite also runs on its own.

    tik-evo bench ops [--families rope,silu_mul] [--out DIR] [--dry-run]
        [--best RUN_DIR ...] [--kernel FAMILY=FILE ...]

``--best`` (a run directory of an operator family's campaign) and ``--kernel`` (a kernel file, e.g. from
`tik-evo kernel FAMILY ... -o FILE` or `tik-evo show RUN best -o FILE`) add implementations that are checked on
this GPU and timed beside the family's root and its peers on the same cells. Without ``--families`` only their
families run.

Imports only torch/triton/numpy (+ tik_evo.family/checks), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

SUITES = {
    "ops_rowwise_gpu": ("rmsnorm", "add_rmsnorm", "silu_mul", "rope", "qk_rmsnorm", "embedding", "kv_append"),
    "ops_matmul_gpu": ("linear", "logprob", "moe_routing"),
}
FAMILIES = tuple(f for fams in SUITES.values() for f in fams)


def extra_implementations(best: list[str], kernels: list[str], tmp: Path) -> dict[str, dict[str, str]]:
    """{family: {label: path}} of the implementations to time beside the roots (kernels/files.py reads and checks
    them); several per family get distinct labels."""
    from tik_evo_kernels.files import kernel_sources

    extras: dict[str, dict[str, str]] = {}
    for k in kernel_sources(best, kernels, FAMILIES, "attention: `tik-evo bench attention --best / --kernel`"):
        taken = extras.setdefault(k.family, {})
        label, n = k.stem, 2
        while label in taken:
            label, n = f"{k.stem}_{n}", n + 1
        path = tmp / f"{k.family}_{label}.py"
        path.write_text(k.source)
        taken[label] = str(path)
    return extras


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--families", default="", help="comma-separated family names (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON results")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU interpreter run of the suites at tiny sizes (the code paths, no measurement)")
    from tik_evo_kernels.files import KernelArgError, add_arguments

    add_arguments(ap, "checked and timed beside the root")
    args = ap.parse_args(argv)
    if args.dry_run:  # before any kernel module is imported (the --kernel checks import the families)
        os.environ["TRITON_INTERPRET"] = "1"
    out = Path(args.out)
    try:
        wanted = [f for f in args.families.split(",") if f] or None
        unknown = [f for f in wanted or [] if f not in FAMILIES]
        if unknown:
            raise KernelArgError(f"--families: {', '.join(unknown)} not benchmarked here (these are: "
                                 f"{', '.join(FAMILIES)})")
        out.mkdir(parents=True, exist_ok=True)
        extras = extra_implementations(args.best, args.kernel, Path(tempfile.mkdtemp(prefix="ops_extras_")))
    except (KernelArgError, OSError) as e:
        print(f"tik-evo bench ops: {e}", file=sys.stderr)
        return 2
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("tik-evo bench ops needs a CUDA GPU (--dry-run runs the suites' code paths on the CPU under the "
                  "Triton interpreter)", file=sys.stderr)
            return 2
    if extras and wanted is None:
        wanted = list(extras)  # a run's best or a file: its family alone, unless --families says otherwise
    missing = [f for f in extras if f not in wanted]
    if missing:
        print(f"tik-evo bench ops: --families leaves out {', '.join(missing)}, the family of a --best / --kernel",
              file=sys.stderr)
        return 2
    results = {}
    for suite, families in SUITES.items():
        fams = [f for f in families if wanted is None or f in wanted]
        if not fams:
            continue
        try:
            mod = importlib.import_module(f"tik_evo_bench.{suite}")
        except ModuleNotFoundError as e:
            if e.name == f"tik_evo_bench.{suite}":
                continue
            raise
        if args.dry_run:
            if not hasattr(mod, "_dry_run_setup"):
                print(f"{suite} ({', '.join(fams)}): no dry run (GPU only); skipped")
                continue
            mod._dry_run_setup()
        mine = {f: extras[f] for f in fams if f in extras}
        if hasattr(mod, "run"):
            results[suite] = mod.run(fams, out, extras=mine)
        else:  # a suite with its own command line
            results[suite] = {"rc": mod.main(["--out", str(out / f"{suite}.json"), "--families", ",".join(fams),
                                              "--extras", json.dumps(mine)]),
                              "json": f"{suite}.json"}
    (out / "ops_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
