"""Unified residual-add + RMSNorm (bf16 in/out, fp32 math): h = bf16(x + residual), y = rmsnorm(h) * weight.

Both entry points call one per-row function with the same contract parameters (BLOCK_H, NUM_WARPS);
the paths differ only in how rows map to programs and in pipelining depth, which do not touch a row's
arithmetic. The residual sum is rounded to bf16 first (as the model's bf16 `x + residual` does) and the
norm is taken of that rounded value, so `res_out` is exactly the model's new residual stream.
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
    "NUM_WARPS": 8,
    "FULL_ROWS_PER_PROGRAM": 1,
    "FULL_NUM_STAGES": 1,
    "DECODE_ROWS_PER_PROGRAM": 1,
    "DECODE_NUM_STAGES": 1,
    "FULL_WEIGHT_LOAD": "early",
    "DECODE_WEIGHT_LOAD": "early",
}


@triton.jit
def _add_rms_row(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, y32_ptr, row, H, eps,
                 BLOCK_H: tl.constexpr, ONE_CHUNK: tl.constexpr, WRITE32: tl.constexpr,
                 EARLY_W: tl.constexpr):
    base = row.to(tl.int64) * H
    if ONE_CHUNK:
        # The whole row fits one chunk: keep h in registers (same arithmetic as the chunked loop's one pass).
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        if EARLY_W:  # issued with x and r: a load after the h store below cannot be hoisted above it
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        hb = (x + r).to(tl.bfloat16)
        tl.store(h_ptr + base + cols, hb, mask=mask)
        h = hb.to(tl.float32)
        acc = h * h
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
        if not EARLY_W:
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = h * rstd * w
        tl.store(y_ptr + base + cols, y.to(tl.bfloat16), mask=mask)
        if WRITE32:
            tl.store(y32_ptr + base + cols, y, mask=mask)
    else:
        # Sum of squares in fixed-width chunks from column 0: chunk width and the final tl.sum fix the order.
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for off in range(0, H, BLOCK_H):
            cols = off + tl.arange(0, BLOCK_H)
            mask = cols < H
            x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            h = (x + r).to(tl.bfloat16).to(tl.float32)
            acc += h * h
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
        for off in range(0, H, BLOCK_H):
            cols = off + tl.arange(0, BLOCK_H)
            mask = cols < H
            x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            hb = (x + r).to(tl.bfloat16)
            tl.store(h_ptr + base + cols, hb, mask=mask)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            y = hb.to(tl.float32) * rstd * w
            tl.store(y_ptr + base + cols, y.to(tl.bfloat16), mask=mask)
            if WRITE32:
                tl.store(y32_ptr + base + cols, y, mask=mask)


@triton.jit
def _add_rms_rows_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, y32_ptr, n_rows, H, eps,
                         ROWS_PER_PROGRAM: tl.constexpr, BLOCK_H: tl.constexpr, ONE_CHUNK: tl.constexpr,
                         WRITE32: tl.constexpr, EARLY_W: tl.constexpr):
    pid = tl.program_id(0)
    for i in range(ROWS_PER_PROGRAM):
        row = pid * ROWS_PER_PROGRAM + i
        if row < n_rows:
            _add_rms_row(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, y32_ptr, row, H, eps, BLOCK_H, ONE_CHUNK, WRITE32,
                         EARLY_W)


def _block_h(hidden: int) -> int:
    # 0 means "the whole row in one chunk": the next power of two of the width (depends on the width only).
    b = KNOBS["BLOCK_H"]
    return pow2(hidden) if b == 0 else b


def _launch(x, residual, weight, eps, out, res_out, out32, rows_per_program, num_stages, weight_load):
    n_rows, hidden = x.shape
    block = _block_h(hidden)
    grid = (cdiv(n_rows, rows_per_program),)
    fast(_add_rms_rows_kernel)[grid](
        x, residual, weight, out, res_out, out32 if out32 is not None else out, n_rows, hidden, eps,
        ROWS_PER_PROGRAM=rows_per_program, BLOCK_H=block, ONE_CHUNK=block >= hidden,
        WRITE32=out32 is not None, EARLY_W=weight_load == "early", num_warps=KNOBS["NUM_WARPS"],
        num_stages=num_stages,
    )


def add_rmsnorm_full(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     out: torch.Tensor, res_out: torch.Tensor, out32: torch.Tensor | None = None) -> None:
    """All tokens of a packed batch: x, residual [tokens, hidden] -> out = rmsnorm(h), res_out = h (bf16)."""
    _launch(x, residual, weight, eps, out, res_out, out32,
            KNOBS["FULL_ROWS_PER_PROGRAM"], KNOBS["FULL_NUM_STAGES"], KNOBS["FULL_WEIGHT_LOAD"])


def add_rmsnorm_decode(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       out: torch.Tensor, res_out: torch.Tensor, out32: torch.Tensor | None = None) -> None:
    """One token per sequence: x, residual [batch, hidden]; same per-row numerics as add_rmsnorm_full."""
    _launch(x, residual, weight, eps, out, res_out, out32,
            KNOBS["DECODE_ROWS_PER_PROGRAM"], KNOBS["DECODE_NUM_STAGES"], KNOBS["DECODE_WEIGHT_LOAD"])


def add_rmsnorm_backward(grad_out: torch.Tensor, grad_res: torch.Tensor | None, h: torch.Tensor,
                         weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients for the policy update (fp32 math, not bit-matched): returns (grad_h, grad_weight).

    grad_h is the gradient w.r.t. both x and residual (the sum passes it through unchanged); grad_res is
    the gradient arriving on the residual output, if any.
    """
    hf = h.float()
    gy = grad_out.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = hf * rstd
    gw = (gy * xhat).sum(0)
    gxhat = gy * weight.float()
    gh = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, keepdim=True))
    if grad_res is not None:
        gh = gh + grad_res.float()
    return gh.to(h.dtype), gw.to(weight.dtype)
