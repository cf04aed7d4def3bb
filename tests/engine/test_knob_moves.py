"""tik_evo.knob_moves and `tik-evo bench knob-moves` on the CPU: which moves it makes, and that a move's checks,
failures and refusals are reported (the bits themselves are a GPU question)."""

from __future__ import annotations

import json

from tik_evo import knob_moves as km
from tik_evo.cli import main
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs


def test_moves_turn_each_knob_to_each_other_value_of_its_space():
    family = load_family("rmsnorm")
    root = read_knobs(family.root_source())
    root_move, *got = km.moves("rmsnorm", {"full", "decode"})
    assert root_move["knob"] is None and root_move["role"] == "root"
    assert got and all(m["role"] in ("full", "decode") and m["value"] != root[m["knob"]] for m in got)
    want = sum(len(k.values) - 1 for k in family.knobs if k.role != "contract")
    assert len(got) == want == len({(m["knob"], repr(m["value"])) for m in got})


def test_a_move_is_checked_and_a_value_the_kernel_refuses_is_reported():
    move = km.moves("rmsnorm", {"decode"})[1]
    out = km.check_move(move, "cpu", "small", 0)
    assert out["checks"] > 0 and not out["failed"] and out["error"] is None, out
    bad = km.check_move({**move, "knob": "BLOCK_H", "value": 100}, "cpu", "small", 0)  # not a power of two
    assert bad["error"] and bad["checks"] == 0


def test_the_script_runs_moves_in_workers_and_writes_them(tmp_path):
    out = tmp_path / "moves.json"
    rc = main(["bench", "knob-moves", "rmsnorm", "--device", "cpu", "--limit", "2", "--workers", "2", "--level",
               "small", "--roles", "full", "--out", str(out)])
    result = json.loads(out.read_text())
    fam = result["families"]["rmsnorm"]
    assert rc == 0 and result["all_passed"] and result["moves"] == 2 and fam["moves"] == 2 and fam["checks"] > 0
    assert fam["failed"] == fam["errors"] == fam["not_run"] == []
    assert main(["bench", "knob-moves", "no_such_family", "--device", "cpu"]) == 2
