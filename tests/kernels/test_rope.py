"""rope family under TRITON_INTERPRET=1 on the CPU: consistency structure, knobs, backward, a caught mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("rope")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"FULL_TOKENS_PER_PROGRAM": 4, "FULL_NUM_WARPS": 8, "DECODE_NUM_WARPS": 1},
    {"ROUND_TABLE_TO_BF16": True, "DECODE_TOKENS_PER_PROGRAM": 2},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_contract_mismatch_is_caught():
    bad = R.failures(FAM, R.hybrid(FAM, {"ROUND_TABLE_TO_BF16": True}, {"ROUND_TABLE_TO_BF16": False}))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)


def test_llama3_table_matches_low_and_high_frequency_limits():
    from kernels.rope.family import inv_freq

    plain, scaled = inv_freq(128, 5e5), inv_freq(128, 5e5, "llama3")
    assert scaled[0] == plain[0]  # highest frequency unscaled
    assert abs(float(scaled[-1] / plain[-1]) - 1 / 8) < 1e-12  # lowest frequency divided by the factor


def test_bench_runs_and_verifies():
    for w in ({"name": "f", "phase": "full", "tokens": 7, "seq_len": 3, "q_heads": 4, "kv_heads": 2,
               "head_dim": 64, "theta": 1e6},
              {"name": "d", "phase": "decode", "batch": 3, "context": 50, "q_heads": 4, "kv_heads": 2,
               "head_dim": 64, "theta": 5e5, "scaling": "llama3"}):
        b = FAM.make_bench(R.load_with_knobs(FAM), w, 0, "cpu")
        b.run()
        assert all(c.passed for c in b.verify())
