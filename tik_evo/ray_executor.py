"""`evaluate.executor=ray`: each audit a Ray task on a cluster, the engine still the one writer of the run.

A task holds one GPU (a 1/`in_flight` share with audits in flight per GPU; one CPU under the interpreter) and
runs the audit on its node with the local executors' worker, stages, limit and process-group kill
(`tik_evo.ray_task`); the engine writes the evidence files it returns and records the audit as for a local one.

- Slots: one per GPU of the cluster times `evaluate.in_flight` (one per CPU under the interpreter), at most
  `evaluate.ray.max_in_flight`. Each slot is labelled by its GPU model (`ray:<model>`, from Ray's
  `accelerator_type:<model>` node resource, which its tasks ask for), so an audit runs on a GPU of its slot's
  model and is judged against the root as timed on that model (`initialization.anchor_gpus`). GPU nodes that
  Ray cannot tell apart by model are refused.
- Faults: a task lost with its worker or node (any Ray error, or no answer well past its limit) is run again, up
  to `evaluate.ray.retries` times, each loss recorded in the audit (`device.ray.lost`); past that the audit is an
  `infrastructure` failure, never a verdict on the candidate.
- A dead engine: its tasks are its Ray job's and end with it; every node also keeps who runs each audit of the run
  (`ray_task.reap`), and `tik-evo resume` ends whatever an earlier engine of the run left there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from tik_evo import ray_task
from tik_evo.config import ConfigError
from tik_evo.executor import CLOSED, InfrastructureError

RAY_PIN = "ray>=2.60,<2.61"  # the range tested (pyproject's `ray` extra)
# A task ends its worker at its own limit; the engine waits this much longer (the task's start on a busy node,
# its files coming back) before it counts the task as lost.
LOST_AFTER_S = 300.0
ENGINE = uuid.uuid4().hex  # this engine process, as the nodes record who started each audit


def missing_ray() -> str:
    """"" when Ray can be imported; else what to install."""
    if importlib.util.find_spec("ray") is not None:
        return ""
    return (f"evaluate.executor=ray needs Ray, which is not installed here: pip install -e '.[ray]' "
            f"(or pip install '{RAY_PIN}'), here and on every node of the cluster")


def _ray():
    if missing_ray():
        raise ConfigError(missing_ray())
    import ray

    return ray


def _section(evaluate: Any) -> dict[str, Any]:
    """`evaluate.ray` as a dict, from the config (DictConfig) or a job's copy (dict)."""
    from omegaconf import DictConfig, OmegaConf

    ray_cfg = evaluate.get("ray", {})
    return dict(OmegaConf.to_container(ray_cfg) if isinstance(ray_cfg, DictConfig) else ray_cfg)


class Cluster:
    """The engine's view of the cluster, read when it connects: alive nodes, GPUs by model, CPUs."""

    def __init__(self, ray, address: str):
        self.address = address
        self.nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.models: dict[str, int] = {}  # GPU model -> GPUs
        self.cpus = 0
        unlabelled = []
        for n in self.nodes:
            res = n.get("Resources", {})
            self.cpus += int(res.get("CPU", 0))
            gpus = int(res.get("GPU", 0))
            if not gpus:
                continue
            labels = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
            if len(labels) != 1:
                unlabelled.append(f"{n.get('NodeManagerAddress')} ({', '.join(labels) or 'no model'})")
                continue
            self.models[labels[0]] = self.models.get(labels[0], 0) + gpus
        if unlabelled:
            raise ConfigError(f"key 'evaluate.executor': ray: GPU node(s) {', '.join(unlabelled)} have not exactly "
                              f"one accelerator_type:<model> resource, so their audits cannot be judged against the "
                              f"root timed on the same GPU model; start them with `ray start ... "
                              f"--resources '{{\"accelerator_type:<MODEL>\": 1}}'` or leave them out")


_cluster: Cluster | None = None
_lock = threading.Lock()


def connect(evaluate: Any) -> Cluster:
    """Connect this process to the cluster of `evaluate.ray.address` once (auto: the running cluster; local:
    start one here), and check every node's tik-evo install against this one."""
    global _cluster
    with _lock:
        if _cluster is not None:
            return _cluster
        ray = _ray()
        address = str(_section(evaluate).get("address", "auto"))
        if not ray.is_initialized():
            opts = {"include_dashboard": False, "log_to_driver": False, "namespace": "tik-evo"}
            try:
                ray.init(**opts) if address == "local" else ray.init(address=address, **opts)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ConfigError(f"key 'evaluate.ray.address': {address!r}: no Ray cluster there ({e}); start one "
                                  f"with `ray start --head` (docs/campaigns.md, Audits on a Ray cluster) or pass "
                                  f"evaluate.ray.address=local") from None
        cluster = Cluster(ray, address)
        check_installs(ray, cluster)
        _cluster = cluster
        return cluster


