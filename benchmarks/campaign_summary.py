"""Summarise a finished run directory as a results file: root vs best per workload, checks passed,
engine overhead per step, environment, as OUT.json and OUT.md.

    tik-evo bench campaign-summary RUN_DIR OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from tik_evo.config import start_label
from tik_evo.store import Store


def summarise(run_dir: Path) -> dict:
    store = Store.open_reader(run_dir)
    snap = store.snapshot()
    st = snap["state"]
    audits = {a.impl: a for a in snap["U"]}
    best, root = st["best"], st["root"]
    checks = [c for s in audits[best].stages for c in s.get("checks", [])]
    consistency = [c for c in checks if c["kind"] == "consistency"]
    over = st.get("engine_overhead_s") or [0.0]
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "campaign": (run_dir / "config.yaml").read_text().split("\n", 1)[0],
        "device": audits[root].device,
        "family": st["family"],
        "root": root, "best": best, "start": start_label(st.get("start") or {}),
        "root_objective": st["root_objective"], "best_objective": st["best_objective"],
        "speedup_objective": st["root_objective"] / st["best_objective"],
        "evaluations": st["evaluations"], "duplicates": st["duplicates"], "kappa": st["kappa"],
        "failures_by_kind": st["failures_by_kind"], "finished": st["finished"],
        "wall_s": st["budgets"]["wall_s"],
        "engine_overhead_ms": {"mean": statistics.mean(over) * 1e3, "max": max(over) * 1e3, "steps": len(over)},
        "best_knobs": next(i.knobs for i in snap["I"] if i.id == best),
        "workloads": {n: {"root_s": st["root_latencies"][n], "best_s": m["median_s"],
                          "speedup": st["root_latencies"][n] / m["median_s"], "timer": m["timer"],
                          "spread": m["spread"],
                          "GBps": (m.get("bytes") or 0) / m["median_s"] / 1e9}
                      for n, m in audits[best].measurements.items()},
        "best_checks": {"total": len(checks), "passed": sum(c["passed"] for c in checks),
                        "bitwise_consistency": len(consistency),
                        "bitwise_passed": sum(c["passed"] for c in consistency)},
        "audit_seconds_mean": statistics.mean(a.seconds for a in snap["U"]),
    }
    store.close()
    return out


def markdown(s: dict) -> str:
    lines = [f"# {s['family']} campaign on {s['device'].get('gpu')} ({s['date']})", "",
             f"torch {s['device'].get('torch')}, triton {s['device'].get('triton')}; {s['evaluations']} audited "
             f"offspring, {s['duplicates']} repeats; finished: {(s['finished'] or {}).get('reason')}"
             + (f"; the root is the family's with start {s['start']}" if s["start"] else ""), "",
             f"Objective (normalised or summed, per the campaign) root {s['root_objective']:.6g} → best "
             f"{s['best_objective']:.6g}: **{s['speedup_objective']:.3f}×** ({s['root']} → {s['best']}, knobs "
             f"{s['best_knobs']})", "",
             f"Best's checks: {s['best_checks']['passed']}/{s['best_checks']['total']} passed, of which "
             f"{s['best_checks']['bitwise_passed']}/{s['best_checks']['bitwise_consistency']} bitwise consistency "
             f"checks (bf16 and fp32).", "",
             f"Engine overhead per step (store + scheduler): mean {s['engine_overhead_ms']['mean']:.1f} ms, "
             f"max {s['engine_overhead_ms']['max']:.1f} ms; mean audit {s['audit_seconds_mean']:.1f} s.", "",
             "| workload | root | best | speed-up | GB/s | timer |", "|---|---|---|---|---|---|"]
    for n, w in s["workloads"].items():
        lines.append(f"| {n} | {w['root_s'] * 1e6:.2f} µs | {w['best_s'] * 1e6:.2f} µs | {w['speedup']:.3f}× | "
                     f"{w['GBps']:.0f} | {w['timer']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("out", type=Path, help="the JSON summary (the Markdown table beside it, .md)")
    args = ap.parse_args(argv)
    summary = summarise(args.run_dir)
    args.out.write_text(json.dumps(summary, indent=1))
    args.out.with_suffix(".md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
