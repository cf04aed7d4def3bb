"""`tik-evo audit CAMPAIGN FILE`: one source file judged as an offspring of the campaign's start.

What a kernel author runs before a campaign (and what the adversarial tests run): the campaign's root (or
`start`) is audited and timed first, then the file, by the same audit a search uses, with the current best (the
root) re-timed beside it; the verdict says which stage failed and why, or the objective against the root and
whether a search would promote it. In a throwaway run directory unless `store.path` is given.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tik_evo.config import ConfigError, load_campaign
from tik_evo.worker_io import WorkerResult


def audit_file(campaign: str, path: str, overrides: list[str], log=print) -> dict[str, Any]:
    """The verdict on the file at ``path`` (a dict: verified, stage, failure_kind, message, objective...)."""
    from tik_evo.audit import AuditJob, audit_slots, run_audit
    from tik_evo.commands.check import prepare
    from tik_evo.initialization import initialize, resolve_device
    from tik_evo.lineage import judge
    from tik_evo.store import Store, source_hash

    try:
        source = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the kernel file ({e.strerror or e})") from None
    keep = any(o.split("=", 1)[0].strip() == "store.path" for o in overrides)
    tmp = None if keep else tempfile.mkdtemp(prefix="tik_evo_audit_")
    cfg = load_campaign(campaign, overrides + ([f"store.path={tmp}/run"] if tmp else []))
    family, workloads = prepare(cfg)
    device, facts, _ = resolve_device(cfg)
    run_dir = Path(cfg.store.path)
    if (run_dir / "ir.lmdb").exists():
        raise ConfigError(f"key 'store.path': {run_dir} already holds a run; give a new directory")
    store = Store.create(run_dir)
    try:
        initialize(store, cfg, family, workloads, device, facts, log=log)
        st = store.state()
        root = store.get(st.root)
        root_source = store.source(root.source_hash)
        h = source_hash(source)
        log(f"auditing {path} ({h}) against the root…")
        t0 = time.time()
        gpu = audit_slots(cfg.evaluate, device)[0]
        out = run_audit(run_dir, AuditJob(family, source, h, "I1", st.workloads, list(cfg.correctness.seeds),
                                          OmegaConf.to_container(cfg.evaluate), device, gpu, root.source_hash,
                                          root_source))
        verdict = judge(out.passed, out.measurements, out.best_retimed, st, cfg, gpu if device == "cuda" else None)
        failed = next((s for s in out.stages if not s["passed"]), None)
        result = {
            "file": str(path), "source_hash": h, "family": family.name, "device": out.device.get("gpu", device),
            "verified": out.passed, "stage": failed["name"] if failed else None, "failure_kind": out.failure_kind,
            "message": out.failure[:4000], "seconds": round(time.time() - t0, 2),
            "objective": verdict.objective, "root_objective": st.root_objective,
            "best_objective_retimed": verdict.best_objective, "admissible": verdict.admissible,
            "would_promote": verdict.promoted, "reason": verdict.reason,
            "limits": verdict.limits, "measurements": {n: m["median_s"] for n, m in out.measurements.items()},
            "root_measurements": {n: m["median_s"] for n, m in out.best_retimed.items()},  # re-timed beside it
            "sandbox": _sandbox(run_dir), "run_dir": None if tmp else str(run_dir),
            "stages": [{"name": s["name"], "passed": s["passed"], "seconds": round(s["seconds"], 2),
                        "checks": len(s["checks"])} for s in out.stages],
        }
        return result
    finally:
        store.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _sandbox(run_dir: Path) -> dict[str, Any]:
    return WorkerResult.read(run_dir / "audits" / "I1" / "result.json").sandbox


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['file']}: {'VERIFIED' if r['verified'] else 'REJECTED'} ({r['family']}, {r['device']}, "
             f"{r['seconds']} s)"]
    if not r["verified"]:
        lines.append(f"  failed stage: {r['stage']}  kind: {r['failure_kind']}")
        lines += ["  " + ln for ln in r["message"].splitlines()[:25]]
    else:
        ratio = r["root_objective"] / r["objective"] if r["objective"] else float("nan")
        lines.append(f"  objective {r['objective']:.6g} vs root {r['root_objective']:.6g} ({ratio:.3f}x the root); "
                     f"admissible: {r['admissible']}; a search would promote it: {r['would_promote']}")
        if r["reason"]:
            lines.append(f"  {r['reason']}")
    sb = r.get("sandbox") or {}
    if sb:
        on = [k for k in ("network", "readonly_files", "capabilities_dropped", "no_new_privs")
              if sb.get(k)]
        lines.append(f"  sandbox ({sb.get('mode')}): {', '.join(on) or 'none'}"
                     + (f"; missing: {sb['missing']}" if sb.get("missing") else ""))
    lines.append("  stages: " + ", ".join(f"{s['name']} {'ok' if s['passed'] else 'FAILED'}" for s in r["stages"]))
    return "\n".join(lines)
