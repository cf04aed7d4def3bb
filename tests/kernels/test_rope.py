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
    {"DECODE_LOAD_ORDER": "early", "DECODE_HEAD_SPLIT": 4, "FULL_HEAD_SPLIT": 2, "FULL_TOKENS_PER_PROGRAM": 2},
    {"COS_SIN": "sincos", "DECODE_LOAD_ORDER": "early", "DECODE_HEAD_SPLIT": 2, "FULL_TOKENS_PER_PROGRAM": 4},
    {"COS_SIN": "sincos", "ROUND_TABLE_TO_BF16": True, "FULL_LOAD_ORDER": "early", "FULL_TOKENS_PER_PROGRAM": 8},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_contract_mismatch_is_caught():
    bad = R.failures(FAM, R.hybrid(FAM, {"ROUND_TABLE_TO_BF16": True}, {"ROUND_TABLE_TO_BF16": False}))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)


def test_cos_sin_mismatch_is_caught():
    bad = R.failures(FAM, R.hybrid(FAM, {"COS_SIN": "sincos"}, {"COS_SIN": "table"}))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)


def _rotate_unit(impl, pos, inv, cos, sin, half):
    """q = [1]*half + [0]*half: q32 holds the kernel's cos (first half) and sin (second half) at each position."""
    import torch

    n = len(pos)
    q = torch.zeros(n, 1, 2 * half, dtype=torch.bfloat16)
    q[:, :, :half] = 1
    qo, ko = torch.empty_like(q), torch.empty_like(q)
    q32, k32 = torch.empty(n, 1, 2 * half), torch.empty(n, 1, 2 * half)
    impl.rope_decode(q, q.clone(), cos, sin, pos, qo, ko, q32, k32, inv_freq=inv)
    return q32[:, 0, :half], q32[:, 0, half:]


def test_sincos_within_two_ulp_of_fp64_up_to_128k():
    import torch

    from kernels.rope.family import inv_freq, rope_table

    impl = R.load_with_knobs(FAM, COS_SIN="sincos", DECODE_TOKENS_PER_PROGRAM=4)
    for theta, scaling in ((1e6, None), (5e5, "llama3")):
        inv = inv_freq(128, theta, scaling)
        pos = torch.tensor([0, 1, 2, 3, 777, 8191, 32767, 65537, 100003, 131071], dtype=torch.int32)
        cos, sin = rope_table(131072, 128, theta, scaling, "cpu")
        c, s = _rotate_unit(impl, pos, inv, cos, sin, 64)
        ang = pos.double()[:, None] * inv[None, :]
        assert (c.double() - ang.cos()).abs().max() < 1.2e-7  # 2 ulp at 1.0 (the table: 0.5 ulp)
        assert (s.double() - ang.sin()).abs().max() < 1.2e-7
        assert (c[0] == 1).all() and (s[0] == 0).all()


def test_sincos_without_inv_freq_refuses():
    import torch

    impl = R.load_with_knobs(FAM, COS_SIN="sincos")
    q = torch.ones(1, 2, 64, dtype=torch.bfloat16)
    cos = sin = torch.ones(4, 32)
    with pytest.raises(ValueError, match="inv_freq"):
        impl.rope_decode(q, q, cos, sin, torch.zeros(1, dtype=torch.int32), q.clone(), q.clone())


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


def test_auto_head_split_follows_the_sm_count(monkeypatch):
    # DECODE_HEAD_SPLIT 0 picks 4, 2 or 1 programs per token from the SM count (1 on the CPU, so force a GPU's
    # 132): decode batches of 1..33 tokens then run split launches, and must still match the full path.
    mod = R.load_with_knobs(FAM)
    assert mod.KNOBS["DECODE_HEAD_SPLIT"] == 0
    seen = []
    real = mod._rope_kernel

    class Spy:
        def __getitem__(self, grid):
            seen.append(grid[1])
            return real[grid]

    monkeypatch.setattr(mod, "_sm_count", lambda device: 132)
    monkeypatch.setattr(mod, "_rope_kernel", Spy())
    assert R.failures(FAM, mod) == []
    assert 4 in seen and 1 in seen, seen  # small decode batches split 4 ways; the full path (knob 1) does not
