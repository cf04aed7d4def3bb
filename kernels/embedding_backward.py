"""The embedding table's gradient for the policy update (kernels/autograd.py; fp32 sums, no bitwise contract).

grad_table[v] = sum of grad_out[t] over the tokens t with ids[t] == v, and zero for every other row. The ids are
sorted (stable), so each row's tokens lie in one run; the program at a run's first position sums the run in
fp32, RUN_BLOCK tokens at a time in token order, and writes the row once, in the table's dtype. Every other
program returns at once. The order of each sum is fixed (no atomics), there is no host sync (the runs are found
on the device), and nothing of the table's size is allocated but the gradient itself: the index_add it replaces
kept an fp32 copy of the whole table (1.6 GB for a 152K x 2560 vocabulary) and converted it afterwards.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_evo.launch import cdiv, fast, pow2

BLOCK_H = 512  # columns per program
RUN_BLOCK = 8  # a run's tokens read at once: a frequent token's long run costs few round trips


@triton.jit
def _run_sum_kernel(sorted_ptr, order_ptr, gy_ptr, gt_ptr, n_tok, H, BLOCK: tl.constexpr, RUN: tl.constexpr):
    i = tl.program_id(0)
    v = tl.load(sorted_ptr + i)
    if tl.load(sorted_ptr + i - 1, mask=i > 0, other=-1) == v:  # ids are >= 0
        return  # not the first position of its run
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    j = i
    more = True
    while more:  # RUN positions at a time: their tokens' rows summed (a fixed tree), then added in run order
        pos = j + tl.arange(0, RUN)
        in_run = tl.load(sorted_ptr + pos, mask=pos < n_tok, other=-1) == v
        t = tl.load(order_ptr + pos, mask=in_run, other=0).to(tl.int64)
        rows = tl.load(gy_ptr + t[:, None] * H + cols[None, :], mask=in_run[:, None] & cmask[None, :], other=0.0)
        acc += tl.sum(rows.to(tl.float32), axis=0)
        j += RUN
        more = tl.sum(in_run.to(tl.int32), axis=0) == RUN  # all were the run's: it may go on
    tl.store(gt_ptr + v.to(tl.int64) * H + cols, acc.to(gt_ptr.dtype.element_ty), mask=cmask)


def embedding_backward(ids: torch.Tensor, grad_out: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The gradient of a [num_rows, hidden] table from out = table[ids] (ids [tokens], grad_out [tokens, hidden]);
    returned in grad_out's dtype."""
    if ids.dim() != 1 or grad_out.dim() != 2 or grad_out.shape[0] != ids.shape[0]:
        raise ValueError(f"embedding_backward: ids must be [tokens] and grad_out [tokens, hidden]; got ids "
                         f"{tuple(ids.shape)}, grad_out {tuple(grad_out.shape)}")
    n_tok, H = grad_out.shape
    grad = torch.zeros((num_rows, H), dtype=grad_out.dtype, device=grad_out.device)
    if n_tok and H:
        sorted_ids, order = torch.sort(ids.long(), stable=True)
        block = min(BLOCK_H, pow2(H))
        fast(_run_sum_kernel)[(n_tok, cdiv(H, block))](sorted_ids, order, grad_out.contiguous(), grad, n_tok, H,
                                                      BLOCK=block, RUN=RUN_BLOCK, num_warps=4)
    return grad
