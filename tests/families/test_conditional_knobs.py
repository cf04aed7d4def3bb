"""Conditional knob spaces (`Knob.when`): a knob out of effect is neither drawn by the knob operator nor moved
by the one-knob moves, since a change of it would compile the same kernels and waste an audit."""

import random

import pytest
from omegaconf import OmegaConf

from tik_evo.config import Campaign
from tik_evo.families import available, load_family
from tik_evo.family import Knob
from tik_evo.knobs import read_knobs
from tik_evo.neighbours import one_knob_moves
from tik_evo.operators.base import ActionContext
from tik_evo.operators.knob import KnobOperator
from tik_evo.records import Implementation, Opportunity
from tik_evo_kernels.attention import FAMILY as ATTENTION

ROOT_KNOBS = read_knobs(ATTENTION.root_source())
GLUON_PREFILL = {k.name for k in ATTENTION.knobs if k.name.startswith("FULL_WS_")}


@pytest.mark.parametrize("name", available())
def test_every_family_declares_well_formed_conditions(name):
    assert load_family(name).condition_problems() == []


def test_gluon_knobs_in_effect_only_with_the_gluon_kernel():
    assert GLUON_PREFILL and not GLUON_PREFILL & ATTENTION.in_effect(ROOT_KNOBS)  # the root runs Triton
    ws = {**ROOT_KNOBS, "FULL_IMPL": "gluon_ws"}
    on = ATTENTION.in_effect(ws)
    assert GLUON_PREFILL - {"FULL_WS_DIAG"} <= on
    assert "FULL_WS_DIAG" not in on  # it also needs 128-key blocks, the tree row sum, 2 consumers, serial
    assert "FULL_WS_DIAG" in ATTENTION.in_effect({**ws, "BLOCK_N": 128, "ROW_SUM": "tree",
                                                  "FULL_WS_CONSUMERS": 2, "FULL_WS_SCHEDULE": "serial"})
    # conditions chain: with FULL_IMPL back on Triton, FULL_WS_DIAG is out whatever the other values
    assert "FULL_WS_DIAG" not in ATTENTION.in_effect({**ROOT_KNOBS, "BLOCK_N": 128, "ROW_SUM": "tree"})


def test_bad_declarations_are_reported():
    class Bad(type(load_family("rmsnorm"))):
        knobs = (Knob("A", (1, 2), "full", when=(("B", (1,)),)), Knob("B", (1, 2), "full", when=(("A", (1,)),)),
                 Knob("C", (1, 2), "full", when=(("NOPE", (1,)),)), Knob("D", (1, 2), "full", when=(("A", (3,)),)))

    problems = "\n".join(Bad().condition_problems())
    assert "cycle A -> B -> A" in problems and "unknown knob 'NOPE'" in problems and "A in [3]" in problems


class RandomTrial:
    def __init__(self, seed):
        self.rng, self.sampled = random.Random(seed), []

    def suggest_categorical(self, name, choices):
        self.sampled.append(name)
        return self.rng.choice(choices)


def test_knob_operator_draws_a_gated_knob_only_when_its_condition_holds():
    opp = Opportunity("O1", "x", "x", ["full"], ["FULL_WS_BUFFERS", "FULL_IMPL"], repeatable=True)
    parent = Implementation("I0", "h", [], "root", "best", None, None, None, 1.0, 0.0)
    cfg = OmegaConf.structured(Campaign)
    seen = set()
    for seed in range(12):
        trial = RandomTrial(seed)
        prop = KnobOperator().propose(ActionContext(ATTENTION, parent, ATTENTION.root_source(), opp, cfg, None,
                                                    trial))
        impl = read_knobs(prop.source)["FULL_IMPL"] if prop.source else "triton"
        assert trial.sampled[0] == "knob.FULL_IMPL"  # the condition first, whatever the opportunity's order
        assert ("knob.FULL_WS_BUFFERS" in trial.sampled) == (impl != "triton")
        if prop.source is None:
            assert prop.error == "no-change"
        seen.add(impl)
    assert seen == {"triton", "gluon_ws", "auto"}


def test_one_knob_moves_skip_knobs_out_of_effect():
    opps = [Opportunity(f"O{i}", s.kind, s.mechanism, list(s.paths), list(s.knobs), repeatable=True)
            for i, s in enumerate(ATTENTION.opportunities()) if not s.values]
    kinds = sorted({o.kind for o in opps})
    moved = lambda knobs: {k[5:] for m in one_knob_moves(ATTENTION, knobs, opps, kinds, 1000)  # noqa: E731
                           for k, v in m.items() if k.startswith("knob.") and knobs[k[5:]] != v}
    assert not moved(ROOT_KNOBS) & GLUON_PREFILL
    assert "FULL_IMPL" in moved(ROOT_KNOBS)  # the gate itself moves
    assert {"FULL_WS_BUFFERS", "FULL_WS_SCHEDULE"} <= moved({**ROOT_KNOBS, "FULL_IMPL": "gluon_ws"})
