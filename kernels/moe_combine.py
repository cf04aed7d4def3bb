"""An MoE layer's glue around the experts, as Triton passes: the top-k combine and the gradients of the dispatch.

The experts return one row per (token, slot) pair, in whatever order they ran (grouped launches: sorted by
expert); `pos[t, k]` is the row of token t's slot k. Then
    combine:          y[t] = bf16( sum over k = 0, 1, ... of fp32(w[t, k]) * fp32(rows[pos[t, k]]) )
sums each token's slots in slot order, element by element, from the same kernel in every path: a token's bits do
not depend on which tokens share its batch (rollout decode, training's full sequence). It replaces a scatter of
the rows back to (token, slot) order and a per-slot loop of fp32 torch operations (about 4 launches per slot).
For the policy update (kernels/autograd.py; backward has no bitwise contract, fp32 math):
    combine backward: g_rows[pos[t, k]] = bf16(w[t, k] * gy[t]),
                      g_w[t, k] = sum over h of gy[t, h] * rows[pos[t, k], h]
    dispatch backward (rows = x[src], src[pos[t, k]] = t): g_x[t] = sum over k of g_rows[pos[t, k]], in slot order,
instead of the accumulating index_put that autograd of x[src] runs (a sort of the indices, then a generic
accumulation kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_evo.launch import cdiv, fast, pow2

TILE = 2048  # elements of one program's tile (tokens x columns): a function of the row width only


@triton.jit(do_not_specialize=["n_tok"])  # one compiled kernel for every token count, a decode step's 1 included
def _combine_kernel(rows_ptr, w_ptr, pos_ptr, out_ptr, n_tok, H,
                    TOP_K: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, HAS_W: tl.constexpr):
    tok = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    tmask = tok < n_tok
    mask = tmask[:, None] & (cols < H)[None, :]
    acc = tl.zeros([ROWS, BLOCK_H], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        p = tl.load(pos_ptr + tok.to(tl.int64) * TOP_K + k, mask=tmask, other=0).to(tl.int64)
        v = tl.load(rows_ptr + p[:, None] * H + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_W:
            w = tl.load(w_ptr + tok.to(tl.int64) * TOP_K + k, mask=tmask, other=0.0).to(tl.float32)
            acc = acc + w[:, None] * v
        else:
            acc = acc + v
    tl.store(out_ptr + tok.to(tl.int64)[:, None] * H + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _combine_bwd_kernel(rows_ptr, w_ptr, pos_ptr, gy_ptr, grows_ptr, gw_ptr, n_tok, H,
                        TOP_K: tl.constexpr, K_PAD: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr):
    tok = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    tmask = tok < n_tok
    kcols = tl.arange(0, K_PAD)
    gw = tl.zeros([ROWS, K_PAD], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        cols = h0 + tl.arange(0, BLOCK_H)
        mask = tmask[:, None] & (cols < H)[None, :]
        gy = tl.load(gy_ptr + tok.to(tl.int64)[:, None] * H + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        for k in tl.static_range(TOP_K):
            p = tl.load(pos_ptr + tok.to(tl.int64) * TOP_K + k, mask=tmask, other=0).to(tl.int64)
            w = tl.load(w_ptr + tok.to(tl.int64) * TOP_K + k, mask=tmask, other=0.0).to(tl.float32)
            offs = p[:, None] * H + cols[None, :]
            v = tl.load(rows_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(grows_ptr + offs, (w[:, None] * gy).to(grows_ptr.dtype.element_ty), mask=mask)
            gw += tl.where(kcols[None, :] == k, tl.sum(gy * v, axis=1)[:, None], 0.0)
    kmask = tmask[:, None] & (kcols[None, :] < TOP_K)
    tl.store(gw_ptr + tok.to(tl.int64)[:, None] * TOP_K + kcols[None, :], gw.to(gw_ptr.dtype.element_ty), mask=kmask)


def _tile(H: int) -> tuple[int, int]:
    block = min(pow2(H), TILE)
    return max(1, TILE // block), block


def _check(rows: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor | None) -> None:
    if rows.dim() != 2 or pos.dim() != 2 or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"moe_combine: rows must be [n, hidden] and pos [tokens, top_k] int32/int64; got rows "
                         f"{tuple(rows.shape)}, pos {tuple(pos.shape)} {pos.dtype}")
    if weights is not None and weights.shape != pos.shape:
        raise ValueError(f"moe_combine: weights {tuple(weights.shape)} must have pos's shape {tuple(pos.shape)}")


def combine(rows: torch.Tensor, weights: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
    """y[t] = sum over k (slot order) of weights[t, k] * rows[pos[t, k]] in fp32, returned in rows' dtype; without
    weights, the plain slot-order sum (the dispatch's backward)."""
    _check(rows, pos, weights)
    rows, pos = rows.contiguous(), pos.contiguous()
    n_tok, (top_k, H) = pos.shape[0], (pos.shape[1], rows.shape[1])
    out = torch.empty((n_tok, H), dtype=rows.dtype, device=rows.device)
    if n_tok and H:
        r, block = _tile(H)
        w = weights.contiguous() if weights is not None else pos
        fast(_combine_kernel)[(cdiv(n_tok, r), cdiv(H, block))](
            rows, w, pos, out, n_tok, H, TOP_K=top_k, ROWS=r, BLOCK_H=block, HAS_W=weights is not None, num_warps=4)
    return out


def combine_backward(rows: torch.Tensor, weights: torch.Tensor, pos: torch.Tensor, grad_out: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_rows, grad_weights) of `combine(rows, weights, pos)`. Each slot must point at its own row (as the
    experts' rows are: one per pair); rows no slot points at get zero gradient."""
    _check(rows, pos, weights)
    rows, pos, weights, grad_out = rows.contiguous(), pos.contiguous(), weights.contiguous(), grad_out.contiguous()
    n_tok, (top_k, H) = pos.shape[0], (pos.shape[1], rows.shape[1])
    g_rows = torch.zeros_like(rows) if pos.numel() != rows.shape[0] else torch.empty_like(rows)
    g_w = torch.empty_like(weights)
    if n_tok and H:
        r, block = _tile(H)
        fast(_combine_bwd_kernel)[(cdiv(n_tok, r),)](
            rows, weights, pos, grad_out, g_rows, g_w, n_tok, H, TOP_K=top_k, K_PAD=pow2(top_k), ROWS=r,
            BLOCK_H=block, num_warps=4)
    elif n_tok:
        g_w.zero_()
    return g_rows, g_w
