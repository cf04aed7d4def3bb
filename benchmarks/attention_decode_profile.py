"""Where a decode program's time goes: the attention decode launches of some knob variants under Nsight Compute
(with --phase prefill: their prefill launches, cells BxS).

    ncu --profile-from-start off --section WarpStateStats ... -o REPORT \
        python3 -m tik_evo.cli bench attention-ncu run --variants-json F --cells 1x1024,16x8192 --order O.json
    tik-evo bench attention-ncu summarize --details D.csv --sass S.csv --order O.json --out X.json

`run` compiles and runs every (variant, cell) once outside the profiled window, then once more inside it
(cudaProfilerStart/Stop), so the report holds exactly each one's chunk and merge launches, in the order it writes
to --order. `summarize` reads the report's details page and per-instruction (SASS) page, both exported as CSV, into
one JSON: per launch its duration and stall reasons, and the SASS lines with the most stall samples.
`benchmarks/gpu_session.sh attention_ncu VARIANTS_JSON CELLS` does both in one device call. With --phase prefill
--cudnn, cuDNN SDPA runs each cell after ours; its launches are in the report, unlabelled (its kernels' names say
which they are).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(args: argparse.Namespace) -> None:
    import torch

    from tik_evo_kernels.attention.bench import HKV, HQ, D, load_variant

    table = json.loads(Path(args.variants_json).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="attention_profile_"))
    mods = {name: load_variant(name, changes, tmp)[0] for name, changes in table.items()}
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    calls = []
    if args.phase == "prefill":
        for B, S in cells:
            q = torch.randn((B, HQ, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
            k = torch.randn((B, HKV, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
            v = torch.randn((B, HKV, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
            for name, mod in mods.items():
                calls.append((f"{name} B{B} S{S}", mod.prefill, (q, k, v, 1 / math.sqrt(D), torch.empty_like(q))))
            if args.cudnn:  # the peer on the same inputs, as the bench calls it (GQA without expansion)
                calls.append((f"cudnn B{B} S{S}", _cudnn_prefill, (q, k, v, 1 / math.sqrt(D))))
        cells = []
    for B, ctx in cells:
        q = torch.randn((B, HQ, 1, D), generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn((B, HKV, ctx, D), generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn((B, HKV, ctx, D), generator=gen, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        out = torch.empty((B, HQ, 1, D), device="cuda", dtype=torch.bfloat16)
        for name, mod in mods.items():
            calls.append((f"{name} B{B} ctx{ctx}", mod.decode, (q, k, v, lens, 1 / math.sqrt(D), out)))
    for _, fn, a in calls:  # compile and warm outside the profiled window
        fn(*a)
        fn(*a)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, fn, a in calls:
        fn(*a)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    Path(args.order).write_text(json.dumps([c[0] for c in calls], indent=1))
    import datetime

    import triton

    Path(args.order).with_suffix(".meta.json").write_text(json.dumps({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}, indent=1))
    print("profiled", [c[0] for c in calls])


def _cudnn_prefill(q, k, v, scale):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


def _rows(path: Path) -> list[dict[str, str]]:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith('"')]
    return list(csv.DictReader(lines))


def summarize(args: argparse.Namespace) -> None:
    order = json.loads(Path(args.order).read_text())
    launches: dict[str, dict] = {}
    for r in _rows(Path(args.details)):
        key = r.get("ID", "?")
        entry = launches.setdefault(key, {"kernel": r.get("Kernel Name", "")[:60], "metrics": {}})
        name = f'{r.get("Section Name", "")}: {r.get("Metric Name", "")} [{r.get("Metric Unit", "")}]'
        entry["metrics"][name] = r.get("Metric Value", "")
    # Chunk launches are the odd-numbered ones when every config also launched a merge; label by order.
    labelled = {}
    chunk_ids = [k for k, v in launches.items() if args.kernel in v["kernel"]]
    ours = [c for c in order if not c.startswith("cudnn ")]  # the peer's launches have other kernel names
    for k, label in zip(chunk_ids, ours, strict=False):
        labelled[k] = label
    for k, v in launches.items():
        v["config"] = labelled.get(k, "")
    meta = Path(args.order).with_suffix(".meta.json")
    report = {**(json.loads(meta.read_text()) if meta.exists() else {}), "launches": launches}
    if args.sass and Path(args.sass).exists():
        hot: dict[str, list] = {}
        current = "?"
        for line in Path(args.sass).read_text(errors="replace").splitlines():
            if line.startswith("#kernel"):
                current = line.split(" ", 1)[1]
                hot[current] = []
                continue
            hot.setdefault(current, []).append(line)
        top = {}
        for kern, lines in hot.items():
            rows = list(csv.DictReader([ln for ln in lines
                                        if ln.startswith('"') and not ln.startswith('"Kernel Name"')]))
            if not rows:
                continue
            col = next((c for c in rows[0] if c and "Warp Stall Sampling (All" in c), None)
            if col is None:
                top[kern] = {"columns": [c for c in rows[0] if c]}
                continue

            def samples(r, col=col):
                try:
                    return float(r[col].replace(",", ""))
                except ValueError:
                    return 0.0
            total = sum(samples(r) for r in rows)
            best = sorted(rows, key=samples, reverse=True)[:40]
            top[kern] = {"total_samples": total,
                         "instructions_executed": sum(int(r["Instructions Executed"].replace(",", "") or 0)
                                                      for r in rows),
                         "top": [{"Source": r["Source"].strip(), "samples": samples(r)} for r in best]}
        report["sass_top"] = top
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"{len(launches)} launches summarised into {args.out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--variants-json", required=True)
    r.add_argument("--cells", default="1x1024,16x8192", help="BxCTX,... decode cells (32 q heads, 8 kv, d 128)")
    r.add_argument("--phase", choices=("decode", "prefill"), default="decode", help="prefill: cells are BxS")
    r.add_argument("--cudnn", action="store_true", help="prefill: cuDNN SDPA on each cell too (after ours)")
    r.add_argument("--order", required=True, help="JSON file listing the profiled configs in launch order")
    s = sub.add_parser("summarize")
    s.add_argument("--details", required=True)
    s.add_argument("--sass", default=None)
    s.add_argument("--order", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--kernel", default="_decode_kernel", help="name part of the launches --order labels")
    args = ap.parse_args(argv)
    (run if args.cmd == "run" else summarize)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
