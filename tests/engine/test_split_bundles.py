"""Bundle splits: a faster but over-limit multi-knob offspring becomes one opportunity per knob, tried first
with exactly the value it had."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tik_evo.config import Campaign
from tik_evo.knobs import read_knobs
from tik_evo.lineage import Verdict
from tik_evo.operators.base import ActionContext, Proposal
from tik_evo.operators.knob import KnobOperator
from tik_evo.records import Implementation, Opportunity
from tik_evo.scheduler import Scheduler
from tik_evo.store import Store
from tik_evo_kernels.rmsnorm import FAMILY

ROOT_DIR = Path(__file__).resolve().parents[2]
ROOT_SRC = (ROOT_DIR / "kernels" / "rmsnorm" / "root.py").read_text()
OPP = Opportunity("O3", "joint_tile", "retune", ["full", "decode"], ["BLOCK_H", "NUM_WARPS"], repeatable=True)


class NoTrial:
    def suggest_categorical(self, name, choices):
        raise AssertionError(f"sampled {name} although the opportunity named its value")


def ctx(opp, split=True, source=""):
    cfg = OmegaConf.structured(Campaign)
    cfg.search.split_bundles = split
    parent = Implementation("I0", "h", [], "joint", "verified", None, None, None, 1.0, 0.0)
    return ActionContext(FAMILY, parent, source, opp, cfg, None, NoTrial())


def verdict(objective, best, over):
    limits = {"w1": {"ok": not over}, "w2": {"ok": True}}
    return Verdict(objective=objective, best_objective=best, admissible=not over, limits=limits)


def test_faster_over_limit_bundle_splits_into_single_knob_opportunities():
    prop = Proposal("src", "joint", params={"BLOCK_H": 1024, "NUM_WARPS": 8})
    ups = KnobOperator().after_audit(ctx(OPP), prop, verdict(0.9, 1.0, over=True))
    assert [(u["knobs"], u["values"], u["kind"], u["split"]) for u in ups] == [
        (["BLOCK_H"], {"BLOCK_H": 1024}, "joint_tile", True), (["NUM_WARPS"], {"NUM_WARPS": 8}, "joint_tile", True)]
    assert "w1" in ups[0]["mechanism"]


def test_no_split_when_within_limits_slower_single_knob_or_disabled():
    two = Proposal("src", "joint", params={"BLOCK_H": 1024, "NUM_WARPS": 8})
    one = Proposal("src", "joint", params={"BLOCK_H": 1024})
    op = KnobOperator()
    assert op.after_audit(ctx(OPP), two, verdict(0.9, 1.0, over=False)) == []  # admissible: judged as is
    assert op.after_audit(ctx(OPP), two, verdict(1.1, 1.0, over=True)) == []  # not faster: nothing to save
    assert op.after_audit(ctx(OPP), one, verdict(0.9, 1.0, over=True)) == []
    assert op.after_audit(ctx(OPP, split=False), two, verdict(0.9, 1.0, over=True)) == []


def test_split_opportunity_applies_its_value_without_sampling():
    src = ROOT_SRC
    split = Opportunity("O9", "joint_tile", "alone", ["full", "decode"], ["NUM_WARPS"], origin="split:U4",
                        values={"NUM_WARPS": 8})
    prop = KnobOperator().propose(ctx(split, source=src))
    assert prop.error == "" and prop.params == {"NUM_WARPS": 8} and prop.scope == "joint"
    assert read_knobs(prop.source)["NUM_WARPS"] == 8
    assert {k: v for k, v in read_knobs(prop.source).items() if k != "NUM_WARPS"} == \
        {k: v for k, v in read_knobs(src).items() if k != "NUM_WARPS"}


def test_scheduler_offers_split_under_its_family_kind_first(tmp_path):
    cfg = OmegaConf.structured(Campaign)
    cfg.search.sampler = "random"
    used = Opportunity("O3", "joint_tile", "m", ["full", "decode"], ["BLOCK_H", "NUM_WARPS"], repeatable=True,
                       uses=3)
    split = Opportunity("O9", "joint_tile", "alone", ["full", "decode"], ["NUM_WARPS"], origin="split:U4",
                        values={"NUM_WARPS": 8})
    s = Scheduler(cfg, tmp_path, {"knob": ["joint_tile"], "llm": ["follow-up"]})
    assert Scheduler._matches(split, "joint_tile") and not Scheduler._matches(split, "follow-up")
    picks = {(op, o.id) for op, o, _ in (s.choose(s.ask(), ["I0"], [used, split], "I0") for _ in range(12))}
    assert ("knob", "O9") in picks and ("knob", "O3") not in picks
    # A queued one-knob move keeps its family opportunity and its named parent; the split waits its turn.
    s.queue([{"operator": "knob", "opportunity.knob": "joint_tile", "knob.NUM_WARPS": 2}], "I1")
    assert [(op, o.id, parent) for op, o, parent in [s.choose(s.ask(), ["I0", "I1"], [used, split], "I0")]] == \
        [("knob", "O3", "I1")]


@pytest.mark.slow
def test_run_splits_a_faster_over_limit_bundle_and_tries_its_knobs(tmp_path, monkeypatch):
    """Whole loop on the CPU, with every verified offspring judged faster but over one limit."""
    from tik_evo import lineage
    from tik_evo.cli import main

    real = lineage.judge

    def over_limit(*args, **kwargs):
        v = real(*args, **kwargs)
        if v.objective is not None:
            name = next(iter(v.limits))
            v.limits[name].update(ok=False, ratio_vs_root=v.limits[name]["limit"] * 1.1)
            v.objective, v.admissible, v.promoted = v.best_objective * 0.5, False, False
        return v

    monkeypatch.setattr(lineage, "judge", over_limit)
    run = tmp_path / "run"
    rc = main(["run", str(ROOT_DIR / "campaigns" / "quickstart.yaml"), f"store.path={run}", "search.sampler=random",
               "search.max_evaluations=6", "search.seed=3", "search.neighbours=0", "--quiet"])
    assert rc == 0
    with Store.open_reader(run) as s:
        actions = {a.id: a for a in s.all("A")}
        audits = {u.id: u for u in s.all("U")}
        splits = [o for o in s.all("O") if o.origin.startswith("split:")]
        bundles = [a for a in actions.values() if a.outcome == "audited" and len(a.params) > 2]
        assert bundles, "no multi-knob offspring was audited: pick another seed"
        assert splits and all(len(o.knobs) == 1 and set(o.values) == set(o.knobs) for o in splits)
        # Each split names a knob value of the audited bundle it came from...
        for o in splits:
            src = next(a for a in actions.values() if a.offspring == audits[o.origin[6:]].impl)
            assert o.values.items() <= src.params.items()
        # ... and the ones already used were tried alone, at exactly that value.
        used = [a for a in actions.values() if a.opportunity in {o.id for o in splits}]
        assert used
        for a in used:
            o = next(o for o in splits if o.id == a.opportunity)
            assert {k: v for k, v in a.params.items() if not k.startswith("_")} in ({}, o.values)


class RecordingTrial:
    def __init__(self):
        self.sampled = []

    def suggest_categorical(self, name, choices):
        self.sampled.append(name)
        return choices[-1]


def test_a_family_opportunity_fixes_its_switch_and_samples_the_rest():
    # moe_routing's topk_network sets FULL_TOPK_NET=True (the mechanism) and samples the tile around it.
    from tik_evo.families import load_family

    family = load_family("moe_routing")
    spec = next(o for o in family.opportunities() if o.kind == "topk_network")
    assert dict(spec.values) == {"FULL_TOPK_NET": True}
    opp = Opportunity("O1", spec.kind, spec.mechanism, list(spec.paths), list(spec.knobs), repeatable=True,
                      values=dict(spec.values))
    cfg = OmegaConf.structured(Campaign)
    parent = Implementation("I0", "h", [], "joint", "verified", None, None, None, 1.0, 0.0)
    trial = RecordingTrial()
    prop = KnobOperator().propose(ActionContext(family, parent, family.root_source(), opp, cfg, None, trial))
    assert prop.error == "" and prop.scope == "full"
    assert trial.sampled == ["knob.FULL_BLOCK_T", "knob.FULL_NUM_WARPS"]
    assert read_knobs(prop.source)["FULL_TOPK_NET"] is True and prop.params["FULL_TOPK_NET"] is True


def test_check_names_an_opportunity_that_fixes_a_bad_value(monkeypatch):
    from tik_evo.cli import check_family
    from tik_evo.families import load_family
    from tik_evo.family import OpportunitySpec

    family = load_family("moe_routing")
    bad = [OpportunitySpec("a", "m", knobs=("FULL_TOPK_NET",), values=(("FULL_TOPK_NET", "yes"),)),
           OpportunitySpec("b", "m", knobs=("FULL_BLOCK_T",), values=(("FULL_TOPK_NET", True),))]
    monkeypatch.setattr(family, "opportunities", lambda: bad)
    problems = check_family(family)
    assert any("opportunity 'a' fixes FULL_TOPK_NET='yes', not one of [False, True]" in p for p in problems)
    assert any("opportunity 'b' fixes 'FULL_TOPK_NET', not one of its knobs" in p for p in problems)


def test_initialization_seeds_a_family_opportunity_with_its_fixed_values(tmp_path):
    # The root audit of a moe_routing run on the CPU (its tiny workloads): the topk_network opportunity lands in
    # the IR with the value it fixes, which the knob operator then applies.
    from tik_evo.config import load_campaign
    from tik_evo.families import load_family
    from tik_evo.initialization import initialize, resolve_device
    from tik_evo.workloads import resolve_workloads

    cfg = load_campaign(ROOT_DIR / "campaigns" / "h200_moe_routing.yaml", [
        "gpu.policy=interpret", "workloads.file=../workloads/moe_routing_cpu.yaml",
        "workloads.only=[decode.B3.E128.k8]", "correctness.seeds=[0]", "evaluate.interpreter_reps=1",
        f"store.path={tmp_path / 'run'}"])
    family = load_family(cfg.kernel)
    device, facts, _ = resolve_device(cfg)
    with Store.create(tmp_path / "run") as store:
        initialize(store, cfg, family, resolve_workloads(cfg, family), device, facts, log=lambda m: None)
        seeded = [store.get(o) for o in store.state()["pending_opportunities"]]
    net = [o for o in seeded if o.kind == "topk_network"]
    assert len(net) == 1 and net[0].values == {"FULL_TOPK_NET": True} and net[0].origin == "family"
    assert all(o.values == {} for o in seeded if o.kind != "topk_network")
