"""Our row-wise kernels against Liger's, launch by launch under Nsight Compute.

The graph-replay bench (`ops_rowwise_gpu.py`) times each implementation on its own rotated input sets, so what sits
in L2 differs between them and from call to call: Liger's rope at decode B256 read 2.54 µs in three calls and
2.81 µs in a fourth, while the rounds inside each call agreed to 1-2%. Here each cell's implementations run one
launch at a time, alternated `--reps` times, under ncu. With `--cache-control all` every launch starts from flushed
caches. With `none` each finds what the launches before it left. Clocks are locked at base, so durations compare,
not their absolute values.

    ncu --profile-from-start off --cache-control all --metrics gpu__time_duration.sum,dram__bytes_read.sum,... \
        --csv --page raw -o R python3 -m tik_evo.cli bench rowwise-ncu run --cells rope:qwen3-4b.decode.B256 \
        --order O.json
    ncu --import R.ncu-rep --page raw --csv --print-units base > R.csv
    tik-evo bench rowwise-ncu summarize --csv R.csv --order O.json --out X.json

`run --extras '{"family": {"label": "kernel.py"}}'` profiles kernel files (e.g. a knob variant) beside the root in
that family's cells, after the rowwise bench's checks. Each labelled call must be a single launch. `summarize`
refuses a report whose launch count differs from the order's. `benchmarks/gpu_session.sh rowwise_ncu CELLS` does
both, for both cache modes, in one device call. `run --dry-run` exercises the calls on the CPU under the
interpreter (no profiler).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parents[1]

# One launch each: the peers' single-kernel calls and our kernel's other entry forms (rope from pre-gathered rows,
# in place as Liger rotates; silu_mul on Liger's two separate inputs). torch eager launches several, so it is left out.
SINGLE_LAUNCH = ("liger", "root_inplace", "root_rows", "root_separate")
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")


def calls_for(cell: str, rowwise, liger, extras: dict[str, str] | None = None) -> list[tuple[str, object]]:
    """[(label, zero-argument call)] for one `family:workload` cell: our root on the family's bench inputs first,
    then each `extras` kernel file {label: path} of the family the same way (loaded and checked by the rowwise
    bench: one that does not load is left out, failed checks are printed), then each single-launch peer on the
    rowwise bench's inputs."""
    import importlib

    import yaml

    family, _, name = cell.partition(":")
    if family not in rowwise.FAMILIES:
        raise SystemExit(f"--cells {cell!r}: unknown family {family!r} (row-wise families: "
                         f"{', '.join(rowwise.FAMILIES)})")
    path = ROOT / "workloads" / f"{family}{rowwise.WORKLOADS}.yaml"
    table = {w["name"]: w for w in yaml.safe_load(path.read_text())["workloads"]}
    if name not in table:
        raise SystemExit(f"--cells {cell!r}: no workload {name!r} in {path.relative_to(ROOT)} "
                         f"(it has {', '.join(table)})")
    w = table[name]
    fam = importlib.import_module(f"tik_evo_kernels.{family}").FAMILY
    fam_mod = importlib.import_module(f"tik_evo_kernels.{family}.family")
    impl = rowwise.load_root(family)
    peers = rowwise.peer_set(family, w, liger, fam_mod, 123, impl)
    checked: dict = {}
    ours = {"root": impl, **rowwise.load_extras(family, fam, extras or {}, checked)}
    for label, info in checked.get("extras", {}).items():
        c = info.get("consistency")
        if c and c["failed"]:
            print(f"{cell} {label}: {len(c['failed'])} of {c['checks']} checks failed; profiled anyway", flush=True)
    return [(f"{cell} {label}", fam.make_bench(m, w, 0, rowwise.DEVICE).run) for label, m in ours.items()] + [
        (f"{cell} {k}", peers[k]) for k in SINGLE_LAUNCH if k in peers]


