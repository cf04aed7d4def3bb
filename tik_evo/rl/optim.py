"""AdamW with fp32 master weights for the model's bf16 tensors, and the phase timer.

The model's forward reads bf16 weights (the kernels' contract is on bf16 inputs). An update of lr 1e-5 is far
below bf16's resolution (2^-8 relative), so AdamW steps fp32 copies and writes them back rounded to bf16, in
place: the rollout, which reads the same tensors, uses the new weights at once (staleness 0).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class MasterAdamW:
    """torch.optim.AdamW over fp32 copies of `params` (bf16 tensors, updated in place after each step)."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), weight_decay: float = 0.0,
                 max_grad_norm: float | None = 1.0):
        self.params = params
        self.master = [p.detach().float().clone().requires_grad_(True) for p in params]
        self.opt = torch.optim.AdamW(self.master, lr=lr, betas=betas, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm

    def step(self) -> float:
        """Apply the gradients accumulated on the bf16 tensors; -> the gradient's global L2 norm (before
        clipping). The bf16 tensors' grads are cleared."""
        for p, mp in zip(self.params, self.master):
            mp.grad = None if p.grad is None else p.grad.float()
            p.grad = None
        grads = [mp.grad for mp in self.master if mp.grad is not None]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.master, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads \
                else torch.zeros(())
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, mp in zip(self.params, self.master):
                p.copy_(mp)
        return float(norm)


class PhaseTimer:
    """Seconds per named phase of one step. On a GPU each phase starts and ends with torch.cuda.synchronize(), so
    a phase is charged with the GPU work it queued; on the CPU, wall time."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - t
