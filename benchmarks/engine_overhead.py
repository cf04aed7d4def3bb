"""The engine's own time per step (store + scheduler + lineage, without the operator and the audit) over a long
run, with the audit replaced by a synthetic one: a host-side figure, measured on whatever machine runs it.

    tik-evo bench engine-overhead --campaign campaigns/h200_attention.yaml --offspring 200 --out F.json

The synthetic audit verifies every offspring at once and times each workload as the root's time scaled by a fixed
pseudo-random factor per (knob, value), so the search sees a landscape with promotions, limits and repeats, and
the run records exactly what a real one records. Nothing is compiled or run on a device.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import tik_evo.initialization as initialization
import tik_evo.loop as loop
from tik_evo.audit import AuditOutcome
from tik_evo.commands.run import run_campaign
from tik_evo.config import load_campaign
from tik_evo.knobs import read_knobs
from tik_evo.store import Store


def _factor(name: str, value) -> float:
    h = int(hashlib.sha256(f"{name}={value!r}".encode()).hexdigest()[:8], 16)
    return 0.93 + 0.14 * (h / 0xFFFFFFFF)  # each knob value 0.93-1.07x: the product spans a few tens of percent


def synthetic_audit(run_dir, job, static=None) -> AuditOutcome:
    t0 = time.perf_counter()  # its own time is the audit's, not the engine's (the step subtracts it)
    knobs = read_knobs(job.source)
    scale = 1.0
    for name, value in sorted(knobs.items()):
        scale *= _factor(name, value)
    measurements = {}
    for i, w in enumerate(job.workloads):  # phases react differently: decode to decode knobs, and so on
        t = 1e-4 * (1 + i % 7) * scale * _factor(w["name"], scale)
        measurements[w["name"]] = {"median_s": t, "spread": 0.002, "timer": "synthetic"}
    return AuditOutcome(stages=[{"name": "synthetic", "passed": True, "seconds": 0.0}], measurements=measurements,
                        device={"gpu": "synthetic"}, passed=True, seconds=time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaign", default="campaigns/h200_attention.yaml")
    ap.add_argument("--offspring", type=int, default=200)
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    initialization.run_audit = loop.run_audit = synthetic_audit
    run_dir = Path(tempfile.mkdtemp(prefix="tik_evo_overhead_")) / "run"
    cfg = load_campaign(args.campaign, [f"store.path={run_dir}", "gpu.name=any", "device=interpreter",
                                        f"search.max_evaluations={args.offspring}", "search.kappa_threshold=100000",
                                        "search.wall_time_s=100000", "search.max_duplicates=100000",
                                        "evaluate.graph_replay=off", *args.overrides])
    t0 = time.time()
    run_campaign(cfg, quiet=True)
    wall = time.time() - t0
    with Store.open_reader(run_dir) as store:
        st = store.state()
        steps = len(store.all("A"))
    over = [x * 1e3 for x in st.engine_overhead_s]
    tenth = max(1, len(over) // 10)
    result = {
        "date": datetime.date.today().isoformat(), "host": platform.processor() or platform.machine(),
        "python": platform.python_version(), "campaign": args.campaign, "overrides": args.overrides,
        "workloads": len(st.weights), "offspring": st.evaluations, "steps": steps, "duplicates": st.duplicates,
        "promotions": sum(1 for h in st.history if h.get("promoted")) - 1, "wall_s": round(wall, 2),
        "overhead_ms": {"mean": statistics.mean(over), "median": statistics.median(over),
                        "p90": sorted(over)[int(0.9 * (len(over) - 1))], "max": max(over),
                        "first_tenth_mean": statistics.mean(over[:tenth]),
                        "last_tenth_mean": statistics.mean(over[-tenth:])},
        "run_dir": str(run_dir),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
