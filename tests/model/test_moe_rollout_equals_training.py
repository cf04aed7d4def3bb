"""The whole-model claim with every family and batched rollouts (kernels/moe_decoder.py): sequences of different
prompt and answer lengths, prefilled packed and decoded together from a paged KV cache, record the log-probs
that one packed training forward computes, bit for bit. Under the interpreter this checks the composition;
GPU bits are measured by `tik-evo bench model --model moe`."""

import math

import torch

from tik_evo.candidate import load_source
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo_kernels.decoder import EPS, roots
from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder, MoEShape

LENS, PROMPTS = [9, 12, 7], [5, 8, 4]


def sequences(seed: int, vocab: int = 512) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).to(torch.int32) for n in LENS]


def bits_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


def test_batched_moe_rollout_equals_packed_training_bitwise_and_grouped_launches_give_the_per_expert_bits():
    # The experts' MLPs in three grouped launches per layer (linear_grouped_*, the default) give the bits of one
    # launch per expert and projection in training, and the rollout records those bits.
    m = MoEDecoder(MoEShape(), 0, "cpu", temperature=0.7)  # grouped launches are the default
    seqs = sequences(5)
    train = m.training_logprobs(seqs, PROMPTS)
    routed = m.expert_rows
    rollout = m.rollout_logprobs(seqs, PROMPTS)
    assert [t.shape[0] for t in train] == [n - p for n, p in zip(LENS, PROMPTS)]
    assert bits_equal(train, rollout), (train, rollout)
    # Every token of both layers went to top_k = 2 experts (through the grouped path): all tokens in training; in
    # rollout all but each sequence's last, which is only a target.
    assert routed == sum(LENS) * 2 * 2 and m.expert_rows - routed == (sum(LENS) - len(LENS)) * 2 * 2
    assert all(bool(torch.isfinite(t).all()) and bool((t <= 0).all()) for t in train)
    per_expert = MoEDecoder(MoEShape(), 0, "cpu", temperature=0.7, grouped_experts=False)
    assert bits_equal(train, per_expert.training_logprobs(seqs, PROMPTS))


