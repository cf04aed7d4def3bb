"""Unified SwiGLU activation: out = silu(gate) * up (bf16 in/out, fp32 math).

Both entry points call one @triton.jit helper for the per-element arithmetic, so FMA contraction and the
exp lowering are the same in both paths. By default silu(gate) is rounded to bf16 before the multiply,
as the model's eager `F.silu(gate) * up` does in bf16. Tiling (rows per program, column block, warps, grid
order, cache hints) is free per path: there is no reduction. gate and up may be strided views (e.g. the two
halves of a fused gate_up projection) with unit column stride.
"""

import torch
import triton
import triton.language as tl

try:  # tik-evo's launch path and grid arithmetic; used alone, this file takes Triton's (same kernels, same bits)
    from tik_evo.launch import cdiv, fast
except ImportError:
    from triton import cdiv

    def fast(kernel):
        return kernel


KNOBS = {
    "SILU_FORM": "div",
    "ROUND_SILU": True,
    "FULL_BLOCK_I": 1024,
    "FULL_ROWS_PER_PROGRAM": 2,
    "FULL_NUM_WARPS": 4,
    "FULL_COLS_FASTEST": True,
    "FULL_STREAMING": False,
    "DECODE_BLOCK_I": 1024,
    "DECODE_ROWS_PER_PROGRAM": 1,
    "DECODE_NUM_WARPS": 4,
    "DECODE_COLS_FASTEST": False,
    "DECODE_STREAMING": True,
}


@triton.jit
def _silu_mul(g, u, SILU_FORM: tl.constexpr, ROUND_SILU: tl.constexpr):
    g = g.to(tl.float32)
    if SILU_FORM == "div":  # torch's formula: x / (1 + exp(-x))
        a = g / (1.0 + tl.exp(-g))
    elif SILU_FORM == "exp2":
        a = g / (1.0 + tl.exp2(-g * 1.4426950408889634))
    else:  # "mul_sigmoid"
        a = g * tl.sigmoid(g)
    if ROUND_SILU:
        a = a.to(tl.bfloat16).to(tl.float32)
    return a * u.to(tl.float32)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, y32_ptr, n_rows, I, g_stride, u_stride,
                     ROWS_PER_PROGRAM: tl.constexpr, BLOCK_I: tl.constexpr, SILU_FORM: tl.constexpr,
                     ROUND_SILU: tl.constexpr, WRITE32: tl.constexpr, COLS_FASTEST: tl.constexpr,
                     STREAMING: tl.constexpr):
    # COLS_FASTEST: consecutive programs take neighbouring column blocks of one row (contiguous memory) rather
    # than one column block of neighbouring rows. STREAMING: every byte is touched once, so tell L2 to evict
    # it first. Neither changes any value.
    if COLS_FASTEST:
        pid_r, pid_c = tl.program_id(1), tl.program_id(0)
    else:
        pid_r, pid_c = tl.program_id(0), tl.program_id(1)
    cols = pid_c * BLOCK_I + tl.arange(0, BLOCK_I)
    cmask = cols < I
    evict: tl.constexpr = "evict_first" if STREAMING else ""
    for i in range(ROWS_PER_PROGRAM):
        row = (pid_r * ROWS_PER_PROGRAM + i).to(tl.int64)
        if row < n_rows:
            g = tl.load(g_ptr + row * g_stride + cols, mask=cmask, other=0.0, eviction_policy=evict)
            u = tl.load(u_ptr + row * u_stride + cols, mask=cmask, other=0.0, eviction_policy=evict)
            y = _silu_mul(g, u, SILU_FORM, ROUND_SILU)
            tl.store(y_ptr + row * I + cols, y.to(tl.bfloat16), mask=cmask, eviction_policy=evict)
            if WRITE32:
                tl.store(y32_ptr + row * I + cols, y, mask=cmask, eviction_policy=evict)


def _grid(n_rows: int, inter: int, path: str) -> tuple[tuple[int, int], bool]:
    """(launch grid, whether column blocks vary fastest). Grid axis 1 holds at most 65535 programs, so row
    counts beyond that keep the row-first order."""
    rows = cdiv(n_rows, KNOBS[path + "_ROWS_PER_PROGRAM"])
    cols = cdiv(inter, KNOBS[path + "_BLOCK_I"])
    if KNOBS[path + "_COLS_FASTEST"] and rows <= 65535:
        return (cols, rows), True
    return (rows, cols), False


def _launch(gate, up, out, out32, path):
    n_rows, inter = gate.shape
    write32 = out32 is not None
    rows_per_program, block = KNOBS[path + "_ROWS_PER_PROGRAM"], KNOBS[path + "_BLOCK_I"]
    grid, cols_fastest = _grid(n_rows, inter, path)
    fast(_silu_mul_kernel)[grid](
        gate, up, out, out32 if write32 else out, n_rows, inter, gate.stride(0), up.stride(0),
        ROWS_PER_PROGRAM=rows_per_program, BLOCK_I=block, SILU_FORM=KNOBS["SILU_FORM"],
        ROUND_SILU=KNOBS["ROUND_SILU"], WRITE32=write32, COLS_FASTEST=cols_fastest,
        STREAMING=KNOBS[path + "_STREAMING"], num_warps=KNOBS[path + "_NUM_WARPS"],
    )


def silu_mul_full(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor,
                  out32: torch.Tensor | None = None) -> None:
    """All tokens of a packed batch: gate, up [tokens, intermediate] -> out (bf16), out32 (pre-cast fp32)."""
    _launch(gate, up, out, out32, "FULL")


def silu_mul_decode(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor,
                    out32: torch.Tensor | None = None) -> None:
    """One token per sequence: gate, up [batch, intermediate]; same per-element numerics as silu_mul_full."""
    _launch(gate, up, out, out32, "DECODE")


@triton.jit
def _silu_mul_bwd_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, I, g_stride, u_stride, BLOCK_I: tl.constexpr):
    # One pass over gate, up and the output's gradient (fp32 math): d/dgate = dy * up * s * (1 + g * (1 - s)),
    # d/dup = dy * silu(g). Not bit-matched to anything: backward is checked by tolerance.
    row = tl.program_id(0).to(tl.int64)  # rows on axis 0: axis 1 holds at most 65535 programs
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = cols < I
    g = tl.load(g_ptr + row * g_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * u_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * I + cols, mask=mask, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-g))
    tl.store(du_ptr + row * I + cols, (dy * g * sig).to(du_ptr.dtype.element_ty), mask=mask)
    tl.store(dg_ptr + row * I + cols, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(dg_ptr.dtype.element_ty),
             mask=mask)


def silu_mul_backward(gate: torch.Tensor, up: torch.Tensor, grad_out: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients for the policy update (fp32 math, not bit-matched): returns (grad_gate, grad_up), contiguous."""
    n_rows, inter = gate.shape
    grad_out = grad_out.contiguous()
    grad_gate = torch.empty((n_rows, inter), dtype=gate.dtype, device=gate.device)
    grad_up = torch.empty((n_rows, inter), dtype=up.dtype, device=up.device)
    if n_rows:
        block = 1024
        fast(_silu_mul_bwd_kernel)[(n_rows, cdiv(inter, block))](
            gate, up, grad_out, grad_gate, grad_up, inter, gate.stride(0), up.stride(0), BLOCK_I=block,
            num_warps=4)
    return grad_gate, grad_up
