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


def test_slot_mapped_mismatch_is_caught():
    # The slot-mapped path swapping K and V: the family's slot-mapped rollout no longer writes the full pass's
    # bytes (the other paths still do).
    src = FAM.root_source()
    old = "_copy_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, t * row_stride,"
    assert src.count(old) == 1
    bad = R.failures(FAM, R.load_source(src.replace(old, old.replace("k_ptr, v_ptr", "v_ptr, k_ptr")), "kv_slots"),
                     level="small")
    assert bad and all(kind == "consistency" and name.startswith("slot-mapped rollout") for name, kind, _ in bad)


def test_slot_mapped_append_refuses_what_it_cannot_read():
    import torch

    mod = R.load_with_knobs(FAM)
    cache = torch.zeros((4, 16, 2, 64), dtype=torch.bfloat16)
    k = torch.zeros((3, 2, 64), dtype=torch.bfloat16)
    for args, words in (((k, k, cache, cache, torch.zeros(3, dtype=torch.float32)), "slot_mapping torch.float32"),
                        ((k, k, cache, cache, torch.zeros(2, dtype=torch.int64)), "int32 or int64 [3]"),
                        ((k.transpose(1, 2).contiguous().transpose(1, 2), k, cache, cache,
                          torch.zeros(3, dtype=torch.int64)), "rows of contiguous values"),
                        ((k, k, cache, cache[:, :8], torch.zeros(3, dtype=torch.int64)), "v_cache (4, 8, 2, 64)")):
        with pytest.raises(ValueError, match="kv_append_slots: ") as e:
            mod.kv_append_slots(*args)
        assert words in str(e.value), str(e.value)