def reference_logprobs(m: MoEDecoder, seq: torch.Tensor, prompt: int) -> torch.Tensor:
    """The dense model in fp64 torch (no kernels), one sequence: what both paths approximate."""
    s, d = m.s, (lambda t: t.double())

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * d(w)

    n = seq.numel()
    pos = torch.arange(n)
    c, sn = d(m.cos)[pos][:, None, :], d(m.sin)[pos][:, None, :]

    def rope(x):
        a, b = x[..., : s.head_dim // 2], x[..., s.head_dim // 2:]
        return torch.cat([a * c - b * sn, b * c + a * sn], -1)

    h = d(m.embed)[seq.long()]
    x = norm(h, m.norm_in[0])
    for layer in range(s.layers):
        qkv = x @ d(m.w_qkv[layer]).T
        nq, nkv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        q = rope(norm(qkv[:, :nq].reshape(n, s.q_heads, s.head_dim), m.q_norm[layer]))
        k = rope(norm(qkv[:, nq:nq + nkv].reshape(n, s.kv_heads, s.head_dim), m.k_norm[layer]))
        v = qkv[:, nq + nkv:].reshape(n, s.kv_heads, s.head_dim)
        k, v = (t.repeat_interleave(s.q_heads // s.kv_heads, 1) for t in (k, v))
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(s.head_dim)
        scores = scores.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
        h = h + torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(n, -1) @ d(m.w_o[layer]).T
        x = norm(h, m.norm_post[layer])
        act = torch.nn.functional.silu(x @ d(m.w_gate[layer][0]).T) * (x @ d(m.w_up[layer][0]).T)
        h = h + act @ d(m.w_down[layer][0]).T
        x = norm(h, m.norm_in[layer + 1] if layer + 1 < s.layers else m.norm_f)
    lp = ((x @ d(m.w_lm).T) / m.temperature).log_softmax(-1)
    return lp[prompt - 1:-1].gather(1, seq[prompt:].long()[:, None])[:, 0]


def test_dense_variant_matches_an_fp64_reference_and_itself():
    m = MoEDecoder(MoEShape(experts=0, intermediate=96), 1, "cpu")
    seqs = sequences(6)
    train = m.training_logprobs(seqs, PROMPTS)
    assert bits_equal(train, m.rollout_logprobs(seqs, PROMPTS))
    assert m.expert_rows == 0
    for seq, p, t in zip(seqs, PROMPTS, train):
        ref = reference_logprobs(m, seq, p)
        assert torch.allclose(t.double(), ref, rtol=0, atol=0.2), (t, ref)  # bf16 activations over two layers


def test_one_mismatched_family_breaks_the_equality():
    """Rollout's RoPE rounding the cos/sin table to bf16 first (as some inference engines do) while the trainer's
    keeps fp32: both are common and accurate, but the recorded log-probs no longer match the trainer's bits."""
    impls = roots(FAMILIES)
    src = impls["rope"].__loader__.get_source(impls["rope"].__name__)
    assert read_knobs(src)["ROUND_TABLE_TO_BF16"] is False
    other = load_source(write_knobs(src, {**read_knobs(src), "ROUND_TABLE_TO_BF16": True}), "rope_bf16_table")
    hybrid = load_source(src, "rope_hybrid")
    hybrid.rope_decode = other.rope_decode
    # The dense model: RoPE is called alike with and without experts (`_qkv`), and the MoE model's rollout costs
    # three times as much under the interpreter (here every decoded token's bits differ, 8 of 11).
    m = MoEDecoder(MoEShape(experts=0, intermediate=96), 0, "cpu", impls={**impls, "rope": hybrid})
    seqs = sequences(5)
    train, rollout = m.training_logprobs(seqs, PROMPTS), m.rollout_logprobs(seqs, PROMPTS)
    assert not bits_equal(train, rollout)
    # Equal where rollout has not decoded yet: each sequence's first answer token comes from the prefill.
    assert all(torch.equal(a[:1], b[:1]) for a, b in zip(train, rollout))


def test_bad_shapes_and_sequences_are_refused():
    import pytest

    with pytest.raises(ValueError, match="top_k 9 must be in 1..experts"):
        MoEDecoder(MoEShape(top_k=9), 0, "cpu")
    m = MoEDecoder(MoEShape(layers=1), 0, "cpu")
    with pytest.raises(ValueError, match="sequence 1: prompt length 12 must be in 1..11"):
        m.training_logprobs(sequences(1)[:2], [5, 12])
    with pytest.raises(ValueError, match="2 sequences but 1 prompt lengths"):
        m.rollout_logprobs(sequences(1)[:2], [5])


def test_packed_attention_gives_the_per_sequence_launches_bits():
    # The attention file's packed prefill (one launch over the packed batch) against a file without one (a launch
    # per sequence), in the training forward and the rollout's prefill.
    from types import SimpleNamespace

    # One layer: the attention calls of every layer are alike (the KV cache, per layer, is kv_append's).
    m = MoEDecoder(MoEShape(experts=0, intermediate=96, layers=1), 3, "cpu")
    seqs = sequences(8)
    packed = m.training_logprobs(seqs, PROMPTS), m.rollout_logprobs(seqs, PROMPTS)
    attn = m.k["attention"]
    calls = []
    m.k = {**m.k, "attention": SimpleNamespace(prefill=lambda *a: calls.append(1) or attn.prefill(*a),
                                               decode=attn.decode)}
    per_sequence = m.training_logprobs(seqs, PROMPTS), m.rollout_logprobs(seqs, PROMPTS)
    assert len(calls) == 2 * m.s.layers * len(LENS)  # the fallback ran: training and rollout prefill
    assert bits_equal(packed[0], per_sequence[0]) and bits_equal(packed[1], per_sequence[1])
    assert bits_equal(packed[0], packed[1])
