"""RMSNorm's backward in one pass for the policy update (kernels/autograd.py: RMSNorm, QK RMSNorm and add + RMSNorm;
fp32 math, checked by tolerance: backward has no bitwise contract).

For rows x of width H, y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps):
    dx = rstd * (dy*w - xhat * mean(dy*w * xhat)),  xhat = x * rstd;   dw = sum over rows of dy * xhat.
Each program walks tiles of whole rows (several rows per tile for narrow ones, as QK norm's 128-wide heads), keeps
its share of dw in fp32 and stores it to a workspace row; the caller sums the workspace. Replaces eager torch
that made fp32 copies of x and dy and read them about ten times.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_evo.launch import cdiv, fast, pow2

TILE = 4096  # elements of one tile: rows of a narrow width share it


@triton.jit
def _rms_bwd_kernel(x_ptr, w_ptr, dy_ptr, dres_ptr, dx_ptr, ws_ptr, n_rows, H, eps,
                    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, HAS_RES: tl.constexpr):
    cols = tl.arange(0, BLOCK_H)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_H], dtype=tl.float32)
    for first in range(tl.program_id(0) * ROWS, n_rows, tl.num_programs(0) * ROWS):
        rows = first + tl.arange(0, ROWS)
        mask = (rows[:, None] < n_rows) & cmask[None, :]
        offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / H + eps)
        xhat = x * rstd[:, None]
        gxhat = dy * w[None, :]
        dx = rstd[:, None] * (gxhat - xhat * (tl.sum(gxhat * xhat, axis=1) / H)[:, None])
        if HAS_RES:  # add + RMSNorm: the gradient arriving on the sum's own output joins
            dx += tl.load(dres_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
    tl.store(ws_ptr + tl.program_id(0).to(tl.int64) * H + cols, dw, mask=cmask)


def _programs(device: torch.device, tiles: int) -> int:
    if device.type != "cuda":
        return min(tiles, 4)  # the interpreter: several programs' worth of rows each
    return min(tiles, 4 * torch.cuda.get_device_properties(device).multi_processor_count)


def rms_backward(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, eps: float,
                 grad_res: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of y = x * rsqrt(mean(x^2) + eps) * weight over the last dimension of x; with
    `grad_res` (add + RMSNorm, x being the sum h) that gradient is added to grad_x."""
    H = x.shape[-1]
    x2, dy2 = x.reshape(-1, H).contiguous(), grad_out.reshape(-1, H).contiguous()
    dres = grad_res.reshape(-1, H).contiguous() if grad_res is not None else dy2
    n_rows = x2.shape[0]
    dx = torch.empty_like(x2)
    if n_rows == 0:
        return dx.view(x.shape), torch.zeros_like(weight)
    block = pow2(H)
    rows = max(1, TILE // block)
    programs = _programs(x.device, cdiv(n_rows, rows))
    ws = torch.empty((programs, H), dtype=torch.float32, device=x.device)
    fast(_rms_bwd_kernel)[(programs,)](x2, weight, dy2, dres, dx, ws, n_rows, H, eps, ROWS=rows, BLOCK_H=block,
                                       HAS_RES=grad_res is not None, num_warps=4 if block * rows <= 2048 else 8)
    return dx.view(x.shape), ws.sum(0).to(weight.dtype)
