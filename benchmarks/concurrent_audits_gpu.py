"""Concurrent audits on several GPUs of one host: what `evaluate.gpus` buys, and what it risks.

1. The family's root audited on every GPU, one after another: its per-workload median on each GPU against the
   first's. A run with `evaluate.gpus` judges each GPU's audits against that GPU's own root timings; this
   spread is the error it would carry with one anchor for all.
2. The same campaign run with one GPU and with all of them, to the same evaluation budget: wall time, audits
   per minute, the speed-up found.
3. With --in-flight N, on one GPU: the campaign with one audit at a time against N in flight, each compiling its
   kernels ahead with no GPU while another holds the card (audits per minute, the warm passes, the waits):
   `tik-evo bench concurrent-audits campaigns/h200_attention.yaml --in-flight 4 --evals 24 --out F.json`.

Usage (a machine with 2+ GPUs): tik-evo bench concurrent-audits campaigns/h200_rmsnorm.yaml \
    --evals 16 --out results/engine/concurrent_audits.json
Without a GPU, --interpret runs the same steps under the interpreter (evaluate.parallel) as a smoke test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent

from tik_evo.audit import AuditJob, run_audit  # noqa: E402
from tik_evo.config import load_campaign  # noqa: E402
from tik_evo.families import load_family  # noqa: E402
from tik_evo.store import Store, source_hash  # noqa: E402
from tik_evo.workloads import resolve_workloads  # noqa: E402


def root_on_each(cfg, slots: list[int], device: str, work: Path) -> dict:
    """The root audited with timing on each slot in turn: per-workload medians and each slot's ratio to the first."""
    family = load_family(cfg.kernel)
    workloads = resolve_workloads(cfg, family)
    src = family.root_source()
    per_slot = {}
    for i, gpu in enumerate(slots):
        out = run_audit(work / f"root_gpu{gpu}_{i}", AuditJob(
            family, src, source_hash(src), "I0", workloads, list(cfg.correctness.seeds),
            OmegaConf.to_container(cfg.evaluate), device, gpu, slot=i))
        if not out.passed:
            raise SystemExit(f"root audit on slot {i} (GPU {gpu}) failed: {out.failure_kind}: {out.failure[:300]}")
        per_slot[str(gpu) if device == "cuda" else f"cpu{i}"] = {n: m["median_s"] for n, m in out.measurements.items()}
    first = next(iter(per_slot.values()))
    ratios = {k: {n: t / first[n] for n, t in v.items()} for k, v in per_slot.items()}
    worst = max(abs(r - 1) for v in ratios.values() for r in v.values())
    return {"median_s": per_slot, "ratio_to_first": ratios, "max_abs_deviation": worst}


def run_campaign(campaign: str, overrides: list[str], run_dir: Path, timeout_s: float) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "tik_evo.cli", "run", campaign, *overrides,
                           f"store.path={run_dir}", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s)
    wall = time.time() - t0
    if proc.returncode != 0:
        return {"overrides": overrides, "rc": proc.returncode, "error": proc.stderr[-1500:]}
    with Store.open_reader(run_dir) as s:
        st, audits = s.state(), s.all("U")
    return {"overrides": overrides, "rc": 0, "process_wall_s": wall, "search_wall_s": st["budgets"]["wall_s"],
            "evaluations": st["evaluations"], "audits_per_min": 60 * st["evaluations"] / st["budgets"]["wall_s"],
            "audit_s_median": statistics.median(u.seconds for u in audits[1:]) if len(audits) > 1 else None,
            "speedup": st["root_objective"] / st["best_objective"], "best": st["best"],
            "failures_by_kind": st["failures_by_kind"], "finished": st["finished"]["reason"],
            "gpus_used": sorted({u.device.get("gpu_index") for u in audits if u.device.get("gpu_index") is not None}),
            **_warm_summary(audits)}


