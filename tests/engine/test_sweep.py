"""Ablation sweeps by overrides: axes parsing, and a tiny two-run sweep end to end."""

import json

import pytest

from tik_evo.cli import main
from tik_evo.sweep import axes, combinations, run_name

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
