"""Unified RMSNorm (bf16 in/out, fp32 math): full-sequence and decode paths share one per-row function.

Bitwise agreement between paths holds because every row is reduced by the same code with the same
contract parameters (chunk width BLOCK_H and the warp count, both of which change a row sum's bits);
the paths differ only in how rows are assigned to programs and in pipelining depth.
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
    "BLOCK_H": 0,
    "NUM_WARPS": 4,
    "FULL_ROWS_PER_PROGRAM": 1,
    "FULL_NUM_STAGES": 1,
    "DECODE_ROWS_PER_PROGRAM": 1,
    "DECODE_NUM_STAGES": 1,
}


@triton.jit
def _rms_row(x_ptr, w_ptr, y_ptr, y32_ptr, row, H, eps,
             BLOCK_H: tl.constexpr, WRITE32: tl.constexpr):
    if H <= BLOCK_H:
        # The whole row fits one chunk: read x once and keep it in registers. The same arithmetic as the chunked
        # loops' one pass (0 + x*x is x*x), so the same bits; a uniform branch, taken by width only.
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        y = x * rstd * w
        tl.store(y_ptr + row * H + cols, y.to(tl.bfloat16), mask=mask)
        if WRITE32:
            tl.store(y32_ptr + row * H + cols, y, mask=mask)
    else:
        # Sum of squares in fixed-width chunks from column 0: the chunk width and the final tl.sum fix the order.
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for off in range(0, H, BLOCK_H):
            cols = off + tl.arange(0, BLOCK_H)
            x = tl.load(x_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
        for off in range(0, H, BLOCK_H):
            cols = off + tl.arange(0, BLOCK_H)
            mask = cols < H
            x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = x * rstd * w
            tl.store(y_ptr + row * H + cols, y.to(tl.bfloat16), mask=mask)
            if WRITE32:
                tl.store(y32_ptr + row * H + cols, y, mask=mask)


@triton.jit
def _rms_rows_kernel(x_ptr, w_ptr, y_ptr, y32_ptr, n_rows, H, eps,
                     ROWS_PER_PROGRAM: tl.constexpr, BLOCK_H: tl.constexpr, WRITE32: tl.constexpr):
    pid = tl.program_id(0)
    for i in range(ROWS_PER_PROGRAM):
        row = pid * ROWS_PER_PROGRAM + i
        if row < n_rows:
            _rms_row(x_ptr, w_ptr, y_ptr, y32_ptr, row, H, eps, BLOCK_H, WRITE32)


def _block_h(hidden: int) -> int:
    # 0 means "the whole row in one chunk": the next power of two of the width (depends on the width only).
    b = KNOBS["BLOCK_H"]
    return pow2(hidden) if b == 0 else b


def _launch(x, weight, eps, out, out32, rows_per_program, num_stages):
    n_rows, hidden = x.shape
    block = _block_h(hidden)
    grid = (cdiv(n_rows, rows_per_program),)
    fast(_rms_rows_kernel)[grid](
        x, weight, out, out32 if out32 is not None else out, n_rows, hidden, eps,
        ROWS_PER_PROGRAM=rows_per_program, BLOCK_H=block, WRITE32=out32 is not None,
        num_warps=KNOBS["NUM_WARPS"], num_stages=num_stages,
    )


def rmsnorm_full(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
                 out32: torch.Tensor | None = None) -> None:
    """All tokens of a packed batch: x [tokens, hidden] -> out (bf16), optionally out32 (pre-cast fp32)."""
    _launch(x, weight, eps, out, out32, KNOBS["FULL_ROWS_PER_PROGRAM"], KNOBS["FULL_NUM_STAGES"])


def rmsnorm_decode(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor,
                   out32: torch.Tensor | None = None) -> None:
    """One token per sequence: x [batch, hidden]; same per-row numerics as rmsnorm_full."""
    _launch(x, weight, eps, out, out32, KNOBS["DECODE_ROWS_PER_PROGRAM"], KNOBS["DECODE_NUM_STAGES"])