def _warm_summary(audits) -> dict:
    """Compile ahead and the GPU lock, over the offspring's audits: medians of the warm pass's seconds and the
    cubins its cache held, and of the wait for the GPU."""
    warm = [u.device["warm"] for u in audits if u.device.get("warm")]
    waits = [u.device["gpu_lock"]["waited_s"] for u in audits if u.device.get("gpu_lock", {}).get("waited_s")
             is not None]
    out: dict = {}
    if warm:
        out["warm"] = {"audits": len(warm), "seconds_median": statistics.median(w.get("seconds", 0) for w in warm),
                       "cubins_median": statistics.median(w.get("cubins", 0) for w in warm),
                       "with_errors": sum(1 for w in warm if w.get("error") or w.get("failed"))}
    if waits:
        out["gpu_lock_wait_s_median"] = statistics.median(waits)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("campaign")
    p.add_argument("--evals", type=int, default=16, help="evaluation budget of each run")
    p.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: every visible one)")
    p.add_argument("--interpret", action="store_true", help="no GPU: the interpreter with evaluate.parallel")
    p.add_argument("--in-flight", type=int, default=0, help="one GPU: evaluate.in_flight=1 against this many "
                   "audits in flight, each compiling ahead (evaluate.warm) while another holds the GPU")
    p.add_argument("--timeout-s", type=float, default=500, help="per run")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    extra = [f"search.max_evaluations={args.evals}", f"search.kappa_threshold={args.evals}"]
    if args.in_flight > 1:  # one GPU (or the interpreter, compiling for sm_90 ahead): audits in flight
        device = "cpu" if args.interpret else "cuda"
        names = ["interpreter"] if args.interpret else [torch.cuda.get_device_name(0)]
        warm = ["gpu.policy=interpret", "evaluate.warm=on", "evaluate.warm_capability=[9,0]"] if args.interpret \
            else ["evaluate.warm=auto"]
        one, many = [*extra, *warm, "evaluate.in_flight=1"], [*extra, *warm, f"evaluate.in_flight={args.in_flight}"]
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "gpus": names, "torch": torch.__version__, "triton": triton.__version__,
                  "campaign": args.campaign, "evals": args.evals, "device": device, "in_flight": args.in_flight}
        work = Path(tempfile.mkdtemp(prefix="in_flight_"))
        try:
            result["runs"] = {label: run_campaign(args.campaign, ov, work / label, args.timeout_s)
                              for label, ov in (("one", one), (f"{args.in_flight}_in_flight", many))}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for label, r in result["runs"].items():
            print(label, {k: r.get(k) for k in ("rc", "evaluations", "search_wall_s", "audits_per_min",
                                                "audit_s_median", "warm", "gpu_lock_wait_s_median", "error")})
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
        return 0 if all(r["rc"] == 0 for r in result["runs"].values()) else 1
    if args.interpret:
        device, n, names = "cpu", max(2, args.gpus), ["interpreter"]
        extra += ["gpu.policy=interpret"]
        one, many = extra + ["evaluate.parallel=1"], extra + [f"evaluate.parallel={n}"]
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            print("concurrent_audits_gpu.py needs 2+ CUDA GPUs (or --interpret)")
            return 2
        device = "cuda"
        n = args.gpus or torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(n)]
        one, many = extra + ["evaluate.gpus=[0]"], extra + [f"evaluate.gpus=[{','.join(map(str, range(n)))}]"]
    cfg = load_campaign(args.campaign, extra + (["gpu.policy=interpret"] if args.interpret else []))
    work = Path(tempfile.mkdtemp(prefix="concurrent_audits_"))
    try:
        slots = list(range(n)) if device == "cuda" else [0] * n
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "gpus": names, "torch": torch.__version__, "triton": triton.__version__,
                  "campaign": args.campaign, "evals": args.evals,
                  "root_on_each": root_on_each(cfg, slots, device, work)}
        print(json.dumps(result["root_on_each"]["ratio_to_first"], indent=1))
        result["runs"] = {label: run_campaign(args.campaign, ov, work / label, args.timeout_s)
                          for label, ov in (("one", one), (f"{n}_at_once", many))}
        for label, r in result["runs"].items():
            print(label, {k: r.get(k) for k in ("rc", "evaluations", "search_wall_s", "audits_per_min", "speedup",
                                                "gpus_used", "failures_by_kind")})
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
        return 0 if all(r["rc"] == 0 for r in result["runs"].values()) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
