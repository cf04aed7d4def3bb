"""Audits on a Ray cluster (evaluate.executor=ray), on a local cluster of two CPUs at 127.0.0.1 that this module
starts once: the same records as the local executor, a Ray worker killed mid-audit, the engine killed with -9."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# Ray takes the host's routable address unless told that clusters are off: the test cluster stays on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

from tik_evo.cli import main
from tik_evo.store import Store

from .helpers import ROOT, write_campaign

pytestmark = pytest.mark.slow

# Nothing timing-dependent decides these runs (no promotion, nothing over a limit or archived): the first
# offspring are the root's one-knob moves, so the local and the Ray runs audit the same sources in the same order.
FIXED = {"objective": {"min_margin": 100.0}, "workloads": {"default_limit": 1000.0, "only": ["decode.B3xH1024"]}}


def _campaign(tmp_path, max_evaluations=1, **evaluate):
    return write_campaign(tmp_path, search={"max_evaluations": max_evaluations, "archive_factor": 1000.0},
                          evaluate={"interpreter_reps": 1, "retime_best": False, **evaluate}, **FIXED)


@pytest.fixture(scope="module")
def cluster():
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="tik-evo")
    address = ctx.address_info["gcs_address"]
    assert address.startswith("127.0.0.1:")
    yield address
    from tik_evo import ray_executor
    from tik_evo.audit import close_executors

    close_executors()
    ray_executor._cluster = None
    ray.shutdown()


def _ray_overrides(address, scratch):
    return ["evaluate.executor=ray", f"evaluate.ray.address={address}", f"evaluate.ray.scratch={scratch}"]


def _timing_free(run_dir):
    """The records, less what wall-clock timings decide (measurements, objectives, times, where an audit ran)."""
    with Store.open_reader(run_dir) as s:
        impls = [(i.id, i.source_hash, i.parents, i.status, i.knobs) for i in s.all("I")]
        audits = [(u.id, u.impl, u.passed, u.failure_kind, [(g["name"], g["passed"]) for g in u.stages])
                  for u in s.all("U")]
        actions = [(a.id, a.operator, a.offspring, a.outcome, a.parents,
                    {k: v for k, v in a.params.items() if not k.startswith("_")}) for a in s.all("A")]
        decisions = [(d.id, d.impl, d.decision) for d in s.all("D")]
        st = s.state()
    return {"I": impls, "U": audits, "A": actions, "D": decisions,
            "state": (st.evaluations, st.best, st.root, st.frontier, st.archive, st.kappa, st.finished["reason"])}


def _kill_when_auditing(scratch, signum=signal.SIGKILL, impl="I0"):
    """In the background: once an attempt at `impl` has a result file (its judge is past its first stage), kill
    the Ray worker running it, once. Returns the thread and the list the killed pid is put in."""
    killed: list[int] = []

    def watch():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            for entry in Path(scratch).glob(f"tik-evo-ray/*/running/{impl}-*.json"):
                try:
                    data = json.loads(entry.read_text())
                except (OSError, ValueError):
                    continue
                if (entry.parent.parent / "audits" / data["dir"] / "result.json").exists():
                    os.kill(data["pid"], signum)
                    killed.append(data["pid"])
                    return
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t, killed


def test_same_records_as_the_local_executor_with_a_worker_killed_mid_audit(tmp_path, cluster):
    campaign = _campaign(tmp_path)
    assert main(["run", str(campaign), f"store.path={tmp_path / 'local'}", "--quiet"]) == 0
    scratch = tmp_path / "scratch"
    watcher, killed = _kill_when_auditing(scratch)
    # One audit at a time, as the local run: with several in flight the order of completions is the clock's.
    assert main(["run", str(campaign), f"store.path={tmp_path / 'ray'}", *_ray_overrides(cluster, scratch),
                 "evaluate.ray.max_in_flight=1", "--quiet"]) == 0
    watcher.join()
    assert killed, "no Ray worker was killed mid-audit"
    local, remote = _timing_free(tmp_path / "local"), _timing_free(tmp_path / "ray")
    assert remote == local and local["state"][0] == 1
    with Store.open_reader(tmp_path / "ray") as s:
        root, offspring = s.get("U0"), s.get("U1")
        assert root.passed and root.device["ray"]["lost"][0]["error"] in ("WorkerCrashedError", "RaySystemError")
        assert offspring.device["ray"]["lost"] == [] and offspring.device["ray"]["host"]
    assert (tmp_path / "ray" / "audits" / "I0" / "worker.log").exists()  # the evidence, written by the engine
    assert json.loads((tmp_path / "ray" / "audits" / "I1" / "result.json").read_text())["done"]


def _alive(pid: int, started: str | None) -> bool:
    from tik_evo.ray_task import _started

    return _started(pid) is not None and _started(pid) == started


def test_engine_killed_with_9_resumes_with_no_orphaned_task(tmp_path, cluster):
    campaign = _campaign(tmp_path, max_evaluations=2)
    scratch, run = tmp_path / "scratch", tmp_path / "run"
    engine = subprocess.Popen([sys.executable, "-m", "tik_evo.cli", "run", str(campaign),
                               *_ray_overrides(cluster, scratch), "evaluate.ray.max_in_flight=1", "--quiet"],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    entry, deadline = None, time.time() + 150
    while entry is None and time.time() < deadline and engine.poll() is None:
        for e in scratch.glob("tik-evo-ray/*/running/I1-*.json"):
            data = json.loads(e.read_text())
            if (e.parent.parent / "audits" / data["dir"] / "result.json").exists():
                entry = data
        time.sleep(0.05)
    assert entry is not None, "the run never had its first offspring's audit in flight"
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait()
    with Store.open_reader(run) as s:
        assert s.state().evaluations == 0 and [i.id for i in s.all("I")] == ["I0"]  # I1's audit not recorded
    assert main(["resume", str(run), "--quiet"]) == 0
    assert not _alive(entry["pid"], entry["started"]), "the dead engine's audit is still running"
    assert not list(scratch.glob(f"tik-evo-ray/*/audits/{entry['dir']}"))
    with Store.open_reader(run) as s:
        st, impls = s.state(), s.all("I")
        assert st.evaluations == 2 and st.finished
        assert len({i.source_hash for i in impls}) == len(impls) == 3 and len(s.all("U")) == 3


def test_without_ray_the_error_says_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["run", str(_campaign(tmp_path)), "evaluate.executor=ray", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "evaluate.executor" in err and "pip install -e '.[ray]'" in err


def test_another_install_on_a_node_is_refused():
    from tik_evo.ray_task import identity, mismatch

    mine = identity()
    assert mismatch(mine, dict(mine)) == ""
    why = mismatch({**mine, "digest": "0" * 64}, mine)
    assert "digest" in why and "pip install -e '.[ray]'" in why




def test_reap_ends_what_a_dead_engine_left_and_keeps_the_live_engines(tmp_path):
    """The node side of a resume (no cluster needed): audits registered by another engine of the run are ended,
    with any process still working in their directories; the current engine's are kept."""
    from tik_evo.ray_task import _started, reap, scratch_root

    root = scratch_root(str(tmp_path), "run1")
    procs, entries = {}, {}
    for engine, name in (("dead", "I3-aaaa"), ("live", "I4-bbbb")):
        (root / "audits" / name).mkdir(parents=True)
        p = subprocess.Popen(["sleep", "60"], cwd=root / "audits" / name)
        procs[engine], entries[engine] = p, {"pid": p.pid, "started": _started(p.pid), "engine": engine, "dir": name}
        (root / "running").mkdir(exist_ok=True)
        (root / "running" / f"{name}.json").write_text(json.dumps(entries[engine]))
    stray = subprocess.Popen(["sleep", "60"], cwd=root / "audits" / "I3-aaaa")  # e.g. a runner left behind
    try:
        ended = reap(str(tmp_path), "run1", "live")
        assert set(ended) == {procs["dead"].pid, stray.pid}
        assert procs["dead"].wait(5) == -signal.SIGKILL and stray.wait(5) == -signal.SIGKILL
        assert procs["live"].poll() is None and (root / "running" / "I4-bbbb.json").exists()
        assert not (root / "audits" / "I3-aaaa").exists() and not (root / "running" / "I3-aaaa.json").exists()
    finally:
        for p in (*procs.values(), stray):
            p.kill()
            p.wait()


