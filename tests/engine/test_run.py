"""End to end on the CPU: the quickstart campaign, the read-only commands, and kill -9 then resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tik_evo.cli import main
from tik_evo.store import Store, StoreError

from .helpers import ROOT, write_campaign

pytestmark = pytest.mark.slow


def _records(run_dir):
    with Store.open_reader(run_dir) as s:
        snap = s.snapshot()
        # Status (implementations) and uses/evidence (opportunities) legitimately change; the rest never does.
        mutable = {"status", "uses", "evidence"}
        return snap["state"], {r.id: json.dumps({k: v for k, v in r.__dict__.items() if k not in mutable},
                                                sort_keys=True) for k in "IOAUD" for r in snap[k]}


def _audit_processes(run_dir):
    """Processes whose working directory is inside the run (audit workers run in RUN_DIR/audits/<impl>)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd").startswith(str(run_dir)):
                found.append(proc.name)
        except OSError:
            continue
    return found


def test_quickstart_end_to_end(tmp_path, capsys):
    run = tmp_path / "qs"
    rc = main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={run}",
               "search.max_evaluations=3", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert str(run) in printed and "speed-up" in printed and "interpreter" in printed
    state, records = _records(run)
    assert state["finished"] and state["evaluations"] >= 1
    assert state["root"] == "I0" and state["best"] in state["frontier"]
    with Store.open_reader(run) as s:
        impls, audits = s.all("I"), s.all("U")
        assert len(impls) == len(audits) == state["evaluations"] + 1
        assert all(i.status in ("best", "active", "archived", "failed") for i in impls)
        assert len(s.all("D")) >= state["evaluations"]  # every audited offspring has a lineage decision
    assert (run / "config.yaml").read_text().startswith("name: quickstart")
    for cmd in (["status", str(run)], ["lineage", str(run)], ["show", str(run), "I1"],
                ["export", str(run), "-o", str(tmp_path / "x.jsonl")]):
        assert main(cmd) == 0, cmd
    assert main(["plot", str(run), "-o", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(run), "-o", str(tmp_path / "no-such-dir" / "p.png")]) == 2  # named, no traceback
    from tik_evo.plot import series

    with Store.open_reader(run) as s:
        points = series(s)["points"]
    assert sum(len(p) for p in points.values()) == state["evaluations"]
    lines = [json.loads(x) for x in (tmp_path / "x.jsonl").read_text().splitlines()]
    types = {x["type"] for x in lines}
    assert {"state", "implementation", "audit", "action", "opportunity", "decision", "event"} <= types
    assert sum(x["type"] == "implementation" for x in lines) == len(impls)
    # A second run on the same store path is refused and loses nothing.
    assert main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={run}", "--quiet"]) == 2
    assert _records(run)[1] == records
    # A run directory moved elsewhere resumes where it now is, and leaves nothing at its old path.
    moved = tmp_path / "elsewhere" / "qs"
    moved.parent.mkdir()
    run.rename(moved)
    n = state["evaluations"] + 1
    assert main(["resume", str(moved), f"search.max_evaluations={n}", "--quiet"]) == 0
    assert _records(moved)[0]["evaluations"] == n and not run.exists()
    assert f"path: {moved}" in (moved / "config.yaml").read_text()


