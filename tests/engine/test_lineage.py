"""Promotion: every check, every limit, and strictly better than the best by more than the noise margin."""

from omegaconf import OmegaConf

from tik_evo.config import Campaign
from tik_evo.lineage import judge, objective

STATE = {"weights": {"a": 1.0, "b": 2.0}, "root_latencies": {"a": 1.0, "b": 0.5},
         "limits": {"a": {"limit": 1.05, "max_s": 1.05}, "b": {"limit": 1.05, "max_s": 0.525}},
         "best_objective": 2.0}


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
