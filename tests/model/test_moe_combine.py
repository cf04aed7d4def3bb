"""The policy update's glue kernels under the interpreter. The MoE layer's combine and dispatch gradient
(kernels/moe_combine.py): a token's combined row has the same bits whichever tokens share its launch, the values
match fp64 arithmetic, and the backward matches fp64 autograd. The embedding table's gradient
(kernels/embedding_backward.py) matches fp64 index_add."""

import pytest
import torch

from tik_evo_kernels.moe_combine import combine, combine_backward

TOKENS, TOP_K, HIDDEN = 13, 4, 200  # HIDDEN: not a power of two, and wider than one column block for some tiles


def case(seed: int, tokens: int = TOKENS, top_k: int = TOP_K, hidden: int = HIDDEN):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn((tokens * top_k, hidden), generator=g).to(torch.bfloat16)
    weights = torch.softmax(torch.randn((tokens, top_k), generator=g), -1).to(torch.bfloat16)
    pos = torch.randperm(tokens * top_k, generator=g).view(tokens, top_k)  # the experts' order: any permutation
    return rows, weights, pos


def reference(rows, weights, pos):
    return (weights.double()[:, :, None] * rows.double()[pos]).sum(1)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_token_combines_to_the_same_bits_in_any_batch(seed):
    rows, weights, pos = case(seed)
    full = combine(rows, weights, pos)
    assert full.dtype == torch.bfloat16 and full.shape == (TOKENS, HIDDEN)
    for subset in ([0], [TOKENS - 1], [5, 2, 11], list(range(1, TOKENS, 2))):  # decode batches, any order
        part = combine(rows, weights[subset], pos[subset])
        assert torch.equal(part.view(torch.int16), full[subset].view(torch.int16)), subset
    ref = reference(rows, weights, pos)
    assert float((full.double() - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -7  # one bf16 rounding
    # int32 positions and no weights (the dispatch's gradient: the plain slot-order sum)
    plain = combine(rows, None, pos.to(torch.int32))
    assert torch.allclose(plain.double(), rows.double()[pos].sum(1), rtol=2 ** -7, atol=1e-2)


def test_the_backward_matches_fp64_autograd():
    rows, weights, pos = case(2)
    gy = torch.randn((TOKENS, HIDDEN), generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    g_rows, g_w = combine_backward(rows, weights, pos, gy)
    r64, w64 = rows.double().requires_grad_(), weights.double().requires_grad_()
    reference(r64, w64, pos).backward(gy.double())
    for ours, ref in ((g_rows, r64.grad), (g_w, w64.grad)):
        assert ours.dtype == torch.bfloat16
        rel = float((ours.double() - ref).norm() / ref.norm())
        assert rel < 1e-2, rel
    # rows no slot points at (more rows than pairs) get zero gradient
    extra = torch.cat([rows, rows[:3]])
    g_extra, _ = combine_backward(extra, weights, pos, gy)
    assert torch.equal(g_extra[:-3], g_rows) and not g_extra[-3:].any()


def test_no_tokens_and_bad_shapes():
    rows, weights, pos = case(4)
    assert combine(rows, weights[:0], pos[:0]).shape == (0, HIDDEN)
    g_rows, g_w = combine_backward(rows, weights[:0], pos[:0], torch.empty((0, HIDDEN), dtype=torch.bfloat16))
    assert not g_rows.any() and g_w.shape == (0, TOP_K)
    with pytest.raises(ValueError, match=r"weights \(13, 3\) must have pos's shape \(13, 4\)"):
        combine(rows, weights[:, :3], pos)
    with pytest.raises(ValueError, match="pos \\[tokens, top_k\\] int32/int64"):
        combine(rows, weights, pos.float())


def test_embedding_backward_sums_each_tokens_rows_like_fp64():
    # kernels/embedding_backward.py (the policy update's table gradient): runs longer than one read block (a
    # frequent token), the table's first and last rows, rows no token uses (zero), ids in any order, no tokens.
    from tik_evo_kernels.embedding_backward import RUN_BLOCK, embedding_backward

    g = torch.Generator().manual_seed(6)
    ids = torch.cat([torch.full((2 * RUN_BLOCK + 3,), 7), torch.tensor([0, 49, 3, 3, 49]),
                     torch.full((RUN_BLOCK,), 12)])
    ids = ids[torch.randperm(ids.numel(), generator=g)].to(torch.int32)
    gy = torch.randn((ids.numel(), 600), generator=g).to(torch.bfloat16)  # wider than one column block
    grad = embedding_backward(ids, gy, 50)
    ref = torch.zeros((50, 600), dtype=torch.float64).index_add_(0, ids.long(), gy.double())
    assert grad.dtype == torch.bfloat16 and grad.shape == (50, 600)
    assert float((grad.double() - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -7
    unused = [v for v in range(50) if v not in ids.tolist()]
    assert not grad[unused].any() and grad[7].abs().sum() > 0
    assert not embedding_backward(ids[:0], gy[:0], 50).any()
    with pytest.raises(ValueError, match=r"ids must be \[tokens\] and grad_out \[tokens, hidden\]"):
        embedding_backward(ids[:3], gy, 50)


def test_policy_glue_benchmark_smoke_runs_every_cell(tmp_path):
    # `tik-evo bench policy-glue --smoke`: tiny shapes under the interpreter: every kernel and the torch code it
    # replaced ran and agrees with the fp32 reference (speed under the interpreter means nothing).
    import json

    from tik_evo.cli import main

    out = tmp_path / "glue.json"
    assert main(["bench", "policy-glue", "--smoke", "--out", str(out)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 11 and all("error" not in c for c in cells.values()), cells  # the CPU has no varlen flash
    assert cells["attention.fwd.packed"]["bits_differing_vs_per_sequence"] == 0
    for name, c in cells.items():
        assert c["ms"] > 0 and all(r < 1e-2 for r in c["rel_l2_vs_fp32"]), (name, c)
