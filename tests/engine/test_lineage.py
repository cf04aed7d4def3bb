"""Promotion: every check, every limit, and strictly better than the best by more than the noise margin."""

from dataclasses import replace

from omegaconf import OmegaConf

from tik_evo.config import Campaign
from tik_evo.lineage import judge, objective
from tik_evo.run_state import RunState

STATE = RunState(weights={"a": 1.0, "b": 2.0}, root_latencies={"a": 1.0, "b": 0.5},
                 limits={"a": {"limit": 1.05, "max_s": 1.05}, "b": {"limit": 1.05, "max_s": 0.525}},
                 best_objective=2.0)


def cfg(**objective_cfg):
    c = OmegaConf.structured(Campaign)
    c.objective.update(objective_cfg)
    return c


def m(a, b, spread=0.0):
    return {"a": {"median_s": a, "spread": spread}, "b": {"median_s": b, "spread": spread}}


def test_objective_weighted_and_normalised():
    assert objective(m(1.0, 0.5), STATE, False) == 2.0
    assert objective(m(0.5, 0.25), STATE, True) == 0.5 * 1 + 0.5 * 2


def test_promotes_only_strictly_better_beyond_margin():
    c = cfg(min_margin=0.01, noise_k=2.0)
    assert judge(True, m(0.9, 0.45), {}, STATE, c).promoted
    v = judge(True, m(0.995, 0.4975), {}, STATE, c)  # 0.5% better: inside the 1% margin
    assert not v.promoted and "margin" in v.reason
    v = judge(True, m(0.9, 0.45, spread=0.1), {}, STATE, c)  # 10% better but 20% noise margin
    assert not v.promoted and v.margin == 0.2


def test_limit_blocks_promotion_even_if_total_is_better():
    v = judge(True, m(0.2, 0.6), {}, STATE, cfg())  # T = 1.4 < 2 but b is over its 1.05x limit
    assert not v.admissible and not v.promoted and "b" in v.reason


def test_failed_audit_never_promotes():
    assert not judge(False, m(0.1, 0.1), {}, STATE, cfg()).promoted


def test_best_retimed_in_same_audit_is_the_reference():
    # The best re-timed now at 1.6 (drift): a child at 1.8 is not better, though below the stored 2.0.
    v = judge(True, m(0.9, 0.45), m(0.8, 0.4), STATE, cfg())
    assert v.best_objective == 1.6 and not v.promoted


# -- lineage decisions over a real store ------------------------------------------------------------------
from tik_evo import lineage  # noqa: E402
from tik_evo.lineage import Verdict  # noqa: E402
from tik_evo.records import Implementation  # noqa: E402

from .helpers import lineage_store  # noqa: E402


def _child(s, c, parent, verdict, failed=False):
    with s.transaction() as t:
        iid = t.new_id("I")
        t.put(Implementation(iid, f"h{iid}", [parent], "joint", "pending", objective=verdict.objective))
        lineage.apply(t, iid, parent, verdict, "U0", c, failed, "boom" if failed else "")
    return iid


def test_decisions_promote_continue_archive_abandon(tmp_path):
    s, c = lineage_store(tmp_path), cfg()
    a = _child(s, c, "I0", Verdict(objective=1.5, admissible=True, promoted=True, reason="better"))
    assert s.state()["best"] == a and s.get("I0").status == "active" and s.state()["kappa"] == 0
    b = _child(s, c, a, Verdict(objective=1.6, admissible=True, reason="not better"))
    assert s.get(b).status == "active"
    f = _child(s, c, a, Verdict(), failed=True)
    assert s.get(f).status == "failed" and f not in s.state()["frontier"]
    slow = _child(s, c, a, Verdict(objective=9.0, admissible=True, reason="slow"))
    over = _child(s, c, a, Verdict(objective=1.0, admissible=False, reason="over limit on x"))
    assert s.get(slow).status == "archived" and s.get(over).status == "archived"
    assert s.state()["kappa"] == 4
    kinds = [(d.impl, d.decision) for d in s.all("D")]
    assert (a, "promote") in kinds and (b, "continue") in kinds and (f, "abandon") in kinds
    assert (slow, "archive") in kinds and (over, "archive") in kinds
    s.close()


def test_patience_archives_parent_and_stall_reactivates(tmp_path):
    s, c = lineage_store(tmp_path), cfg()
    c.search.parent_patience, c.search.reactivate_every = 2, 3
    p = _child(s, c, "I0", Verdict(objective=2.1, admissible=True, reason="kept"))
    _child(s, c, p, Verdict(objective=2.2, admissible=True, reason="no"))
    _child(s, c, p, Verdict(objective=2.3, admissible=True, reason="no"))  # second miss from p: archived
    decisions = [(d.impl, d.decision) for d in s.all("D")]
    assert (p, "archive") in decisions
    # κ reached 3 on that step: the best archived alternative came back to the frontier.
    assert (p, "reactivate") in decisions and p in s.state()["frontier"] and p not in s.state()["archive"]
    s.close()


def test_an_audit_is_judged_against_the_root_as_its_own_gpu_runs_it():
    # GPU 1 runs the root 10% slower: a candidate at 1.1x GPU 0's root times is within its limits there.
    state = replace(STATE, root_latencies_by_gpu={"0": STATE.root_latencies, "1": {"a": 1.1, "b": 0.55}})
    assert not judge(True, m(1.1, 0.55), {}, state, cfg()).admissible  # anchored on the initialization's root
    assert not judge(True, m(1.1, 0.55), {}, state, cfg(), gpu=0).admissible
    v = judge(True, m(1.1, 0.55), {}, state, cfg(normalize=True), gpu=1)
    assert v.admissible and v.limits["a"]["ratio_vs_root"] == 1.0 and v.limits["a"]["max_s"] == 1.05 * 1.1
    assert v.objective == 3.0  # normalised by GPU 1's root: the same T as the root's
    assert judge(True, m(1.1, 0.55), {}, state, cfg(), gpu=7).limits["a"]["ratio_vs_root"] == 1.1  # unknown GPU
