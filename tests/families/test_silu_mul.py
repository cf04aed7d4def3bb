"""silu_mul family under TRITON_INTERPRET=1 on the CPU: consistency structure, knobs, a caught mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("silu_mul")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"FULL_BLOCK_I": 256, "FULL_ROWS_PER_PROGRAM": 4, "DECODE_BLOCK_I": 4096, "FULL_COLS_FASTEST": False},
    {"SILU_FORM": "exp2", "ROUND_SILU": False, "DECODE_ROWS_PER_PROGRAM": 2},
    {"SILU_FORM": "mul_sigmoid", "FULL_NUM_WARPS": 8},
    {"FULL_COLS_FASTEST": True, "FULL_STREAMING": True, "FULL_ROWS_PER_PROGRAM": 2, "FULL_BLOCK_I": 256,
     "DECODE_COLS_FASTEST": True, "DECODE_STREAMING": True},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_column_first_grid_falls_back_past_the_grid_limit():
    impl = R.load_with_knobs(FAM, FULL_COLS_FASTEST=True, FULL_ROWS_PER_PROGRAM=1, FULL_BLOCK_I=1024)
    assert impl._grid(65535, 14336, "FULL") == ((14, 65535), True)
    assert impl._grid(65536, 14336, "FULL") == ((65536, 14), False)  # axis 1 holds at most 65535 programs


def test_contract_mismatch_is_caught():
    bad = R.failures(FAM, R.hybrid(FAM, {"ROUND_SILU": True}, {"ROUND_SILU": False}))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)


def test_bench_runs_and_verifies():
    b = FAM.make_bench(R.load_with_knobs(FAM), {"name": "t", "phase": "full", "tokens": 5, "intermediate": 300},
                       0, "cpu")
    b.run()
    assert all(c.passed for c in b.verify())
