"""What starting an audit's worker costs through a Ray task (evaluate.executor=ray) against the local executors,
on the CPU: the same audit (a family's root, checks only, under Triton's interpreter) run again and again by each.

    tik-evo bench ray-startup --audits 5 --out results/engine/cpu_ray_startup_DATE.json

Per audit, from the audit's own record (`device.phases`): `worker_start_s`, from the engine handing the job to
the executor to the worker's first line (for Ray: submitting the task, the task's start on its node, the
worker's start there); `worker_exit_s`, from the worker's verdict to the engine holding the result (for Ray: the
evidence files coming back); and `outside_stages_s`, the audit's wall time less its stages. The first audit of
each executor (a cold fork server or Ray worker) is reported apart from the rest. Ray runs on a local cluster at
127.0.0.1 started here (its start is reported too), with `evaluate.ray.executor` spawn and forkserver. Writes the
JSON and, beside it, a short .md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from importlib import metadata
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster on loopback, not the host's address

from tik_evo_bench.common import header, write_json

ARMS = (("spawn", {"executor": "spawn"}), ("forkserver", {"executor": "forkserver"}),
        ("ray+spawn", {"executor": "ray", "ray": {"address": "local", "executor": "spawn"}}),
        ("ray+forkserver", {"executor": "ray", "ray": {"address": "local", "executor": "forkserver"}}))
SMALL = [{"name": "full", "phase": "full", "tokens": 4, "hidden": 256},
         {"name": "decode", "phase": "decode", "batch": 2, "hidden": 256}]


def _audit(run_dir: Path, family, evaluate: dict, impl: str) -> dict:
    from tik_evo.audit import AuditJob, run_audit
    from tik_evo.store import source_hash

    src = family.root_source()
    ev = {"timeout_s": 300, "interpreter_reps": 1, "check_procs": 1, **evaluate}
    job = AuditJob(family, src, source_hash(src), impl, SMALL, [0], ev, "cpu", time=False)
    t0 = time.time()
    out = run_audit(run_dir, job)
    wall = time.time() - t0
    if not out.passed:
        raise SystemExit(f"{impl}: the root failed its audit ({out.failure_kind}): {out.failure[:500]}")
    phases = out.device.get("phases", {})
    stages = sum(s.get("seconds", 0.0) for s in out.stages)
    return {"wall_s": round(wall, 3), "outside_stages_s": round(wall - stages, 3),
            "worker_start_s": phases.get("worker_start_s"), "worker_exit_s": phases.get("worker_exit_s"),
            "ray": {k: v for k, v in out.device.get("ray", {}).items() if k in ("task_s", "before_worker_s", "lost")}
            or None}


def _summary(rows: list[dict]) -> dict:
    rest = rows[1:] or rows
    med = {k: round(statistics.median(r[k] for r in rest), 3) for k in ("worker_start_s", "worker_exit_s",
                                                                         "outside_stages_s", "wall_s")}
    return {"first": {k: rows[0][k] for k in med}, "median_after_first": med, "audits": rows}


def _markdown(data: dict, json_name: str) -> str:
    lines = [f"# Audit worker start-up: Ray tasks against the local executors ({data['date'][:10]}, CPU only)", "",
             f"`tik-evo bench ray-startup --audits {data['audits_per_arm']}` audits the `{data['family']}` root "
             "(checks only, Triton's interpreter, one process for the check stage) that many times per executor, "
             f"in one process. Host: {data['host']['cpu']} ({data['host']['cores']} cores), Python "
             f"{data['host']['python']}, torch {data['gpu_header']['torch']}, Triton {data['gpu_header']['triton']}, "
             f"Ray {data['ray_version']}; the Ray cluster is a local one at 127.0.0.1 with this host's CPUs, "
             f"started in {data['ray_cluster_start_s']} s. Data: [`{json_name}`]({json_name}).", "",
             "Seconds; the first audit of each executor (cold fork server or Ray worker) apart from the median of "
             "the others.", "",
             "| executor | worker start, first | worker start | worker exit | outside stages, first | outside stages "
             "| audit wall | host load (1 min) before, after |", "|---|---|---|---|---|---|---|---|"]
    for name, s in data["arms"].items():
        m, f = s["median_after_first"], s["first"]
        lines.append(f"| {name} | {f['worker_start_s']} | {m['worker_start_s']} | {m['worker_exit_s']} | "
                     f"{f['outside_stages_s']} | {m['outside_stages_s']} | {m['wall_s']} | "
                     f"{', '.join(map(str, s['load_1min']))} |")
    lines += ["", "`worker start`: the job handed to the executor → the worker's first line (for Ray: the task "
              "submitted, started on its node, and the worker started there). `worker exit`: the verdict written → "
              "the engine holding the result (for Ray: the evidence files returned and written by the engine). "
              "`outside stages`: the audit's wall time less its stages (for `spawn` it holds the fresh interpreter's "
              "imports, which happen before the worker's first line is timed). A host load above its cores means "
              "other jobs shared the CPUs. On a cluster the task's node is another "
              "host: the network adds to both ends, and a GPU node's figures are still to be measured.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audits", type=int, default=5, help="audits per executor (the first is reported apart)")
    ap.add_argument("--family", default="rmsnorm")
    ap.add_argument("--arms", default=",".join(a for a, _ in ARMS))
    ap.add_argument("--out", required=True, help="the JSON to write; the .md goes beside it")
    args = ap.parse_args(argv)
    os.environ["TRITON_INTERPRET"] = "1"
    import ray

    from tik_evo import ray_executor
    from tik_evo.audit import close_executors
    from tik_evo.families import load_family

    family = load_family(args.family)
    want = args.arms.split(",")
    data = {"date": header(gpu="cpu")["date"], "gpu_header": header(gpu="cpu"), "family": args.family,
            "audits_per_arm": args.audits, "ray_version": metadata.version("ray"),
            "host": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                     "python": platform.python_version()}, "arms": {}}
    with tempfile.TemporaryDirectory(prefix="tik_evo_ray_startup_") as tmp:
        t0 = time.time()
        ray_executor.connect({"ray": {"address": "local"}})
        data["ray_cluster_start_s"] = round(time.time() - t0, 2)
        try:
            for name, evaluate in ARMS:
                if name not in want:
                    continue
                if "ray" in evaluate:
                    evaluate = {**evaluate, "ray": {**evaluate["ray"], "scratch": str(Path(tmp) / "scratch")}}
                run_dir = Path(tmp) / name
                load = os.getloadavg()[0]
                rows = [_audit(run_dir, family, evaluate, f"I{i}") for i in range(args.audits)]
                close_executors()  # the next arm starts cold, as this one did
                data["arms"][name] = {**_summary(rows), "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)]}
                print(name, data["arms"][name]["first"], data["arms"][name]["median_after_first"], flush=True)
        finally:
            close_executors()
            ray.shutdown()
    out = write_json(args.out, data)
    md = out.with_suffix(".md")
    md.write_text(_markdown(data, out.name))
    print(f"wrote {out} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