def run(args: argparse.Namespace) -> None:
    import torch
    import triton

    from tik_evo.candidate import load_module

    rowwise = load_module(ROOT / "benchmarks" / "ops_rowwise_gpu.py", "rowwise_for_ncu")
    if args.dry_run:  # the families' tiny workloads/<family>_cpu.yaml cells
        rowwise._dry_run_setup()
    liger = rowwise.load_liger()
    calls = [c for cell in args.cells.split(",") if cell
             for c in calls_for(cell, rowwise, liger, (args.extras or {}).get(cell.partition(":")[0]))]
    sync = torch.cuda.synchronize if rowwise.DEVICE == "cuda" else (lambda: None)
    for _, fn in calls:  # compile and warm outside the profiled window
        fn()
        fn()
    sync()
    order = []
    if rowwise.DEVICE == "cuda":
        torch.cuda.profiler.start()
    for _ in range(args.reps):  # alternated, so a drifting clock or neighbour falls on every implementation
        for label, fn in calls:
            fn()
            sync()
            order.append(label)
    if rowwise.DEVICE == "cuda":
        torch.cuda.profiler.stop()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name() if rowwise.DEVICE == "cuda" else "cpu (interpreter dry run)",
            "torch": torch.__version__, "triton": triton.__version__, "liger": liger and liger["version"],
            "reps": args.reps}
    Path(args.order).write_text(json.dumps({"meta": meta, "order": order}, indent=1))
    print(f"profiled {len(calls)} calls x {args.reps}: {', '.join(label for label, _ in calls)}")


def read_launches(path: Path) -> list[dict[str, str]]:
    """The rows of an `ncu --page raw --csv` export, one per launch in launch order (the units row dropped)."""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith('"')]
    return [r for r in csv.DictReader(lines) if r.get("ID", "").strip().isdigit()]


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text and text.strip() not in ("", "n/a") else float("nan")


def summarize(args: argparse.Namespace) -> dict:
    saved = json.loads(Path(args.order).read_text())
    order, launches = saved["order"], read_launches(Path(args.csv))
    if len(launches) != len(order):
        raise SystemExit(f"{args.csv}: {len(launches)} launches profiled, {args.order} lists {len(order)} calls: "
                         "a call that is not a single launch breaks the labelling")
    cells: dict[str, dict] = {}
    for label, r in zip(order, launches):
        cell, _, impl = label.rpartition(" ")
        e = cells.setdefault(cell, {}).setdefault(impl, {"kernel": r.get("Kernel Name", "")[:80], "us": []})
        if e["kernel"] != r.get("Kernel Name", "")[:80]:
            raise SystemExit(f"{args.csv}: {label} launched {r.get('Kernel Name')!r} and {e['kernel']!r}")
        e["us"].append(_number(r.get("gpu__time_duration.sum", "")) / 1e3)  # ncu reports ns
        for m in METRICS[1:]:
            e.setdefault(m, []).append(_number(r.get(m, "")))
    for impls in cells.values():
        for e in impls.values():
            e["median_us"] = statistics.median(e["us"])
        base = impls["root"]["median_us"]
        for e in impls.values():
            e["root_over_this"] = base / e["median_us"]
    report = {**saved["meta"], "cache_control": args.cache, "cells": cells}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"ncu, caches {args.cache} ({report.get('gpu')}): median µs per launch, root / it")
    for cell, impls in cells.items():
        print(f"  {cell}: " + "  ".join(f"{k} {e['median_us']:.2f} ({e['root_over_this']:.3f})"
                                        for k, e in impls.items()))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run each cell's implementations, alternated, inside the profiled window")
    r.add_argument("--cells", required=True, help="family:workload,... (workloads/<family>_models.yaml names)")
    r.add_argument("--extras", type=json.loads, default=None,
                   help='JSON {family: {label: kernel file}}: profiled beside the root in that family\'s cells')
    r.add_argument("--reps", type=int, default=7)
    r.add_argument("--order", required=True, help="JSON written here: the launches' labels in order")
    r.add_argument("--dry-run", action="store_true",
                   help="CPU interpreter, no profiler, cells from workloads/<family>_cpu.yaml: the calls only")
    s = sub.add_parser("summarize", help="label an `ncu --page raw --csv` export by the order and compare")
    s.add_argument("--csv", required=True)
    s.add_argument("--order", required=True)
    s.add_argument("--cache", default="all", help="the --cache-control the report was taken with (recorded)")
    s.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "run":
        if args.reps < 1:
            ap.error(f"--reps {args.reps}: must be at least 1")
        run(args)
    else:
        summarize(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
