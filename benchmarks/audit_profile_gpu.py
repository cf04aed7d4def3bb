"""Where an audit's correctness stages spend their time, on a GPU: per check case and seed, with a cold Triton
cache (compilation included) and again warm, for some knob sets of a family; and the same checks split over
several processes sharing one cold cache.

    tik-evo bench audit-profile --family attention --knobs '{"root": {}}' --procs 1,4 --out F.json

Each measurement runs in a fresh interpreter (Triton reads TRITON_CACHE_DIR at import), as an audit worker
does. Nothing is timed but the correctness checks: the timing stage's cost is set by the campaign's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> None:
    """Run the given (case, seed) tasks of the family's "full" level; print one JSON line per task."""
    t0 = time.time()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # a smoke run of this script: the Triton interpreter
        from tik_evo import interp

        interp.install()
    from tik_evo.candidate import load_module
    from tik_evo.families import load_family
    from tik_evo.knobs import read_knobs, write_knobs

    t_import = time.time() - t0
    family = load_family(args.family)
    src = family.root_source()
    path = Path(tempfile.mkdtemp()) / "cand.py"
    path.write_text(write_knobs(src, {**read_knobs(src), **json.loads(args.child_knobs)}))
    impl = load_module(path, "cand")
    torch.zeros(1, device=device)
    t_ready = time.time() - t0
    cases = family.check_cases("full")
    for task in args.tasks.split(","):
        ci, seed = (int(x) for x in task.split(":"))
        t1 = time.time()
        checks = family.run_checks(impl, cases[ci], seed, device)
        if device == "cuda":
            torch.cuda.synchronize()
        print(json.dumps({"case": ci, "seed": seed, "s": time.time() - t1, "checks": len(checks),
                          "failed": sum(not c.passed for c in checks)}), flush=True)
    print(json.dumps({"import_s": t_import, "ready_s": t_ready, "total_s": time.time() - t0}), flush=True)


def spawn(family: str, knobs: dict, tasks: list[str], cache: str) -> subprocess.Popen:
    env = {**os.environ, "TRITON_CACHE_DIR": cache, **({} if _cuda() else {"TRITON_INTERPRET": "1"}),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "tik_evo.cli", "bench", "audit-profile", "--child", "--family",
                             family, "--child-knobs", json.dumps(knobs), "--tasks", ",".join(tasks)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def collect(procs: list[subprocess.Popen]) -> tuple[list[dict], list[dict], list[str]]:
    tasks, totals, errors = [], [], []
    for p in procs:
        out, err = p.communicate()
        for line in out.splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                (tasks if "case" in d else totals).append(d)
        if p.returncode:
            errors.append(err[-800:])
    return tasks, totals, errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--family", default="attention")
    ap.add_argument("--knobs", default='{"root": {}}', help="JSON {name: knob changes}, or a file of it")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--procs", default="1,4", help="process counts for the cold split runs (1 = serial)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--child-knobs", default="{}")
    ap.add_argument("--tasks", default="")
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0

    import torch
    import triton

    from tik_evo.families import load_family

    n_cases = len(load_family(args.family).check_cases("full"))
    seeds = [int(s) for s in args.seeds.split(",")]
    all_tasks = [f"{c}:{s}" for c in range(n_cases) for s in seeds]
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
              "torch": torch.__version__, "triton": triton.__version__, "family": args.family, "seeds": seeds,
              "cases": load_family(args.family).check_cases("full"), "runs": []}
    table = json.loads(Path(args.knobs).read_text() if args.knobs.endswith(".json") else args.knobs)
    for name, knobs in table.items():
        for n in (int(p) for p in args.procs.split(",")):
            cache = tempfile.mkdtemp(prefix="triton_cache_")
            for temp in ("cold", "warm") if n == 1 else ("cold",):
                t0 = time.time()
                shares = [all_tasks[i::n] for i in range(n)]
                tasks, totals, errors = collect([spawn(args.family, knobs, s, cache) for s in shares if s])
                run = {"variant": name, "knobs": knobs, "procs": n, "cache": temp, "wall_s": time.time() - t0,
                       "tasks": sorted(tasks, key=lambda d: (d["case"], d["seed"])), "processes": totals,
                       "errors": errors}
                report["runs"].append(run)
                print(f"{name:>10} procs {n} {temp:>4}: wall {run['wall_s']:6.1f} s; checks "
                      f"{sum(t['checks'] for t in tasks)} ({sum(t['failed'] for t in tasks)} failed); per case "
                      + " ".join(f"{t['case']}:{t['seed']}={t['s']:.1f}" for t in run["tasks"])
                      + (f"; import {totals[0]['import_s']:.1f} s, "
                         f"ready {totals[0]['ready_s']:.1f} s" if totals else "")
                      + (f"; ERRORS {errors}" if errors else ""), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
