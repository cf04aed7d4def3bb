"""One-knob moves of the best, queued ahead of the sampler (`search.neighbours`)."""

import pytest

from tik_evo.cli import main
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs
from tik_evo.neighbours import one_knob_moves, tried_moves
from tik_evo.records import Action, Opportunity
from tik_evo.store import Store

from .helpers import ROOT

FAMILY = load_family("rmsnorm")
ROOT_KNOBS = read_knobs((ROOT / "kernels" / "rmsnorm" / "root.py").read_text())
KINDS = ["decode_schedule", "full_schedule", "joint_tile", "reduction_warps", "reduction_width"]


def _opportunities():
    return [Opportunity(f"O{i}", s.kind, s.mechanism, list(s.paths), list(s.knobs), repeatable=True,
                        values=dict(s.values)) for i, s in enumerate(FAMILY.opportunities())]


def _changed(move, knobs):
    """{knob: value} a move's fixed parameters change against ``knobs``."""
    return {k[5:]: v for k, v in move.items() if k.startswith("knob.") and knobs[k[5:]] != v}


def test_every_other_value_of_every_knob_once_knobs_taking_turns():
    moves = one_knob_moves(FAMILY, ROOT_KNOBS, _opportunities(), KINDS, 100)
    changes = [_changed(m, ROOT_KNOBS) for m in moves]
    assert all(len(c) == 1 for c in changes)
    pairs = [next(iter(c.items())) for c in changes]
    expected = {(k.name, v) for k in FAMILY.knobs for v in k.values if v != ROOT_KNOBS[k.name]}
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected
    # The first turn moves each knob once, so a tight limit still reaches every knob.
    first = one_knob_moves(FAMILY, ROOT_KNOBS, _opportunities(), KINDS, len(FAMILY.knobs))
    assert {next(iter(_changed(m, ROOT_KNOBS))) for m in first} == {k.name for k in FAMILY.knobs}
    # A knob moves through the opportunity naming the fewest knobs (BLOCK_H: reduction_width, not joint_tile),
    # every move is the knob operator's and starts from the best (rank 0).
    assert {m["opportunity.knob"] for m in moves if "BLOCK_H" in _changed(m, ROOT_KNOBS)} == {"reduction_width"}
    assert all(m["operator"] == "knob" and m["parent_rank"] == 0 for m in moves)


def test_tried_moves_kinds_and_out_of_space_values_are_skipped():
    tried = {("BLOCK_H", repr(128)), ("NUM_WARPS", repr(8))}
    moves = one_knob_moves(FAMILY, ROOT_KNOBS, _opportunities(), KINDS, 100, tried)
    pairs = {next(iter(_changed(m, ROOT_KNOBS).items())) for m in moves}
    assert ("BLOCK_H", 128) not in pairs and ("NUM_WARPS", 8) not in pairs and ("BLOCK_H", 256) in pairs
    # Only the kinds the knob operator may act on.
    only = one_knob_moves(FAMILY, ROOT_KNOBS, _opportunities(), ["decode_schedule"], 100)
    assert {next(iter(_changed(m, ROOT_KNOBS))) for m in only} == {"DECODE_ROWS_PER_PROGRAM", "DECODE_NUM_STAGES"}
    # A best whose value lies outside the space cannot hold it as a fixed parameter: its opportunity is skipped.
    odd = {**ROOT_KNOBS, "NUM_WARPS": 3}
    names = {next(iter(_changed(m, odd))) for m in one_knob_moves(FAMILY, odd, _opportunities(), KINDS, 100)}
    assert "NUM_WARPS" not in names and "BLOCK_H" in names
    assert one_knob_moves(FAMILY, ROOT_KNOBS, _opportunities(), KINDS, 0) == []


def test_tried_moves_counts_single_knob_actions_only():
    acts = [Action("A1", "O1", ["I0"], "joint", "knob", params={"BLOCK_H": 512, "_trial_value": 0.1}),
            Action("A2", "O2", ["I0"], "joint", "knob", params={"BLOCK_H": 256, "NUM_WARPS": 2}),
            Action("A3", None, ["I0"], "joint", "llm", params={"NUM_WARPS": 1})]
    assert tried_moves(acts) == {("BLOCK_H", "512")}


@pytest.mark.slow
def test_run_tries_one_knob_moves_first_and_each_once(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={run}",
                 "search.max_evaluations=5", "search.kappa_threshold=30", "--quiet"]) == 0  # 5 moves show the order
    with Store.open_reader(run) as s:
        actions = sorted(s.all("A"), key=lambda a: int(a.id[1:]))
        changes = [{k: v for k, v in a.params.items() if not k.startswith("_")} for a in actions]
        assert len(actions) >= 5 and all(len(c) == 1 for c in changes), changes
        pairs = [next(iter(c.items())) for c in changes]
        assert len(set(pairs)) == len(pairs)  # each (knob, value) once, whichever best it started from
        # Every move starts from the best of its moment: I0 until something is promoted.
        first_promoted = next((d for d in sorted(s.all("D"), key=lambda d: int(d.id[1:])) if d.decision == "promote"),
                              None)
        assert actions[0].parents == ["I0"]
        if first_promoted is None:
            assert all(a.parents == ["I0"] for a in actions)
        assert any("one-knob moves of I0 queued" in e["text"] for e in s.events())
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "one-knob moves" in capsys.readouterr().out

    off = tmp_path / "off"
    assert main(["run", str(ROOT / "campaigns" / "quickstart.yaml"), f"store.path={off}", "search.neighbours=0",
                 "search.max_evaluations=2", "--quiet"]) == 0
    with Store.open_reader(off) as s:
        assert not any("one-knob moves" in e["text"] for e in s.events())


def test_negative_neighbours_is_refused(tmp_path, capsys):
    assert main(["check", str(ROOT / "campaigns" / "quickstart.yaml"), "search.neighbours=-1"]) != 0
    assert "search.neighbours" in capsys.readouterr().err
