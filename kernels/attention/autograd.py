"""Attention for the policy update: a differentiable call whose forward is a kernel file's `prefill`.

The forward values are the kernel's, the bits the rollout's decode agrees with. The backward recomputes the
attention with torch SDPA under autograd and returns its gradients. Backward need not be bit-exact; only the
forward log-probs have to equal the rollout's.

    impl = load_kernel("attention_kernel.py")     # e.g. from `tik-evo kernel attention --set ... -o ...`
    out = attention(q, k, v, impl)                 # q [B, HQ, S, D], k/v [B, HKV, S, D], bf16
    loss(out).backward()
    out = attention_packed(q, k, v, bounds, impl, sm_scale)   # packed: q [T, HQ, D], k/v [T, HKV, D]; needs
                                                              # impl.prefill_packed
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


def prefill_packed(impl: ModuleType, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int],
                   sm_scale: float) -> torch.Tensor:
    """One `impl.prefill_packed` launch over the sequences at rows bounds[b]..bounds[b + 1] of q [T, HQ, D] and
    k/v [T, HKV, D] (host bounds: the longest length needs no sync) -> out [T, HQ, D]."""
    out = torch.empty_like(q)
    cu = torch.tensor(bounds, dtype=torch.int32).to(q.device, non_blocking=True)
    impl.prefill_packed(q, k, v, cu, max(hi - lo for lo, hi in zip(bounds, bounds[1:])), sm_scale, out)
    return out


class _PackedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, impl, bounds, sm_scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        with record_function("policy:attention.fwd"):
            out = prefill_packed(impl, q, k, v, bounds, sm_scale)
        ctx.save_for_backward(q, k, v)
        ctx.bounds, ctx.sm_scale = bounds, sm_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        grads = [torch.empty_like(t) for t in (q, k, v)]
        with torch.enable_grad(), record_function("policy:attention.bwd"):
            for lo, hi in zip(ctx.bounds, ctx.bounds[1:]):  # SDPA per sequence, on its heads-first copies
                qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0).detach().requires_grad_() for t in (q, k, v))
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=ctx.sm_scale,
                                                   enable_gqa=q.shape[1] != k.shape[1])
                for g, gs in zip(grads, torch.autograd.grad(o, (qs, ks, vs), grad_out[lo:hi].transpose(0, 1)[None])):
                    g[lo:hi] = gs[0].transpose(0, 1)
        return (*grads, None, None, None)


def attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], impl: ModuleType,
                     sm_scale: float) -> torch.Tensor:
    """Causal attention of packed sequences (rows bounds[b]..bounds[b + 1] of q [T, HQ, D], k/v [T, HKV, D]) ->
    [T, HQ, D]: one `impl.prefill_packed` launch forward, SDPA per sequence backward."""
    if q.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] \
            or q.shape[1] % k.shape[1] or bounds[0] != 0 or bounds[-1] != q.shape[0]:
        raise ValueError(f"attention_packed: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, bounds "
                         f"{bounds[0]}..{bounds[-1]}: expected q [T, HQ, D], k, v [T, HKV, D] with HKV dividing HQ "
                         "and bounds from 0 to T")
    return _PackedAttention.apply(q, k, v, impl, list(bounds), sm_scale)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: ModuleType,
              sm_scale: float | None = None) -> torch.Tensor:
    """Causal GQA attention through `impl.prefill` (forward) with SDPA's gradients (backward)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] \
            or q.shape[1] % k.shape[1]:
        raise ValueError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "q [B, HQ, S, D] and k, v [B, HKV, S, D] with HKV dividing HQ")
    return _Attention.apply(q, k, v, impl, 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale)
