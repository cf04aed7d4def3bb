"""`tik-evo bench search`: gap closed to a reference point, per run and per workload, from run directories; which
arm runs are started, resumed or left alone (so a benchmark resumes across machine leases)."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from tik_evo import search_bench as sb
from tik_evo.store import Store

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("fixture_store", HERE.parent / "tui" / "fixture_store.py")
fixture_store = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture_store)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return fixture_store.build(tmp_path_factory.mktemp("fx") / "run", finished=True)


def _reference(out: Path, speedup: float, per_workload: dict[str, float]):
    root = dict(fixture_store.WORKLOADS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reference.json").write_text(json.dumps({
        "name": "fast_set", "device": "test", "objective": 1.0, "best_objective_retimed": speedup,
        "root_measurements": {w: t for w, (_, t, _) in root.items()},
        "measurements": {w: t / per_workload.get(w, 1.0) for w, (_, t, _) in root.items()}}))


def test_gap_closed_per_run_and_per_workload(tmp_path, finished_run):
    out = tmp_path / "bench"
    _reference(out, 2.0, {"qwen3-4b.decode.B1": 1.5})
    for arm in ("engine", "random"):
        shutil.copytree(finished_run, out / "runs" / f"{arm}-s0")
    Store.create(out / "runs" / "tpe-s0").close()  # a run whose root never verified: left out too
    s = sb.summarise(out, ["engine", "random", "tpe"], [0, 1])  # seed 1 never ran: left out, not an error
    assert s["arms"]["tpe"]["runs"] == [] and s["arms"]["tpe"]["median_speedup"] is None
    run = s["arms"]["engine"]["runs"][0]
    with Store.open_reader(finished_run) as store:
        st = store.state()
    speedup = st["root_objective"] / st["best_objective"]
    assert run["speedup"] == pytest.approx(speedup) and speedup > 1
    assert run["gap_closed"] == pytest.approx(speedup - 1.0)  # reference 2.0x: gap 1.0
    assert s["arms"]["random"]["median_gap_closed"] == pytest.approx(speedup - 1.0)
    # best so far never falls; audit seconds accumulate one audit at a time (the fixture's audits take 5.5 s)
    ups = [p["speedup"] for p in run["points"]]
    assert ups == sorted(ups) and ups[0] == pytest.approx(1.0)
    assert [p["audit_s"] for p in run["points"]] == pytest.approx([5.5 * (i + 1) for i in range(len(ups))])
    # per workload: only the workloads where the reference is faster than the root have a gap
    decode = run["per_workload"]["qwen3-4b.decode.B1"]
    assert run["gap_closed_per_workload"]["qwen3-4b.decode.B1"] == pytest.approx((decode - 1) / 0.5)
    assert run["gap_closed_per_workload"]["qwen3-4b.full.T8192"] is None
    (out / "search.json").write_text(json.dumps(s))
    md = sb.markdown(s)
    assert "fast_set" in md and f"{speedup:.3f}×" in md
    sb.plot(s, out / "search.png")
    assert (out / "search.png").stat().st_size > 1000


def test_a_reference_no_faster_than_the_root_leaves_no_gap():
    assert sb.gap_closed(1.3, 1.0) is None and sb.gap_closed(1.3, 0.9) is None
    assert sb.gap_closed(1.0, 1.5) == 0.0 and sb.gap_closed(1.5, 1.5) == 1.0


def test_runs_are_started_resumed_or_left_as_finished(tmp_path, finished_run, monkeypatch):
    calls = []
    monkeypatch.setattr(sb, "_cli", lambda args, log: calls.append(args) or 0)
    out = tmp_path / "bench"
    budget = ["search.max_evaluations=30", "evaluate.rounds=3"]
    sb.run_arm("c.yaml", out, "random", 2, budget, log=lambda m: None)  # missing: started with the arm's overrides
    args = calls.pop()
    assert args[:2] == ["run", "c.yaml"] and f"store.path={out / 'runs' / 'random-s2'}" in args
    assert "search.seed=2" in args and "search.sampler=random" in args and "search.space=flat" in args
    assert "search.max_evaluations=30" in args and "evaluate.rounds=3" in args
    shutil.copytree(finished_run, out / "runs" / "engine-s0")
    sb.run_arm("c.yaml", out, "engine", 0, budget, log=lambda m: None)  # finished: read as it is
    assert calls == []
    unfinished = out / "runs" / "tpe-s0"
    fixture_store.build(unfinished)
    sb.run_arm("c.yaml", out, "tpe", 0, budget, log=lambda m: None)  # interrupted: resumed with the budget only
    assert calls.pop() == ["resume", str(unfinished), "--quiet", "search.max_evaluations=30"]


def test_unknown_arms_and_sets_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        sb.main("campaigns/quickstart.yaml", tmp_path, "x", None, ["engine", "nope"], [0], [])
    campaign = str(HERE.parents[1] / "campaigns" / "quickstart.yaml")
    with pytest.raises(ValueError, match="'no_such_set'"):
        sb.reference(campaign, tmp_path, "no_such_set", None, [])


def test_flat_space_seeds_one_opportunity_of_every_knob():
    from tik_evo.config import ConfigError, load_campaign
    from tik_evo.families import load_family
    from tik_evo.initialization import seeded_opportunities

    campaign = str(HERE.parents[1] / "campaigns" / "quickstart.yaml")
    fam = load_family("rmsnorm")
    assert seeded_opportunities(fam, "family") == fam.opportunities()
    (flat,) = seeded_opportunities(fam, "flat")
    assert set(flat.knobs) == {k.name for k in fam.knobs} and len(fam.opportunities()) > 1
    assert load_campaign(campaign, ["search.space=flat"]).search.space == "flat"
    with pytest.raises(ConfigError, match="search.space.*'flt' is not one of"):
        load_campaign(campaign, ["search.space=flt"])


def test_command_line_takes_options_and_overrides_in_any_order(tmp_path, monkeypatch):
    from tik_evo import cli

    seen = {}
    monkeypatch.setattr(sb, "main", lambda *a: seen.setdefault("args", a))
    ref = tmp_path / "ref.py"
    ref.write_text("x = 1\n")
    argv = ["bench", "search", "c.yaml", "search.max_evaluations=5", "--reference-file", str(ref), "--seeds",
            "0,2", "evaluate.rounds=3", "--arms", "engine,random", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 0
    campaign, out, ref_set, ref_file, arms, seeds, overrides = seen["args"]
    assert (campaign, ref_set, ref_file, arms, seeds) == ("c.yaml", None, str(ref), ["engine", "random"], [0, 2])
    assert overrides == ["search.max_evaluations=5", "evaluate.rounds=3"] and out == tmp_path / "o"
    with pytest.raises(SystemExit):  # neither reference given
        cli.main(["bench", "search", "c.yaml"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "search", "c.yaml", "--reference-file", str(tmp_path / "missing.py")])


def test_audit_takes_overrides_after_its_options(monkeypatch):
    import tik_evo.audit_file as af
    from tik_evo import cli

    seen = {}
    monkeypatch.setattr(af, "audit_file", lambda c, f, o, log: seen.setdefault("o", (c, f, o)) and {"verified": True})
    assert cli.main(["audit", "c.yaml", "f.py", "--json", "evaluate.rounds=3", "search.seed=1"]) == 0
    assert seen["o"] == ("c.yaml", "f.py", ["evaluate.rounds=3", "search.seed=1"])
    with pytest.raises(SystemExit):  # an unknown option is still an error, not an override
        cli.main(["audit", "c.yaml", "f.py", "--jsn"])