def test_gpu_campaign_without_gpu_is_refused_clearly(tmp_path, capsys):
    campaign = write_campaign(tmp_path, gpu={"name": "H200", "policy": "warn"})
    assert main(["run", str(campaign), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "gpu.policy" in err and "H200" in err and not (tmp_path / "run" / "ir.lmdb").exists()


@pytest.mark.parametrize("parallel", [1, 2])
def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path, parallel):
    # parallel=2: killed with two audits in flight, whose reserved implementation ids stay unused.
    campaign = write_campaign(tmp_path, search={"max_evaluations": 40, "kappa_threshold": 40, "wall_time_s": 900},
                              evaluate={"parallel": parallel})
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "tik_evo.cli", "run", str(campaign), "--quiet"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    state = {}
    while time.time() < deadline:
        time.sleep(1)
        if (run / "ir.lmdb" / "data.mdb").exists():
            try:
                state, _ = _records(run)
            except StoreError:  # caught while the run creates its store (as the TUI's poll tolerates)
                continue
            if state.get("evaluations", 0) >= 1:
                break
    assert state.get("evaluations", 0) >= 1, "run made no progress"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15  # the audit in flight dies with the engine (PR_SET_PDEATHSIG)
    while _audit_processes(run) and time.time() < deadline:
        time.sleep(0.2)
    assert not _audit_processes(run)
    before_state, before = _records(run)
    assert before_state["finished"] is None
    target = before_state["evaluations"] + 1  # one more audit: the run goes on past the kill and finishes
    r = subprocess.run([sys.executable, "-m", "tik_evo.cli", "resume", str(run), f"search.max_evaluations={target}",
                        "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    after_state, after = _records(run)
    for rid, data in before.items():
        assert after[rid] == data, rid
    assert after_state["evaluations"] == target and after_state["finished"]
    with Store.open_reader(run) as s:
        impls = s.all("I")
        assert len({i.id for i in impls}) == len(impls) == target + 1
        assert len({i.source_hash for i in impls}) == len(impls)  # no source audited twice
        assert len(s.all("U")) == len(impls)


def test_run_starts_from_the_campaign_start(tmp_path, capsys):
    # start.knobs changes the root the search starts from: the audited root (I0) carries them.
    run = tmp_path / "st"
    rc = main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={run}", "search.max_evaluations=1",
               "start.knobs.FULL_ROWS_PER_PROGRAM=4", "--quiet"])
    assert rc == 0
    assert "with start {'FULL_ROWS_PER_PROGRAM': 4}" in capsys.readouterr().err  # the progress log
    with Store.open_reader(run) as s:
        root = s.get("I0")
        assert root.knobs["FULL_ROWS_PER_PROGRAM"] == 4 and root.knobs["BLOCK_H"] == 0  # the rest: the root's
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "root with start {'FULL_ROWS_PER_PROGRAM': 4}" in " ".join(capsys.readouterr().out.split())
    # The whole file of the root and of the best, for use outside the run.
    from tik_evo.knobs import read_knobs

    assert main(["show", str(run), "root", "-o", str(tmp_path / "root.py")]) == 0
    assert read_knobs((tmp_path / "root.py").read_text())["FULL_ROWS_PER_PROGRAM"] == 4
    assert main(["show", str(run), "best", "-o", str(tmp_path / "best.py")]) == 0
    with Store.open_reader(run) as s:
        assert (tmp_path / "best.py").read_text() == s.source(s.get(s.state()["best"]).source_hash)


def test_start_knobs_read_on_and_off_as_the_knobs_strings():
    # YAML and overrides read a bare on / off as a boolean; a knob whose values are "off" / "on" / "auto" gets
    # the string back, and a boolean knob keeps its boolean.
    from tik_evo.config import load_campaign
    from tik_evo.families import load_family
    from tik_evo.initialization import start_changes

    cfg = load_campaign(ROOT / "campaigns" / "h200_linear.yaml",
                        ["start.knobs.FULL_CHUNKED_WIDE=on", "start.knobs.FULL_USE_TMA=off"])
    assert start_changes(cfg, load_family("linear")) == {"FULL_CHUNKED_WIDE": "on", "FULL_USE_TMA": False}


def test_bad_start_is_refused_before_a_run_exists(tmp_path, capsys):
    run = tmp_path / "bad"
    rc = main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={run}",
               "start.knobs.FULL_ROWS_PER_PROGRAM=3"])
    assert rc != 0 and not run.exists()
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "quickstart.yaml: key 'start.knobs': FULL_ROWS_PER_PROGRAM=3 is not one of [1, 2, 4, 8]" in err