def _fake_cluster(monkeypatch, nodes, address="127.0.0.1:1"):
    """The engine's view of a cluster of these nodes, without one (tests of what the engine decides from it)."""
    from types import SimpleNamespace

    from tik_evo import ray_executor

    fake = ray_executor.Cluster(SimpleNamespace(nodes=lambda: nodes), address)
    monkeypatch.setattr(ray_executor, "_cluster", fake)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(gcs_address=address))
    return fake


def _node(ip, **res):
    return {"Alive": True, "NodeManagerAddress": ip, "NodeID": ip, "Resources": {"CPU": 8, **res}}


def test_sweep_on_the_cluster_shares_its_cpus_among_the_runs(tmp_path, monkeypatch):
    from tik_evo.config import load_campaign
    from tik_evo.ray_executor import sweep_slots
    from tik_evo.sweep import SweepRun

    cluster = "127.0.0.1:1"
    _fake_cluster(monkeypatch, [{**_node("a"), "Resources": {"CPU": 2}}], cluster)
    cfg = load_campaign(_campaign(tmp_path))
    three = sweep_slots(cfg, cluster, 3)  # two CPUs: two runs at once, one audit in flight each
    assert len(three) == 2 and all(s.gpu is None and s.cpus is None for s in three)
    assert three[0].overrides == ["evaluate.executor=ray", f"evaluate.ray.address={cluster}",
                                  "evaluate.ray.max_in_flight=1"]
    one = sweep_slots(cfg, cluster, 1)
    assert len(one) == 1 and one[0].overrides[-1] == "evaluate.ray.max_in_flight=2"
    run = SweepRun("a", tmp_path / "a", [str(tmp_path / "campaign.yaml"), f"store.path={tmp_path / 'a'}"], slot=one[0])
    assert run.argv()[-4:] == [*one[0].overrides, "--quiet"]
    (tmp_path / "a" / "ir.lmdb").mkdir(parents=True)  # a sweep killed midway resumes its run on the cluster too
    assert run.argv()[3:5] == ["resume", str(tmp_path / "a")] and run.argv()[-4:] == [*one[0].overrides, "--quiet"]


