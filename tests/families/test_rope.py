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

    from tik_evo_kernels.rope.family import inv_freq, rope_table

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
    from tik_evo_kernels.rope.family import inv_freq

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


# -- pre-gathered rows (rows=(cos_rows, sin_rows)): the table path's bits without the position -> table load --------
def _bits(t):
    import torch

    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _rows_vs_table(impl, n_tokens, hq=3, hk=2, d=64, start=5):
    """(table outputs, rows outputs) of rope_full, rope_decode and rope_backward on n_tokens tokens."""
    import torch

    from tik_evo_kernels.rope.family import rope_table

    g = torch.Generator().manual_seed(n_tokens)
    pos = torch.randperm(n_tokens + 40, generator=g)[:n_tokens].to(torch.int32) + start  # scattered positions
    cos, sin = rope_table(start + n_tokens + 40, d, 1e4, None, "cpu")
    q = (torch.randn(n_tokens, hq, d, generator=g) * 3).bfloat16()
    k = (torch.randn(n_tokens, hk, d, generator=g) * 3).bfloat16()
    rows = impl.gather_rows(cos, sin, pos)
    res = []
    for args, kw in (((cos, sin, pos), {}), ((None, None, None), {"rows": rows})):
        outs = []
        for fn in (impl.rope_full, impl.rope_decode):
            o = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")),
                 torch.full(q.shape, float("nan")), torch.full(k.shape, float("nan")))
            fn(q, k, *args, *o, **kw)
            outs += o
        o = (torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
        impl.rope_backward(q, k, *args, *o, **kw)
        res.append(outs + list(o))
    return res


@pytest.mark.parametrize("n, knobs", [  # token counts that are not multiples of any tokens-per-program or split
    (13, {}),  # the root: early loads, decode head split auto (1 program per token on the CPU)
    (7, {"ROUND_TABLE_TO_BF16": True, "FULL_TOKENS_PER_PROGRAM": 4, "DECODE_TOKENS_PER_PROGRAM": 2}),
    (7, {"DECODE_HEAD_SPLIT": 2, "FULL_HEAD_SPLIT": 4, "FULL_LOAD_ORDER": "serial", "DECODE_LOAD_ORDER": "serial"}),
    (11, {"ROUND_TABLE_TO_BF16": True, "DECODE_HEAD_SPLIT": 4, "DECODE_LOAD_ORDER": "serial",
          "FULL_TOKENS_PER_PROGRAM": 8, "FULL_HEAD_SPLIT": 2}),
])
def test_rows_give_the_table_paths_bits(n, knobs):
    import torch

    table, rows = _rows_vs_table(R.load_with_knobs(FAM, **knobs), n)
    for a, b in zip(table, rows):  # full (4 outputs), decode (4), backward (2)
        assert torch.isfinite(a.float()).all() and torch.equal(_bits(a), _bits(b))
    for a, b in zip(rows[:4], rows[4:8]):  # and the paths' contract holds with rows: decode == full
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("knobs", [{}, {"DECODE_LOAD_ORDER": "serial", "DECODE_HEAD_SPLIT": 2}])
def test_rotation_in_place_gives_the_same_bits(knobs):
    # q_out = q, k_out = k (as vLLM rotates): every element is loaded before its program stores it, and programs
    # touch disjoint tokens, so rotating in place gives the out-of-place bits.
    import torch

    from tik_evo_kernels.rope.family import rope_table

    impl = R.load_with_knobs(FAM, **knobs)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(9, 4, 64, generator=g).to(torch.bfloat16), torch.randn(9, 2, 64, generator=g).to(torch.bfloat16)
    pos = torch.randint(0, 40, (9,), generator=g)
    cos, sin = rope_table(40, 64, 1e6, None, "cpu")
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    impl.rope_decode(q, k, cos, sin, pos, qo, ko)
    qi, ki = q.clone(), k.clone()
    impl.rope_decode(qi, ki, cos, sin, pos, qi, ki)
    assert torch.equal(_bits(qi), _bits(qo)) and torch.equal(_bits(ki), _bits(ko))
    assert not torch.equal(_bits(qi), _bits(q))


def test_rows_are_rounded_like_the_table():
    # ROUND_TABLE_TO_BF16 applies to gathered rows: on, rows give the rounded table's bits, not the fp32 ones.
    import torch

    plain, rounded = R.load_with_knobs(FAM), R.load_with_knobs(FAM, ROUND_TABLE_TO_BF16=True)
    _, rows_plain = _rows_vs_table(plain, 5)
    table_rounded, rows_rounded = _rows_vs_table(rounded, 5)
    assert torch.equal(_bits(rows_rounded[2]), _bits(table_rounded[2]))
    assert not torch.equal(_bits(rows_rounded[2]), _bits(rows_plain[2]))


def test_gather_rows_is_an_exact_copy():
    import torch

    from tik_evo_kernels.rope.family import rope_table

    impl = R.load_with_knobs(FAM)
    cos, sin = rope_table(50, 64, 1e6, None, "cpu")
    for dtype in (torch.int32, torch.int64):
        pos = torch.tensor([49, 0, 7, 7, 31], dtype=dtype)
        c, s = impl.gather_rows(cos, sin, pos)
        assert c.dtype == torch.float32 and c.is_contiguous() and torch.equal(c, cos[pos.long()])
        assert torch.equal(s, sin[pos.long()])


def test_rows_errors_name_the_argument_and_value():
    import torch

    impl = R.load_with_knobs(FAM)
    q, k = torch.ones(3, 2, 64, dtype=torch.bfloat16), torch.ones(3, 1, 64, dtype=torch.bfloat16)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    good = torch.zeros(3, 32)

    def call(rows, fn=impl.rope_full):
        fn(q, k, None, None, None, qo, ko, rows=rows)

    with pytest.raises(ValueError, match=r"cos_rows must be contiguous fp32 .*\[3, 32\], got torch.float64 \[3, 32\]"):
        call((good.double(), good))
    with pytest.raises(ValueError, match=r"sin_rows .* got torch.float32 \[4, 32\]"):
        call((good, torch.zeros(4, 32)), impl.rope_decode)
    with pytest.raises(ValueError, match=r"sin_rows .*\[3, 64\]"):  # a full-width (HF layout) row is refused
        call((good, torch.zeros(3, 64)))
    with pytest.raises(ValueError, match=r"cos_rows .*not contiguous"):
        call((torch.zeros(32, 3).t(), good))
    with pytest.raises(ValueError, match=r"rows must be \(cos_rows, sin_rows\), got Tensor"):
        call(good)
    with pytest.raises(ValueError, match=r"cos_rows must be a tensor, got NoneType"):
        call((None, good))
    with pytest.raises(ValueError, match="unless rows="):  # neither a table nor rows
        impl.rope_backward(q, k, None, None, None, qo, ko)
    sincos = R.load_with_knobs(FAM, COS_SIN="sincos")
    with pytest.raises(ValueError, match="rows=.*conflicts with COS_SIN='sincos'"):
        sincos.rope_decode(q, k, None, None, None, qo, ko, rows=(good, good))


def test_harness_checks_rows_and_catches_a_wrong_row():
    from tik_evo_kernels.rope.family import takes_rows

    load, failures = R.loader(FAM)
    assert takes_rows(load()) and not takes_rows(load(COS_SIN="sincos"))
    names = [c.name for c in FAM.run_checks(load(), FAM.check_cases("small")[0], 0, "cpu")]
    assert sum("rows == table" in n for n in names) == 10, names
    bad = failures(load("rows_wrong_row", lambda s: s.replace("row = tok.to(tl.int64)", "row = tok.to(tl.int64) // 2")),
                   level="small")
    assert bad and all("rows == table" in name and kind == "consistency" for name, kind, _ in bad), bad