def test_bench_runs_the_model_suites_and_says_when_there_is_no_gpu(capsys):
    # `tik-evo bench model` / `model-speed` / `model-graphs` need a GPU: on this CPU machine they say so and exit 2;
    # an unknown name is refused naming the way to benchmark an operator family.
    if torch.cuda.is_available():
        return
    assert main(["bench", "model", "--model", "moe"]) == 2
    assert main(["bench", "model-speed"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert main(["bench", "model-graphs"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert main(["bench", "policy"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert main(["bench", "policy-glue"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert main(["bench", "silu_mul"]) == 2
    assert "tik-evo bench ops --families silu_mul" in " ".join(capsys.readouterr().err.split())
    assert main(["bench", "silu"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'silu' is not a suite (`tik-evo bench --list`: attention, search, rl, rl-parity, ops," in err


def test_a_root_that_remembers_its_outputs_stops_the_run_and_names_the_stage(tmp_path, monkeypatch, capsys):
    # A root that skips the work for an output tensor object it has seen: the judge's checked calls get fresh
    # tensors, but a timed region repeats the same call, so its later calls leave stale outputs; the audit's
    # timed-output check refuses it, and the error names the stage and the evidence.
    from tik_evo.families import load_family

    family = load_family("rmsnorm")
    source = family.root_source()
    cheat = source.replace('    """One token per sequence: x [batch, hidden]; '
                           'same per-row numerics as rmsnorm_full."""\n',
                           '    """One token per sequence."""\n    if any(t is out for t in WRITTEN):\n        return\n'
                           '    WRITTEN.append(out)\n') + "\nWRITTEN = []\n"
    assert cheat != source
    monkeypatch.setattr(family, "root_source", lambda: cheat)
    rc = main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), "evaluate.graph_replay=on",
               "search.max_evaluations=1", f"store.path={tmp_path / 'run'}"])
    assert rc != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "failed its audit (timed)" in err and "timed rmsnorm_decode out" in err and "tik-evo show" in err, \
        err[-800:]


@pytest.mark.slow
def test_concurrent_audits_overlap_and_record_like_one_at_a_time(tmp_path, capsys):
    """evaluate.parallel=2 under the interpreter: two audits in flight at once, each step still one record set."""
    campaign = write_campaign(tmp_path, search={"max_evaluations": 6, "kappa_threshold": 40},
                              evaluate={"parallel": 2, "retime_best": True})
    assert main(["run", str(campaign), "--quiet"]) == 0
    run = tmp_path / "run"
    with Store.open_reader(run) as s:
        st, impls, audits, actions = s.state(), s.all("I"), s.all("U"), s.all("A")
        assert st["evaluations"] == 6 and "evaluation budget used (6/6)" in st["finished"]["reason"]
        assert len(impls) == len(audits) == 7 and len({i.source_hash for i in impls}) == 7
        assert "crash" not in st["failures_by_kind"], st["failures_by_kind"]  # one fork server per slot
        by_impl = {a.impl: a for a in audits}
        assert all(i.id in by_impl for i in impls)
        assert len({p.name for p in (run / "audits").iterdir()}) == 7  # each audit its own folder
        spans = sorted((a.started, a.finished) for a in actions if a.outcome == "audited")
        assert any(b0 < a1 for (_, a1), (b0, _) in zip(spans, spans[1:])), "no two audits were in flight at once"
        assert st["budgets"]["wall_s"] < sum(u.seconds for u in audits[1:])  # wall time counted once


@pytest.mark.parametrize("overrides, message", [
    (["evaluate.parallel=0"], "key 'evaluate.parallel': must be at least 1"),
    (["evaluate.gpus=[1,1]"], "key 'evaluate.gpus': [1, 1]: device indices, each at most once"),
])
def test_bad_concurrency_keys_are_named(tmp_path, capsys, overrides, message):
    assert main(["check", str(write_campaign(tmp_path)), *overrides]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_concurrent_audits_on_one_gpu_are_refused(tmp_path, monkeypatch):
    from tik_evo.config import ConfigError, load_campaign
    from tik_evo.initialization import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    campaign = write_campaign(tmp_path)
    with pytest.raises(ConfigError, match="'evaluate.parallel': 2 audits on one GPU"):
        resolve_device(load_campaign(campaign, ["evaluate.parallel=2"]))
    with pytest.raises(ConfigError, match="key 'evaluate.gpus': 2, but 2 CUDA device"):
        resolve_device(load_campaign(campaign, ["evaluate.gpus=[0,2]"]))
    device, facts, warnings = resolve_device(load_campaign(campaign, ["evaluate.gpus=[1,0]"]))
    assert device == "cuda" and not warnings


@pytest.mark.slow
def test_concurrent_audits_benchmark_runs_its_cpu_path(tmp_path):
    """`tik-evo bench concurrent-audits --interpret`: the root on each slot, then a run with one audit at a time and
    one with two slots. One evaluation each: the benchmark's code is what is checked here (two audits in flight
    at once are test_concurrent_audits_overlap_and_record_like_one_at_a_time's)."""
    out = tmp_path / "ca.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "tik_evo.cli", "bench", "concurrent-audits",
                        str(write_campaign(tmp_path)), "--interpret", "--evals", "1", "--out", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-1000:]
    result = json.loads(out.read_text())
    assert set(result["root_on_each"]["median_s"]) == {"cpu0", "cpu1"}
    assert all(v == 1.0 for v in result["root_on_each"]["ratio_to_first"]["cpu0"].values())
    assert [r["evaluations"] for r in result["runs"].values()] == [1, 1]
    assert [r["overrides"][-1] for r in result["runs"].values()] == ["evaluate.parallel=1", "evaluate.parallel=2"]


def test_resume_checks_the_gpus_before_it_writes_anything(tmp_path, monkeypatch, capsys):
    from tik_evo.config import load_campaign, to_yaml

    run = tmp_path / "run"
    with Store.create(run) as s, s.transaction() as txn:
        txn.state["device"] = "cuda"  # a run started on a GPU machine
    config = to_yaml(load_campaign(write_campaign(tmp_path), []))
    (run / "config.yaml").write_text(config)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(["resume", str(run), "evaluate.gpus=[0,3]"]) == 2
    assert "key 'evaluate.gpus': 3, but 2 CUDA device(s) are visible" in " ".join(capsys.readouterr().err.split())
    assert (run / "config.yaml").read_text() == config


@pytest.mark.slow
def test_the_root_is_timed_on_each_gpu_and_a_gpu_that_fails_it_is_named(tmp_path):
    """anchor_gpus under the interpreter (the GPU indices only label the timings there)."""
    from tik_evo.config import load_campaign
    from tik_evo.families import load_family
    from tik_evo.initialization import InitError, anchor_gpus

    campaign = write_campaign(tmp_path, search={"max_evaluations": 1})
    assert main(["run", str(campaign), "--quiet"]) == 0
    run = tmp_path / "run"
    cfg = load_campaign(run / "config.yaml", [])
    with Store.open_writer(run) as store:
        # evaluate.in_flight=2 lists each GPU twice: the root is still timed once on each
        logged = []
        anchor_gpus(store, cfg, load_family("rmsnorm"), "cpu", log=logged.append, slots=[0, 0, 1, 1])
        assert logged[0] == "auditing the root on GPU 0, 1 as well…"
        st = store.state()
        assert set(st["root_latencies_by_gpu"]) == {"0", "1"}
        assert set(st["root_latencies_by_gpu"]["1"]) == set(st["root_latencies"])
        assert store.events()[-1]["text"].startswith("root timed on GPUs 0, 1: per-workload medians within")
        anchor_gpus(store, cfg, load_family("rmsnorm"), "cpu", log=lambda m: None, slots=[0, 1])  # nothing to do
        events = len(store.events())
        with pytest.raises(InitError, match="the root failed its audit on GPU 3 \\(timeout\\)"):
            anchor_gpus(store, load_campaign(run / "config.yaml", ["evaluate.timeout_s=0.01"]),
                        load_family("rmsnorm"), "cpu", log=lambda m: None, slots=[0, 1, 3])
        assert "3" not in store.state()["root_latencies_by_gpu"] and len(store.events()) == events


def test_status_says_where_audit_time_goes():
    from tik_evo.records import Audit
    from tik_evo.report import audit_time

    def audit(impl, seconds, timing):
        return Audit(f"U{impl}", impl, [{"name": "small", "seconds": 1.0}, {"name": "static", "seconds": 0.0},
                                        {"name": "timing", "seconds": timing}], seconds=seconds)

    audits = [audit("I0", 40.0, 30.0), audit("I1", 5.0, 3.0), audit("I2", 7.0, 5.0)]
    assert audit_time(audits, "I0") == "6.0 s mean over 2 offspring (small 1.0 s, timing 4.0 s)"
    assert audit_time(audits[:1], "I0") == ""  # the root alone: nothing searched yet
