"""Answer parsing and edit application (no server, no audit)."""

from __future__ import annotations

import pytest
from conftest import ROOT_SOURCE, answer

from tik_evo.operators.edits import EditError, apply_answer, apply_edit, parse_answer

STAGES = '    "DECODE_NUM_STAGES": 1,'


def test_exact_edit_and_metadata():
    ans = parse_answer(answer((STAGES, STAGES.replace("1", "2")), scope="decode", rationale="deeper pipeline",
                              follow_ups=[{"kind": "Decode Tile!", "mechanism": "try 2 rows", "paths": ["decode", "x"]},
                                          {"kind": "no_mechanism"}]))
    src, how = apply_answer(ROOT_SOURCE, ans)
    assert how == ["exact"] and '"DECODE_NUM_STAGES": 2,' in src
    assert ans.scope == "decode" and ans.rationale == "deeper pipeline"
    assert ans.follow_ups == [{"kind": "decode_tile_", "mechanism": "try 2 rows", "paths": ["decode"]}]
    assert any("without a mechanism" in n for n in ans.notes)


def test_whitespace_tolerant_edit_reindents():
    search = 'def rmsnorm_decode(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,\n' \
             '  out32: torch.Tensor | None = None) -> None:   '  # wrong indentation, trailing spaces
    src, mode = apply_edit(ROOT_SOURCE, search, search.replace("out32", "out32_"))
    assert mode == "whitespace"
    assert "out32_: torch.Tensor | None = None) -> None:" in src
    compile(src, "x", "exec")


def test_indented_block_keeps_relative_indentation():
    search = "for i in range(ROWS_PER_PROGRAM):\n    row = pid * ROWS_PER_PROGRAM + i"  # dedented by 4
    replace = "for i in range(ROWS_PER_PROGRAM):\n    row = i + pid * ROWS_PER_PROGRAM"
    src, mode = apply_edit(ROOT_SOURCE, search, replace)
    assert mode == "whitespace" and "\n        row = i + pid * ROWS_PER_PROGRAM\n" in src


def test_search_not_found_and_ambiguous():
    with pytest.raises(EditError, match="edit 1 of 1: SEARCH text not found"):
        apply_edit(ROOT_SOURCE, "KNOBS = {'NOPE': 1}", "x")
    with pytest.raises(EditError, match="occurs"):
        apply_edit(ROOT_SOURCE, "tl.float32", "tl.float16")
    with pytest.raises(EditError, match="neither"):
        apply_answer(ROOT_SOURCE, parse_answer("I would make it faster."))


def test_whole_file_answer_and_bad_json():
    text = "```json\n{not json}\n```\n```python\n" + ROOT_SOURCE.replace('"BLOCK_H": 0', '"BLOCK_H": 512') + "```"
    ans = parse_answer(text)
    src, how = apply_answer(ROOT_SOURCE, ans)
    assert how == ["file"] and '"BLOCK_H": 512' in src and ans.scope is None
    assert any("does not parse" in n for n in ans.notes)
