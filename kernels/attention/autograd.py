"""Attention for the policy update: a differentiable call whose forward is a kernel file's `prefill`.

The forward values are the kernel's, the bits the rollout's decode agrees with. The backward recomputes the
attention with torch SDPA under autograd and returns its gradients. Backward need not be bit-exact; only the
forward log-probs have to equal the rollout's.

    impl = load_kernel("attention_kernel.py")     # e.g. from `tik-evo kernel attention --set ... -o ...`
    out = attention(q, k, v, impl)                 # q [B, HQ, S, D], k/v [B, HKV, S, D], bf16
    loss(out).backward()
"""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from tik_evo.candidate import load_module


def load_kernel(path: str | Path, name: str | None = None) -> ModuleType:
    """Import a kernel file (a family's root or a search's best) by path."""
    return load_module(path, name or f"tik_kernel_{Path(path).stem}")


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, impl, sm_scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = torch.empty_like(q)
        with record_function("policy:attention.fwd"):
            impl.prefill(q, k, v, sm_scale, out)
        ctx.save_for_backward(q, k, v)
        ctx.sm_scale = sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad(), record_function("policy:attention.bwd"):  # a label for profiles of the update
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=ctx.sm_scale,
                                               enable_gqa=q.shape[1] != k.shape[1])
            grads = torch.autograd.grad(o, (q, k, v), grad_out)
        return (*grads, None, None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: ModuleType,
              sm_scale: float | None = None) -> torch.Tensor:
    """Causal GQA attention through `impl.prefill` (forward) with SDPA's gradients (backward)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
            or q.shape[1] % k.shape[1]:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "q [B, HQ, S, D] and k, v [B, HKV, S, D] with HKV dividing HQ")
    return _Attention.apply(q, k, v, impl, 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale)
