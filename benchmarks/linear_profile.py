"""Where a linear launch's time goes: the linear family (its root, or knob variants) and cuBLAS on the same
(weight, rows) cells under Nsight Compute, launch by launch.

    ncu --profile-from-start off --section MemoryWorkloadAnalysis ... -o REPORT \
        python3 -m tik_evo.cli bench linear-ncu run --variants-json F \
            --cells qwen3-4b.o:256,qwen3-4b.qkv:16384 --order O.json
    tik-evo bench linear-ncu summarize --details D.csv --order O.json --out X.json

Cells name a weight of `tik_evo_bench.ops_matmul_gpu.LINEAR_SHAPES` (or a unique suffix of one, e.g. `o` or
`llama3-8b.down`) and the rows M; M <= 256 runs `linear_decode`, larger M `linear_full`, as the benchmark does.
Every (variant, cell) and cuBLAS on the cell run once outside the profiled window (compiling), then once inside
it (cudaProfilerStart/Stop). --order lists the profiled calls in launch order. `summarize` reads the report's
details page (CSV) and gives each launch its call: a call of ours is one launch, or two (K chunks, then their merge);
the launches between two of ours are cuBLAS's. `benchmarks/gpu_session.sh linear_ncu VARIANTS_JSON CELLS` does both
steps (VARIANTS_JSON `root`: the root alone).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tik_evo_kernels.linear.ncu import label_launches, parse_cells

ROOT = Path(__file__).resolve().parents[1]

DECODE_MAX_M = 256  # the benchmark's decode cells are M 1, 64 and 256


def summarize(args: argparse.Namespace) -> None:
    from tik_evo_bench.attention_decode_profile import _rows

    order = json.loads(Path(args.order).read_text())
    launches: dict[str, dict] = {}
    for r in _rows(Path(args.details)):
        entry = launches.setdefault(r.get("ID", "?"), {"kernel": r.get("Kernel Name", "")[:80], "metrics": {}})
        entry["metrics"][f'{r.get("Section Name", "")}: {r.get("Metric Name", "")} [{r.get("Metric Unit", "")}]'] = \
            r.get("Metric Value", "")
    for entry, label in zip(launches.values(), label_launches([e["kernel"] for e in launches.values()], order)):
        entry["call"] = label
    meta = Path(args.order).with_suffix(".meta.json")
    report = {**(json.loads(meta.read_text()) if meta.exists() else {}), "order": order, "launches": launches}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{len(launches)} launches of {len(order)} calls summarised into {args.out}")


def run(args: argparse.Namespace) -> None:
    import datetime

    import torch
    import triton

    from tik_evo_bench.ops_matmul_gpu import LINEAR_SHAPES, load

    cells = parse_cells(args.cells, LINEAR_SHAPES)
    variants = ({"root": {}} if args.variants_json in (None, "root")
                else json.loads(Path(args.variants_json).read_text()))
    mods = {name: load("linear", knobs) for name, knobs in variants.items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = []
    for name, n, k, m in cells:
        x = torch.randn((m, k), generator=gen, device="cuda", dtype=torch.bfloat16)
        w = torch.randn((n, k), generator=gen, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        for vname, mod in mods.items():
            fn = mod.linear_decode if m <= DECODE_MAX_M else mod.linear_full
            calls.append((f"{vname} {name} M{m}", lambda fn=fn, x=x, w=w, y=y: fn(x, w, None, y)))
        calls.append((f"cublas {name} M{m}", lambda x=x, w=w, y=y: torch.matmul(x, w.t(), out=y)))
    for _, fn in calls:  # compile and warm outside the profiled window
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, fn in calls:
        fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    Path(args.order).write_text(json.dumps([c[0] for c in calls], indent=1))
    Path(args.order).with_suffix(".meta.json").write_text(json.dumps({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "variants": variants}, indent=1))
    print("profiled", [c[0] for c in calls])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--variants-json", default=None, help="JSON {name: knob changes}; default (or 'root'): the root")
    r.add_argument("--cells", default="qwen3-4b.o:256,qwen3-4b.qkv:16384", help="WEIGHT:M,...")
    r.add_argument("--order", required=True, help="JSON file listing the profiled calls in launch order")
    s = sub.add_parser("summarize")
    s.add_argument("--details", required=True)
    s.add_argument("--order", required=True)
    s.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    (run if args.cmd == "run" else summarize)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
