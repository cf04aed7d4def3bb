"""Ablation sweeps by overrides: axes parsing, and a tiny two-run sweep end to end."""

import json
import os

import pytest

from tik_evo.cli import main
from tik_evo.sweep import axes, combinations, run_name, slots

from .helpers import write_campaign


def test_axes_split_fixed_and_swept():
    fixed, swept = axes(["search.max_evaluations=3", "ablation.evidence=true,false", "workloads.only=[a,b]",
                         "search.seed=0, 1"])
    assert fixed == ["search.max_evaluations=3", "workloads.only=[a,b]"]
    assert swept == {"ablation.evidence": ["true", "false"], "search.seed": ["0", "1"]}
    combos = combinations(swept)
    assert len(combos) == 4 and {run_name(c) for c in combos} == {
        "evidence=true,seed=0", "evidence=true,seed=1", "evidence=false,seed=0", "evidence=false,seed=1"}


def test_sweep_without_axes_is_refused(tmp_path, capsys):
    assert main(["sweep", str(write_campaign(tmp_path)), "search.seed=1"]) == 2
    assert "comma-separated" in capsys.readouterr().err


@pytest.mark.slow
def test_two_run_sweep(tmp_path, capsys):
    campaign = write_campaign(tmp_path, search={"max_evaluations": 1})
    assert main(["sweep", str(campaign), "search.sampler=tpe,random", "--dir", str(tmp_path / "sw"), "--quiet"]) == 0
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["overrides"] for r in rows] == [{"search.sampler": "tpe"}, {"search.sampler": "random"}]
    assert all(r["evaluations"] == 1 and r["finished"] for r in rows)
    assert "sampler=random" in capsys.readouterr().out
    # Run again: finished runs are kept, not redone.
    before = (tmp_path / "sw" / "sampler=tpe" / "ir.lmdb" / "data.mdb").stat().st_mtime
    assert main(["sweep", str(campaign), "search.sampler=tpe,random", "--dir", str(tmp_path / "sw"), "--quiet"]) == 0
    assert (tmp_path / "sw" / "sampler=tpe" / "ir.lmdb" / "data.mdb").stat().st_mtime == before
    assert main(["compare", str(tmp_path / "sw" / "sampler=tpe"), str(tmp_path / "sw" / "sampler=random")]) == 0


def test_concurrent_slots_share_the_cpus_disjointly():
    cpus = sorted(os.sched_getaffinity(0))
    two = slots(None, 2)
    assert [s.gpu for s in two] == [None, None]
    if len(cpus) >= 2:
        assert two[0].cpus and two[1].cpus and not two[0].cpus & two[1].cpus
        assert two[0].cpus | two[1].cpus <= set(cpus)
    many = slots([3, 1], 2)
    assert [s.gpu for s in many] == [3, 1]
    assert all(s.cpus is None for s in slots(None, len(cpus) + 1))  # fewer CPUs than runs: no pinning


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "0"], "--gpus '0': no CUDA device is visible"),
    (["--gpus", "a,b"], "--gpus 'a,b': expected comma-separated device indices"),
    (["--jobs", "0"], "--jobs 0: must be at least 1"),
])
def test_bad_concurrency_flags_are_named(tmp_path, capsys, flags, message):
    assert main(["sweep", str(write_campaign(tmp_path)), "search.seed=0,1", "--dir", str(tmp_path / "sw"),
                 *flags]) == 2
    assert message in " ".join(capsys.readouterr().err.split())  # rich wraps lines
    assert not (tmp_path / "sw").exists()  # nothing started


def test_a_sweep_over_slots_refuses_runs_that_audit_concurrently_themselves(tmp_path, capsys):
    assert main(["sweep", str(write_campaign(tmp_path)), "search.seed=0,1", "evaluate.parallel=2", "--jobs", "2"]) == 2
    assert "a sweep with --gpus or --jobs gives each run one GPU" in " ".join(capsys.readouterr().err.split())


def test_jobs_on_one_gpu_are_refused(tmp_path, capsys, monkeypatch):
    import tik_evo.initialization as init

    monkeypatch.setattr(init, "resolve_device", lambda cfg: ("cuda", {}, []))
    assert main(["sweep", str(write_campaign(tmp_path)), "search.seed=0,1", "--jobs", "2"]) == 2
    assert "runs sharing one GPU time each other's kernels" in " ".join(capsys.readouterr().err.split())


def test_a_bad_value_in_any_run_is_refused_before_the_first_starts(tmp_path, capsys):
    campaign = write_campaign(tmp_path)
    # The second run's start asks for a value the knob does not have: only the family's knob space says so.
    assert main(["sweep", str(campaign), "start.knobs.BLOCK_H=256,7", "--jobs", "2",
                 "--dir", str(tmp_path / "sw")]) == 2
    assert "BLOCK_H" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()


@pytest.mark.slow
def test_concurrent_sweep_reports_a_failed_run_and_finishes_the_others(tmp_path, capsys):
    campaign = write_campaign(tmp_path, search={"max_evaluations": 1})
    sw = tmp_path / "sw"
    # A root audit cannot finish in 10 ms: that run fails in its child process, the other completes.
    assert main(["sweep", str(campaign), "evaluate.timeout_s=0.01,120", "--jobs", "2", "--dir", str(sw),
                 "--quiet"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "failed: timeout_s=0.01 (exit 1)" in err and "failed its audit (timeout)" in err
    rows = {r["overrides"]["evaluate.timeout_s"]: r for r in json.loads((sw / "sweep.json").read_text())}
    assert rows["120"]["status"] == "done" and rows["120"]["evaluations"] == 1 and rows["120"]["finished"]
    assert rows["120"]["gpu_index"] is None  # interpreter runs: no GPU
    assert rows["0.01"]["status"] == "failed" and rows["0.01"]["evaluations"] == 0
    assert "root verified" in (sw / "timeout_s=120" / "run.log").read_text()
    # The sweep's directory stands for its runs in `compare`; `status` says to use that.
    capsys.readouterr()
    assert main(["compare", str(sw)]) == 0
    assert capsys.readouterr().out.count("timeout_s=") == 2  # both runs, by name (rich may fold the rest)
    assert main(["status", str(sw)]) == 2
    assert "holds a sweep's runs" in " ".join(capsys.readouterr().err.split())


def test_a_run_on_a_gpu_slot_is_started_with_that_index_and_resumed_in_place(tmp_path):
    from tik_evo.sweep import Slot, SweepRun

    run = SweepRun("seed=0", tmp_path / "seed=0", ["c.yaml", "search.seed=0", f"store.path={tmp_path / 'seed=0'}"])
    run.slot = Slot(3, None)
    argv = run.argv()
    assert argv[argv.index("run"):] == ["run", "c.yaml", "search.seed=0", f"store.path={tmp_path / 'seed=0'}",
                                       "evaluate.gpu_index=3", "--quiet"]
    (tmp_path / "seed=0" / "ir.lmdb").mkdir(parents=True)  # killed midway: the next sweep resumes it
    assert run.argv()[-4:] == ["resume", str(tmp_path / "seed=0"), "evaluate.gpu_index=3", "--quiet"]
