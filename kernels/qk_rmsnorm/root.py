"""Unified per-head QK RMSNorm (Qwen3 style; bf16 in/out, fp32 math) over head_dim for q and k.

Rows are (token, head) pairs flattened; one program normalises tiles of HEADS_PER_TILE rows x head_dim
with one 2-D `tl.sum` per tile. The tile height and warp count set the reduction layout, so they are
contract knobs used by both paths; the paths differ only in how many tiles one program walks and in
pipelining depth. q and k go through one launch (q tiles first, then k tiles).
"""

import torch
import triton
import triton.language as tl

try:  # tik-evo's launch path and grid arithmetic; used alone, this file takes Triton's (same kernels, same bits)
    from tik_evo.launch import cdiv, fast, pow2
except ImportError:
    from triton import cdiv
    from triton import next_power_of_2 as pow2

    def fast(kernel):
        return kernel


KNOBS = {
    "HEADS_PER_TILE": 16,
    "NUM_WARPS": 4,
    "CAST_BEFORE_WEIGHT": False,
    "FULL_TILES_PER_PROGRAM": 1,
    "FULL_NUM_STAGES": 1,
    "DECODE_TILES_PER_PROGRAM": 1,
    "DECODE_NUM_STAGES": 1,
}


@triton.jit
def _norm_tile(x_ptr, w_ptr, y_ptr, y32_ptr, row0, n_rows, D, eps,
               ROWS: tl.constexpr, BLOCK_D: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr,
               WRITE32: tl.constexpr):
    rows = row0 + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    xn = x * rstd[:, None]
    if CAST_BEFORE_WEIGHT:  # the HF order: normalised x rounded to bf16, then times the bf16 weight
        xn = xn.to(tl.bfloat16).to(tl.float32)
    y = xn * w[None, :]
    tl.store(y_ptr + offs, y.to(tl.bfloat16), mask=mask)
    if WRITE32:
        tl.store(y32_ptr + offs, y, mask=mask)


@triton.jit
def _qk_norm_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, qo_ptr, ko_ptr, q32_ptr, k32_ptr,
                    nq_rows, nk_rows, nq_tiles, n_tiles, D, eps,
                    TILES_PER_PROGRAM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                    CAST_BEFORE_WEIGHT: tl.constexpr, WRITE32: tl.constexpr):
    pid = tl.program_id(0)
    for i in range(TILES_PER_PROGRAM):
        tile = pid * TILES_PER_PROGRAM + i
        if tile < nq_tiles:
            _norm_tile(q_ptr, qw_ptr, qo_ptr, q32_ptr, tile * ROWS, nq_rows, D, eps,
                       ROWS, BLOCK_D, CAST_BEFORE_WEIGHT, WRITE32)
        elif tile < n_tiles:
            _norm_tile(k_ptr, kw_ptr, ko_ptr, k32_ptr, (tile - nq_tiles) * ROWS, nk_rows, D, eps,
                       ROWS, BLOCK_D, CAST_BEFORE_WEIGHT, WRITE32)


def _launch(q, k, q_weight, k_weight, eps, q_out, k_out, q32, k32, tiles_per_program, num_stages):
    D = q.shape[-1]
    rows = KNOBS["HEADS_PER_TILE"]
    nq_rows, nk_rows = q.numel() // D, k.numel() // D
    nq_tiles = cdiv(nq_rows, rows)
    n_tiles = nq_tiles + cdiv(nk_rows, rows)
    write32 = q32 is not None
    grid = (cdiv(n_tiles, tiles_per_program),)
    fast(_qk_norm_kernel)[grid](
        q, k, q_weight, k_weight, q_out, k_out, q32 if write32 else q_out, k32 if write32 else k_out,
        nq_rows, nk_rows, nq_tiles, n_tiles, D, eps,
        TILES_PER_PROGRAM=tiles_per_program, ROWS=rows, BLOCK_D=pow2(D),
        CAST_BEFORE_WEIGHT=KNOBS["CAST_BEFORE_WEIGHT"], WRITE32=write32,
        num_warps=KNOBS["NUM_WARPS"], num_stages=num_stages,
    )


def qk_rmsnorm_full(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                    eps: float, q_out: torch.Tensor, k_out: torch.Tensor,
                    q32: torch.Tensor | None = None, k32: torch.Tensor | None = None) -> None:
    """All tokens of a packed batch: q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim] (contiguous)."""
    _launch(q, k, q_weight, k_weight, eps, q_out, k_out, q32, k32,
            KNOBS["FULL_TILES_PER_PROGRAM"], KNOBS["FULL_NUM_STAGES"])


def qk_rmsnorm_decode(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                      eps: float, q_out: torch.Tensor, k_out: torch.Tensor,
                      q32: torch.Tensor | None = None, k32: torch.Tensor | None = None) -> None:
    """One token per sequence: q [batch, q_heads, head_dim], k [batch, kv_heads, head_dim]; same numerics."""
    _launch(q, k, q_weight, k_weight, eps, q_out, k_out, q32, k32,
            KNOBS["DECODE_TILES_PER_PROGRAM"], KNOBS["DECODE_NUM_STAGES"])