def _on_node(ray, fn, node: dict[str, Any]):
    """`fn` as a Ray task pinned to `node`, taking none of its CPUs (it may run beside the node's audits)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    return ray.remote(fn).options(num_cpus=0, max_retries=0, scheduling_strategy=strategy)


def check_installs(ray, cluster: Cluster) -> None:
    """Every alive node runs the same tik-evo as the engine, or the run is refused naming the node."""
    mine = ray_task.identity()
    refs = [_on_node(ray, ray_task.probe, n).remote() for n in cluster.nodes]  # every node at once
    for node, ref in zip(cluster.nodes, refs):
        try:
            theirs = ray.get(ref, timeout=300)
        except Exception as e:  # noqa: BLE001 - the node cannot import tik-evo, or never answered
            raise ConfigError(f"key 'evaluate.executor': ray: node {node.get('NodeManagerAddress')} could not report "
                              f"its tik-evo install ({type(e).__name__}: {str(e)[:400]}); is tik-evo installed "
                              f"there (pip install -e '.[ray]') in the Python that runs `ray start`?") from None
        why = ray_task.mismatch(theirs, mine)
        if why:
            raise ConfigError(f"key 'evaluate.executor': ray: {why}")


def slots(evaluate: Any, device: str) -> list[Any]:
    """The label of each audit that may be in flight (see `tik_evo.audit.audit_slots`): `ray:<model>` per GPU
    share on a GPU run, models taking turns so a cap keeps every model; 0 per CPU under the interpreter."""
    cluster = connect(evaluate)
    cap = int(_section(evaluate).get("max_in_flight", 0))
    if device == "cuda":
        n = max(1, int(evaluate["in_flight"]))
        left = {m: g * n for m, g in sorted(cluster.models.items())}
        labels: list[Any] = []
        while any(left.values()):
            for m in left:
                if left[m]:
                    labels.append(f"ray:{m}")
                    left[m] -= 1
    else:
        labels = [0] * cluster.cpus
    if not labels:
        raise ConfigError(f"key 'evaluate.executor': ray: the cluster at {cluster.address!r} has no "
                          f"{'GPU' if device == 'cuda' else 'CPU'} to run audits on")
    return labels[:cap] if cap else labels


def resolve_device(cfg) -> tuple[str, dict[str, Any], list[str]]:
    """`initialization.resolve_device` for a cluster: its GPU models, under the campaign's GPU policy."""
    from tik_evo.initialization import other_gpu  # (initialization imports this module lazily)

    cluster = connect(cfg.evaluate)
    want, policy, name = cfg.device, cfg.gpu.policy, cfg.gpu.name
    facts: dict[str, Any] = {"campaign_gpu": name, "policy": policy, "torch": ray_task.identity()["torch"],
                             "executor": "ray", "ray_nodes": len(cluster.nodes), "ray_gpus": dict(cluster.models)}
    warnings: list[str] = []
    if want == "interpreter" or not cluster.models:
        if want == "cuda":
            raise ConfigError(f"{cfg.source_file}: key 'device': 'cuda' but the Ray cluster has no GPU")
        if want != "interpreter" and name.lower() not in ("any", "cpu") and policy != "interpret":
            raise ConfigError(f"{cfg.source_file}: key 'gpu.policy': campaign {cfg.name!r} targets {name} but the "
                              f"Ray cluster has no GPU; pass gpu.policy=interpret to run under the Triton interpreter")
        facts["actual_gpu"] = None
        return "cpu", facts, warnings
    facts["actual_gpu"] = ", ".join(sorted(cluster.models))
    other = [m for m in cluster.models if name.lower() not in ("any", "cpu") and name.lower() not in m.lower()]
    if other:
        msg = f"campaign {cfg.name!r} was written for {name} but the cluster has {', '.join(sorted(other))}"
        if other_gpu(cfg, policy, msg, warnings, "each audit records its GPU"):
            return "cpu", facts, warnings
    if len(cluster.models) > 1:
        warnings.append(f"GPU models {', '.join(sorted(cluster.models))}: the root is timed on each, and each "
                        f"audit is judged against the root on its own model")
    return "cuda", facts, warnings


def run_key(run_dir: Path) -> str:
    """The run's name on the nodes (their scratch directories), kept in RUN/ray/engine.json with the engine
    process that audits now: the bookkeeping `reap` works from."""
    path = Path(run_dir) / "ray" / "engine.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {"run_key": uuid.uuid4().hex}
    if data.get("engine") != ENGINE:
        data.update(engine=ENGINE, pid=os.getpid(), started=time.time())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    return data["run_key"]


def reap(run_dir: Path, evaluate: Any) -> list[int]:
    """End, on every alive node, what earlier engines of this run left running (a resume after kill -9)."""
    ray = _ray()
    cluster = connect(evaluate)
    key, scratch = run_key(run_dir), str(_section(evaluate).get("scratch", ""))
    refs = [_on_node(ray, ray_task.reap, n).remote(scratch, key, ENGINE) for n in cluster.nodes]
    return [pid for pids in ray.get(refs, timeout=120) for pid in pids]


