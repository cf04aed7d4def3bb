"""The Optuna scheduler: static space, samplers from config, persistence across a restart, recovery."""

import optuna
import pytest
from omegaconf import OmegaConf

from tik_evo.config import SAMPLERS, Campaign
from tik_evo.records import Opportunity
from tik_evo.scheduler import Scheduler

OPPS = [Opportunity("O0", "width", "m", ["full", "decode"], ["BLOCK_H"]),
        Opportunity("O1", "decode_schedule", "m", ["decode"], ["DECODE_NUM_STAGES"])]
KINDS = {"knob": ["decode_schedule", "width"]}


def cfg(sampler="tpe", lineage=True):
    c = OmegaConf.structured(Campaign)
    c.search.sampler = sampler
    c.ablation.lineage_management = lineage
    return c


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_the_static_space(tmp_path, sampler):
    s = Scheduler(cfg(sampler), tmp_path, KINDS)
    for i in range(8):
        trial = s.ask()
        op, opp, parent = s.choose(trial, ["I0", "I3"], OPPS, "I0")
        assert op == "knob" and opp in OPPS and parent in ("I0", "I3")
        trial.suggest_categorical(f"knob.{opp.knobs[0]}", [1, 2, 3])
        s.tell(trial.number, None if i % 3 == 0 else 0.01 * i)
    states = [t.state for t in s.study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 3


def test_study_persists_and_recovers_open_trials(tmp_path):
    s = Scheduler(cfg(), tmp_path, KINDS)
    t0, t1 = s.ask(), s.ask()
    s.tell(t0.number, 0.5)
    # A new scheduler on the same run directory (a resumed run) sees the study and closes t1.
    s2 = Scheduler(cfg(), tmp_path, KINDS)
    assert len(s2.study.trials) == 2
    assert s2.recover({t1.number: 0.25}) == 1
    assert [t.value for t in s2.study.trials] == [0.5, 0.25]
    assert s2.recover({}) == 0


def test_seeded_sampler_is_reproducible(tmp_path):
    picks = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        s = Scheduler(cfg("random"), tmp_path / run, KINDS)
        picks.append([s.choose(s.ask(), ["I0", "I1", "I2"], OPPS, "I0") for _ in range(5)])
    assert [(o.id, p) for _, o, p in picks[0]] == [(o.id, p) for _, o, p in picks[1]]


def test_without_lineage_management_parent_is_always_best(tmp_path):
    s = Scheduler(cfg("random", lineage=False), tmp_path, KINDS)
    assert {s.choose(s.ask(), ["I4", "I1", "I2"], OPPS, "I1")[2] for _ in range(10)} == {"I1"}
