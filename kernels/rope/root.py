"""Unified NeoX RoPE (rotate halves) for q and k: bf16 in/out, fp32 math, one fp32 cos/sin table.

cos/sin are rows of one fp32 table [max_position, head_dim // 2] indexed by each token's absolute
position, so a token's result depends only on its own values and position. Both entry points call the
same @triton.jit rotation helper (FMA contraction and casts therefore match); the paths differ only in
how many tokens one program handles, warps and pipelining. `rope_backward` is the same kernel run as the
inverse rotation (sin negated).
"""

import torch
import triton
import triton.language as tl

KNOBS = {
    "ROUND_TABLE_TO_BF16": False,
    "FULL_TOKENS_PER_PROGRAM": 1,
    "FULL_NUM_WARPS": 4,
    "FULL_NUM_STAGES": 1,
    "DECODE_TOKENS_PER_PROGRAM": 1,
    "DECODE_NUM_WARPS": 4,
    "DECODE_NUM_STAGES": 1,
}


@triton.jit
def _rotate(x1, x2, c, s):
    # NeoX: out[:half] = x1*cos - x2*sin, out[half:] = x2*cos + x1*sin (all fp32).
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _rope_heads(x_ptr, y_ptr, y32_ptr, tok, n_heads, c, s, HALF,
                BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr, WRITE32: tl.constexpr):
    heads = tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < HALF)[None, :]
    offs = tok.to(tl.int64) * n_heads * 2 * HALF + heads[:, None] * 2 * HALF + cols[None, :]
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    o1, o2 = _rotate(x1, x2, c[None, :], s[None, :])
    tl.store(y_ptr + offs, o1.to(tl.bfloat16), mask=mask)
    tl.store(y_ptr + offs + HALF, o2.to(tl.bfloat16), mask=mask)
    if WRITE32:
        tl.store(y32_ptr + offs, o1, mask=mask)
        tl.store(y32_ptr + offs + HALF, o2, mask=mask)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, ko_ptr, q32_ptr, k32_ptr,
                 n_tokens, n_q_heads, n_k_heads, HALF,
                 TOKENS_PER_PROGRAM: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, ROUND_TABLE: tl.constexpr, INVERSE: tl.constexpr,
                 WRITE32: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_HALF)
    for i in range(TOKENS_PER_PROGRAM):
        tok = pid * TOKENS_PER_PROGRAM + i
        if tok < n_tokens:
            pos = tl.load(pos_ptr + tok).to(tl.int64)
            c = tl.load(cos_ptr + pos * HALF + cols, mask=cols < HALF, other=0.0)
            s = tl.load(sin_ptr + pos * HALF + cols, mask=cols < HALF, other=0.0)
            if ROUND_TABLE:  # the HF order: the table cast to the activation dtype first
                c = c.to(tl.bfloat16).to(tl.float32)
                s = s.to(tl.bfloat16).to(tl.float32)
            if INVERSE:
                s = -s
            _rope_heads(q_ptr, qo_ptr, q32_ptr, tok, n_q_heads, c, s, HALF, BLOCK_QH, BLOCK_HALF, WRITE32)
            _rope_heads(k_ptr, ko_ptr, k32_ptr, tok, n_k_heads, c, s, HALF, BLOCK_KH, BLOCK_HALF, WRITE32)


def _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, tokens_per_program, num_warps, num_stages,
            inverse=False):
    n_tokens, n_q_heads, head_dim = q.shape
    n_k_heads = k.shape[1]
    half = head_dim // 2
    write32 = q32 is not None
    grid = (triton.cdiv(n_tokens, tokens_per_program),)
    _rope_kernel[grid](
        q, k, cos, sin, positions, q_out, k_out, q32 if write32 else q_out, k32 if write32 else k_out,
        n_tokens, n_q_heads, n_k_heads, half,
        TOKENS_PER_PROGRAM=tokens_per_program, BLOCK_QH=triton.next_power_of_2(n_q_heads),
        BLOCK_KH=triton.next_power_of_2(n_k_heads), BLOCK_HALF=triton.next_power_of_2(half),
        ROUND_TABLE=KNOBS["ROUND_TABLE_TO_BF16"], INVERSE=inverse, WRITE32=write32,
        num_warps=num_warps, num_stages=num_stages,
    )


def rope_full(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
              q_out: torch.Tensor, k_out: torch.Tensor, q32: torch.Tensor | None = None,
              k32: torch.Tensor | None = None) -> None:
    """All tokens of a packed batch: q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim] (contiguous),
    positions [tokens] (each token's absolute position), cos/sin fp32 [max_position, head_dim // 2]."""
    _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, KNOBS["FULL_TOKENS_PER_PROGRAM"],
            KNOBS["FULL_NUM_WARPS"], KNOBS["FULL_NUM_STAGES"])


def rope_decode(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                q_out: torch.Tensor, k_out: torch.Tensor, q32: torch.Tensor | None = None,
                k32: torch.Tensor | None = None) -> None:
    """One token per sequence: q [batch, q_heads, head_dim], positions [batch]; same numerics as rope_full."""
    _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, KNOBS["DECODE_TOKENS_PER_PROGRAM"],
            KNOBS["DECODE_NUM_WARPS"], KNOBS["DECODE_NUM_STAGES"])


def rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  positions: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor) -> None:
    """Gradients w.r.t. the un-rotated q and k: the inverse rotation of the incoming gradients."""
    _launch(grad_q, grad_k, cos, sin, positions, dq, dk, None, None, KNOBS["FULL_TOKENS_PER_PROGRAM"],
            KNOBS["FULL_NUM_WARPS"], KNOBS["FULL_NUM_STAGES"], inverse=True)
