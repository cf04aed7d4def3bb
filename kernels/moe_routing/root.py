"""MoE router: fp32 softmax over experts, top-k (ties to the lower expert index), optional renormalisation.

Input router logits [tokens, experts] bf16; outputs top-k weights (bf16, and the fp32 values before the cast)
and expert ids (int32), in slot order (largest probability first).

Bitwise agreement between paths holds because both call `_route_tile` with the same contract parameters:
BLOCK_T rows per tile and NUM_WARPS fix the layout of the 2-D tile and so the order of the softmax row sum.
Row max, the top-k selection (max, then min index among equals) and the slot-order sum of the selected weights
are exact or sequential, independent of layout. The paths differ only in tiles per program and pipelining.
"""

import torch
import triton
import triton.language as tl

KNOBS = {
    "BLOCK_T": 4,
    "NUM_WARPS": 1,
    "FULL_TILES_PER_PROGRAM": 1,
    "FULL_NUM_STAGES": 1,
    "DECODE_TILES_PER_PROGRAM": 1,
    "DECODE_NUM_STAGES": 1,
}


@triton.jit
def _route_tile(x_ptr, w_ptr, w32_ptr, id_ptr, tile, T, E, RENORM: tl.constexpr, WRITE32: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr):
    rows = tile.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    rmask = rows < T
    cmask = cols < E
    x = tl.load(x_ptr + rows[:, None] * E + cols[None, :], mask=rmask[:, None] & cmask[None, :],
                other=float("-inf")).to(tl.float32)
    m = tl.max(x, 1)
    m = tl.where(m == float("-inf"), 0.0, m)  # rows past T: keep them finite, they are never stored
    e = tl.exp(x - m[:, None])
    s = tl.sum(e, 1)
    s = tl.where(rmask, s, 1.0)
    p = e / s[:, None]
    work = tl.where(cmask[None, :], p, -1.0)  # probabilities are >= 0: padding is never selected
    kcols = tl.arange(0, K_PAD)
    top_w = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_T, K_PAD], dtype=tl.int32)
    total = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        v = tl.max(work, 1)
        idx = tl.min(tl.where(work == v[:, None], cols[None, :], BLOCK_E), 1)  # ties: the lower expert
        top_w = tl.where(kcols[None, :] == k, v[:, None], top_w)
        top_i = tl.where(kcols[None, :] == k, idx[:, None], top_i)
        total = total + v  # slot order, one add per slot
        work = tl.where(cols[None, :] == idx[:, None], -1.0, work)
    if RENORM:
        top_w = top_w / tl.where(rmask, total, 1.0)[:, None]
    omask = rmask[:, None] & (kcols[None, :] < TOP_K)
    offs = rows[:, None] * TOP_K + kcols[None, :]
    tl.store(w_ptr + offs, top_w.to(w_ptr.dtype.element_ty), mask=omask)
    tl.store(id_ptr + offs, top_i, mask=omask)
    if WRITE32:
        tl.store(w32_ptr + offs, top_w, mask=omask)


@triton.jit
def _route_kernel(x_ptr, w_ptr, w32_ptr, id_ptr, T, E, RENORM: tl.constexpr, WRITE32: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                  TILES_PER_PROGRAM: tl.constexpr):
    for i in range(TILES_PER_PROGRAM):
        tile = tl.program_id(0) * TILES_PER_PROGRAM + i
        _route_tile(x_ptr, w_ptr, w32_ptr, id_ptr, tile, T, E, RENORM, WRITE32, BLOCK_T, BLOCK_E, TOP_K, K_PAD)


def _launch(logits, weights, ids, weights32, renormalize, path):
    T, E = logits.shape
    top_k = weights.shape[1]
    block_t, tiles_pp = KNOBS["BLOCK_T"], KNOBS[path + "_TILES_PER_PROGRAM"]
    if T == 0:
        return
    grid = (triton.cdiv(triton.cdiv(T, block_t), tiles_pp),)
    _route_kernel[grid](
        logits, weights, weights32 if weights32 is not None else weights, ids, T, E,
        RENORM=bool(renormalize), WRITE32=weights32 is not None, BLOCK_T=block_t,
        BLOCK_E=triton.next_power_of_2(E), TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
        TILES_PER_PROGRAM=tiles_pp, num_warps=KNOBS["NUM_WARPS"], num_stages=KNOBS[path + "_NUM_STAGES"])


def moe_routing_full(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     weights32: torch.Tensor | None = None, renormalize: bool = True) -> None:
    """Every token of a packed batch: logits [tokens, experts] -> weights [tokens, k] (bf16), ids [tokens, k]
    (int32), optionally weights32 (fp32 before the cast); k = weights.shape[1]."""
    _launch(logits, weights, ids, weights32, renormalize, "FULL")


def moe_routing_decode(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                       weights32: torch.Tensor | None = None, renormalize: bool = True) -> None:
    """One token per sequence: logits [batch, experts]; same per-token numerics as moe_routing_full."""
    _launch(logits, weights, ids, weights32, renormalize, "DECODE")
