"""Audits per minute of campaign runs, from their exports: what `evaluate.screen` and `evaluate.in_flight` buy.

    tik-evo bench audit-throughput base=RUN_A.jsonl.gz screen=RUN_B.jsonl.gz ... --out F.json

Each argument is LABEL=EXPORT (`tik-evo export RUN -o F.jsonl`, gzipped or not). Per run: offspring audited (the
root's audit left out: every arm pays it once), the wall time from the root's verdict to the run's end, offspring
per minute over it, the GPU held by audits (the sum of `gpu_lock` holds where audits were in flight), failures by
kind, the stages' mean seconds, and the Triton compiles the check shards made while holding the GPU (misses and
seconds: what compiling ahead did not cover). Writes F.json and F.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import Counter
from pathlib import Path

from tik_evo.records import from_dict
from tik_evo.report import offspring_audits, throughput_figures


def read_export(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def summarize(records: list[dict]) -> dict:
    state = next((r for r in records if r.get("type") == "state"), None)
    if state is None:
        raise ValueError("no state record: not a `tik-evo export` of a run")
    audits = [from_dict(r) for r in records if r.get("type") == "audit"]
    offspring = offspring_audits(audits, state.get("root"))
    wall = float(state["budgets"]["wall_s"])
    root_s = next((a.seconds for a in audits if a.impl == state.get("root")), 0.0)
    figures = throughput_figures(audits, state.get("root"), wall)  # what `tik-evo status` prints
    stages: dict[str, list[float]] = {}
    misses = compile_s = 0.0
    for a in offspring:
        for s in a.stages:
            stages.setdefault(s["name"], []).append(float(s.get("seconds", 0.0)))
        for shard in (a.device.get("phases") or {}).get("shard_runners") or []:
            tc = (shard.get("runner") or {}).get("triton_compile") or {}
            misses += tc.get("misses", 0)
            compile_s += tc.get("seconds", 0.0)
    holds = [a.device["gpu_lock"]["released_at"] - a.device["gpu_lock"]["acquired_at"]
             for a in offspring if (a.device.get("gpu_lock") or {}).get("released_at")]
    n = len(offspring)
    return {"offspring": n, "wall_s": wall, "root_audit_s": root_s, "wall_after_root_s": max(wall - root_s, 1e-9),
            "offspring_per_min": figures[0] if figures else 0.0,
            "offspring_per_min_incl_root": 60.0 * n / wall if wall else 0.0,
            "failures_by_kind": dict(Counter(a.failure_kind or "verified" for a in offspring)),
            "stage_mean_s": {k: statistics.mean(v) for k, v in stages.items()},
            "stage_count": {k: len(v) for k, v in stages.items()},
            "gpu_held_s": sum(holds) if holds else None,
            "shard_compile_misses_per_offspring": misses / n if n else None,
            "shard_compile_s_per_offspring": compile_s / n if n else None,
            "root_objective": state.get("root_objective"), "best_objective": state.get("best_objective"),
            "device": state.get("device_facts", {})}


def markdown(out: dict) -> str:
    lines = ["| run | offspring | wall s (after the root) | offspring / min | screened | not stopped | GPU held s | "
             "shard compiles per offspring (misses, s) | mean stage s |", "|---|---|---|---|---|---|---|---|---|"]
    for label, s in out["runs"].items():
        fk = s["failures_by_kind"]
        stages = ", ".join(f"{k} {v:.1f}" for k, v in s["stage_mean_s"].items() if k not in ("static", "outcome"))
        held = "" if s["gpu_held_s"] is None else f"{s['gpu_held_s']:.0f}"
        comp = "" if s["shard_compile_misses_per_offspring"] is None else \
            f"{s['shard_compile_misses_per_offspring']:.1f}, {s['shard_compile_s_per_offspring']:.1f}"
        lines.append(f"| {label} | {s['offspring']} | {s['wall_s']:.0f} ({s['wall_after_root_s']:.0f}) | "
                     f"{s['offspring_per_min']:.2f} | {fk.get('screened', 0)} | {fk.get('verified', 0)} | {held} | "
                     f"{comp} | {stages} |")
    base = next(iter(out["runs"].values()))
    lines += ["", "Offspring per minute against the first run: " + ", ".join(
        f"{k} {s['offspring_per_min'] / base['offspring_per_min']:.2f}x" for k, s in out["runs"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tik-evo bench audit-throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=EXPORT")
    ap.add_argument("--out", required=True, help="the JSON summary (the Markdown table beside it, .md)")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep or not label:
            ap.error(f"{item!r}: expected LABEL=EXPORT")
        try:
            runs[label] = summarize(read_export(Path(path)))
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {path}: {e}")
            return 2
    out = {"runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