def test_gpu_models_are_kept_apart_or_refused(monkeypatch):
    from types import SimpleNamespace

    from tik_evo import ray_executor
    from tik_evo.config import ConfigError

    node = _node
    two_models = [node("a", GPU=2, **{"accelerator_type:H100": 1}), node("b", GPU=1, **{"accelerator_type:H200": 1}),
                  node("c")]
    fake = _fake_cluster(monkeypatch, two_models)
    assert fake.models == {"H100": 2, "H200": 1} and fake.cpus == 24
    ev = {"in_flight": 1, "ray": {"max_in_flight": 0}}
    assert ray_executor.slots(ev, "cuda") == ["ray:H100", "ray:H200", "ray:H100"]
    assert ray_executor.slots({**ev, "ray": {"max_in_flight": 2}}, "cuda") == ["ray:H100", "ray:H200"]  # both kept
    assert len(ray_executor.slots(ev, "cpu")) == 24
    task = ray_executor.RayExecutor({"in_flight": 2}, "cuda", "ray:H200").options("I3")
    assert task["num_gpus"] == 0.5 and task["resources"] == {"accelerator_type:H200": 0.001}
    unlabelled = [*two_models, node("d", GPU=4)]
    with pytest.raises(ConfigError, match="accelerator_type"):
        ray_executor.Cluster(SimpleNamespace(nodes=lambda: unlabelled), "x")
