"""kv_append family under TRITON_INTERPRET=1 on the CPU: cache bytes, knobs, a caught path mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("kv_append")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"FULL_TOKENS_PER_PROGRAM": 1, "FULL_NUM_WARPS": 1},
    {"FULL_TOKENS_PER_PROGRAM": 32, "DECODE_TOKENS_PER_PROGRAM": 4, "DECODE_NUM_WARPS": 8},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_decode_mismatch_is_caught():
    # A decode path that swaps K and V (in bounds, so the interpreter stays safe).
    src = FAM.root_source()
    old = "_append_tile(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, seqs, seqs, pos, "
    assert src.count(old) == 1
    bad = R.failures(FAM, R.load_source(src.replace(old, old.replace("k_ptr, v_ptr", "v_ptr, k_ptr")), "kv_bad"))
    assert any(kind == "consistency" and "prefill+decode" in name for name, kind, _ in bad)


def test_bench_runs_and_verifies():
    for w in ({"name": "f", "phase": "full", "tokens": 11, "seq_len": 4, "kv_heads": 2, "head_dim": 64,
               "page_size": 4},
              {"name": "d", "phase": "decode", "batch": 3, "context": 9, "kv_heads": 2, "head_dim": 64,
               "page_size": 4}):
        b = FAM.make_bench(R.load_with_knobs(FAM), w, 0, "cpu")
        b.run()
        assert all(c.passed for c in b.verify())