class RayExecutor:
    """The executor interface of `tik_evo.executor` (`run`, `close`) for the audits of one slot label."""

    def __init__(self, evaluate: dict[str, Any], device: str, label: Any):
        self.evaluate, self.device, self.label = evaluate, device, label
        self.section = _section(evaluate)
        self.refs: set = set()
        self.closed = False
        self._lock = threading.Lock()

    def options(self, name: str) -> dict[str, Any]:
        opts: dict[str, Any] = {"max_retries": 0, "name": f"tik-evo audit {name}"}  # retries are ours, recorded
        if self.device == "cuda":
            opts.update(num_cpus=0, num_gpus=1 / max(1, int(self.evaluate.get("in_flight", 1))))
            if isinstance(self.label, str) and self.label.startswith("ray:"):
                opts["resources"] = {f"accelerator_type:{self.label[4:]}": 0.001}  # on a GPU of the slot's model
        else:
            opts["num_cpus"] = 1
        return opts

    def run(self, job_path: Path, log_path: Path, timeout: float) -> tuple[int, bool]:
        if self.closed:
            return CLOSED
        ray = _ray()
        connect(self.evaluate)
        work = Path(job_path).parent
        run_dir = Path(json.loads(Path(job_path).read_text())["run_dir"])
        manifest = run_dir / "warm" / "calls.json"
        payload = {"job": Path(job_path).read_text(), "impl": work.name, "timeout": timeout, "device": self.device,
                   "executor": self.section.get("executor", "auto"), "run_key": run_key(run_dir), "engine": ENGINE,
                   "scratch": str(self.section.get("scratch", "")), "identity": ray_task.identity(),
                   "manifest": manifest.read_text() if manifest.exists() else None}
        task = ray.remote(ray_task.audit).options(**self.options(work.name))
        retries, lost = int(self.section.get("retries", 2)), []
        for _ in range(retries + 1):
            t0 = time.time()
            ref = task.remote(payload)
            with self._lock:
                self.refs.add(ref)
                closed = self.closed
            if closed:
                ray.cancel(ref, force=True)
            try:
                got = ray.get(ref, timeout=timeout + LOST_AFTER_S)
            except Exception as e:  # noqa: BLE001 - whatever Ray raises, the task is lost, not judged
                if self.closed:
                    return CLOSED
                if isinstance(e, ray.exceptions.GetTimeoutError):
                    ray.cancel(ref, force=True)
                lost.append({"error": type(e).__name__, "message": str(e)[:600], "after_s": round(time.time() - t0, 1)})
                continue
            finally:
                with self._lock:
                    self.refs.discard(ref)
            if got.get("refused"):
                raise ConfigError(f"key 'evaluate.executor': ray: {got['refused']}")
            self._write(work, Path(log_path), got, lost)
            if got.get("manifest") and not manifest.exists():
                manifest.parent.mkdir(parents=True, exist_ok=True)
                manifest.write_text(got["manifest"])
            return int(got["rc"]), bool(got["timed_out"])
        self._write(work, Path(log_path), {"files": {}}, lost)
        raise InfrastructureError(f"the audit's Ray task was lost {len(lost)} times (evaluate.ray.retries={retries}); "
                                  f"last: {lost[-1]['error']}: {lost[-1]['message'][:300]}")

    @staticmethod
    def _write(work: Path, log_path: Path, got: dict[str, Any], lost: list[dict[str, Any]]) -> None:
        """The task's evidence files into the run's audit directory, the result with where it ran and what was lost."""
        files = dict(got.get("files", {}))
        try:
            result = json.loads(files.pop("result.json", "") or "{}")
        except ValueError:
            result = {}
        result["ray"] = {**got.get("node", {}), "lost": lost}
        log_path.write_text(files.pop("worker.log", ""))
        for name, text in files.items():
            if "/" not in name and name not in ("job.json", ".", ".."):
                (work / name).write_text(text)
        tmp = work / "result.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(work / "result.json")

    def close(self) -> None:
        with self._lock:
            self.closed = True
            refs = list(self.refs)
        if refs:
            ray = _ray()
            for ref in refs:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - already finished, or Ray is shutting down
                    pass


def sweep_slots(cfg, address: str, runs: int) -> list:
    """`tik-evo sweep --ray`: as many runs at once as the cluster has GPUs (CPUs under the interpreter), each
    run's audits in flight an equal share of them, so no run's audits wait behind another's. Each run's engine is
    a child of the sweep on this host, writing its run directory where the sweep reads it."""
    import ray

    from tik_evo.sweep import Slot

    section = {**_section(cfg.evaluate), "address": address}
    cluster = connect({**dict(cfg.evaluate), "ray": section})
    gcs = ray.get_runtime_context().gcs_address  # `local` started the cluster here: the runs join this one
    device = resolve_device(cfg)[0]  # on the cluster just connected to
    capacity = sum(cluster.models.values()) * max(1, cfg.evaluate.in_flight) if device == "cuda" else cluster.cpus
    cap = int(section.get("max_in_flight", 0))
    capacity = min(capacity, cap) if cap else capacity
    at_once = max(1, min(runs, capacity))
    each = max(1, capacity // at_once)
    overrides = ["evaluate.executor=ray", f"evaluate.ray.address={gcs}", f"evaluate.ray.max_in_flight={each}"]
    return [Slot(None, None, overrides, on=f"ray ({each} in flight)") for _ in range(at_once)]
