"""Proposals that cross valleys: stepping-stone parents, limit overshoots told to the sampler as constraints,
multivariate TPE, and warm starts from named sets and earlier runs."""

import optuna
import pytest
from omegaconf import OmegaConf

from tik_evo import lineage, warm_start
from tik_evo.config import Campaign, ConfigError
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs
from tik_evo.lineage import Verdict
from tik_evo.records import Implementation
from tik_evo.scheduler import ONE_SHOT, Scheduler, make_sampler
from tik_evo.store import Store

from .helpers import lineage_store


def _cfg(**search):
    c = OmegaConf.structured(Campaign)
    c.search.update(search)
    return c


def _child(s, c, verdict):
    with s.transaction() as t:
        iid = t.new_id("I")
        t.put(Implementation(iid, f"h{iid}", ["I0"], "joint", "pending", objective=verdict.objective))
        lineage.apply(t, iid, "I0", verdict, "U0", c, False, "")
    return iid


@pytest.mark.parametrize("on", [False, True])
def test_a_faster_offspring_over_a_limit_is_a_parent_only_as_a_stepping_stone(tmp_path, on):
    s, c = lineage_store(tmp_path), _cfg(stepping_stones=on)
    faster = _child(s, c, Verdict(objective=1.5, best_objective=2.0, admissible=False, reason="over on x"))
    slower = _child(s, c, Verdict(objective=2.5, best_objective=2.0, admissible=False, reason="over on x"))
    st = s.state()
    assert st.best == "I0" and st.best_objective == 2.0  # never promoted
    assert s.get(slower).status == "archived"  # slower and over a limit: no stepping stone either way
    if on:
        assert s.get(faster).status == "active" and st.frontier[0] == faster  # lowest T first: drawn as rank 0
        assert any(d.impl == faster and "stepping stone" in d.reason for d in s.all("D"))
    else:
        assert s.get(faster).status == "archived" and faster not in st.frontier


def test_overshoots_reach_the_sampler_as_constraints(tmp_path):
    sched = Scheduler(_cfg(constraints=True), tmp_path, {"knob": ["k"]})
    values = {}
    for overshoot, value in ((0.3, 0.2), (-0.1, 0.05)):
        trial = sched.ask()
        trial.suggest_categorical("x", [1, 2])
        sched.tell(trial.number, value, overshoot=overshoot)
        values[trial.number] = overshoot
    for t in sched.study.get_trials():
        assert t.constraints == {"overshoot": values[t.number]}  # what TPE reads: feasible at <= 0
    assert make_sampler("tpe", 0, multivariate=True)._multivariate and not make_sampler("tpe", 0)._multivariate


def test_warm_start_points_from_named_sets_and_runs(tmp_path):
    fam = load_family("attention")
    name, changes = next(iter(fam.named_sets().items()))
    (label, knobs), = warm_start.points([name], fam, "c.yaml")
    assert label == f"set {name}" and knobs == changes
    root = read_knobs(fam.root_source())
    opps = warm_start.opportunities([("a", {**root}), ("b", {**root, **changes})], root, "split_kv")
    diff = {k: v for k, v in changes.items() if root[k] != v}
    assert len(opps) == (1 if diff else 0)  # a point equal to the root is left out
    if diff:
        assert opps[0]["values"] == diff and opps[0]["origin"].startswith(ONE_SHOT)
    with pytest.raises(ConfigError, match="search.warm_start.*'nope' is neither a named set"):
        warm_start.points(["nope"], fam, "c.yaml")
    # an earlier run's best: its knobs; a run of another family is refused by name
    run = tmp_path / "run"
    s = Store.create(run)
    best = {**read_knobs(load_family("rmsnorm").root_source()), "NUM_WARPS": 8}
    with s.transaction() as t:
        t.put(Implementation(t.new_id("I"), "h0", [], "root", "best", objective=2.0, knobs=best))
        t.state.best, t.state.family = "I0", "rmsnorm"
    s.close()
    (label, knobs), = warm_start.points([str(run)], load_family("rmsnorm"), "c.yaml")
    assert knobs == best
    with pytest.raises(ConfigError, match="run of family 'rmsnorm', not 'attention'"):
        warm_start.points([str(run)], fam, "c.yaml")


def test_a_campaign_warm_started_from_an_earlier_run_audits_its_best_first(tmp_path):
    from tik_evo.cli import main

    from .helpers import ROOT

    qs = str(ROOT / "campaigns" / "quickstart.yaml")
    earlier = tmp_path / "earlier"
    s = Store.create(earlier)
    point = {**read_knobs(load_family("rmsnorm").root_source()), "FULL_ROWS_PER_PROGRAM": 2, "DECODE_NUM_STAGES": 2}
    with s.transaction() as t:
        t.put(Implementation(t.new_id("I"), "h0", [], "root", "best", objective=2.0, knobs=point))
        t.state.best, t.state.family = "I0", "rmsnorm"
    s.close()
    run = tmp_path / "run"
    assert main(["run", qs, f"store.path={run}", "search.max_evaluations=1", "search.neighbours=0",
                 f"search.warm_start=[{earlier}]", "search.constraints=true", "--quiet"]) == 0
    with Store.open_reader(run) as r:
        (action,) = r.all("A")
        opp = r.get(action.opportunity)
        assert opp.origin.startswith("seed:") and opp.status == "consumed"
        assert read_knobs(r.source(r.get(action.offspring).source_hash)) == point
        audit = r.get(r.get(action.offspring).audit)
    # the audited trial carries its overshoot as a constraint, as the verdict's limits give it
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(run / "study.journal")))
    (trial,) = optuna.load_study(study_name="search", storage=storage).get_trials()
    expect = max(x["ratio_vs_root"] / x["limit"] - 1 for x in audit.limits.values())
    assert trial.constraints == {"overshoot": pytest.approx(expect)}
    assert main(["check", qs, "search.warm_start=[no_such_set]"]) == 2  # named before any run exists
