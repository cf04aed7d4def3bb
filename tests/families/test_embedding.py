"""embedding family under TRITON_INTERPRET=1 on the CPU: exact gather, knobs, a caught path mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("embedding")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"FULL_BLOCK_H": 256, "FULL_ROWS_PER_PROGRAM": 8, "DECODE_BLOCK_H": 4096},
    {"FULL_BLOCK_H": 4096, "DECODE_ROWS_PER_PROGRAM": 4, "DECODE_NUM_WARPS": 1, "DECODE_SPLIT_ROW": False},
    {"FULL_SPLIT_ROW": True, "FULL_BLOCK_H": 256, "FULL_ROWS_PER_PROGRAM": 2, "DECODE_SPLIT_ROW": True,
     "DECODE_BLOCK_H": 512},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_decode_mismatch_is_caught():
    src = FAM.root_source()
    old = '_launch(ids, weight, out, "DECODE")'
    assert src.count(old) == 1
    # A decode path that stops one column short of the row leaves poison behind.
    mutant = src.replace("def embedding_decode(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:",
                         "def embedding_decode(ids, weight, out):\n    weight = weight[:, :-1]\n"
                         "    return _launch_dec(ids, weight, out)\n\n\ndef _launch_dec(ids, weight, out) -> None:")
    bad = R.failures(FAM, R.load_source(mutant, "emb_bad"))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)


def test_bench_runs_and_verifies():
    b = FAM.make_bench(R.load_with_knobs(FAM), {"name": "t", "phase": "decode", "batch": 3, "vocab": 50,
                                                "hidden": 300}, 0, "cpu")
    b.run()
    assert all(c.passed for c in b.verify())
