"""The row-wise and elementwise families as `tik_evo::` ops: rmsnorm, add_rmsnorm, qk_rmsnorm, rope, silu_mul,
embedding.

Each op is functional: it allocates its outputs and returns them (why: `ops/__init__.py`). Leading dimensions are
flattened into rows, so [batch, seq, hidden] works as [tokens, hidden]. `decode=True` runs the family's decode
entry point (one token per sequence), otherwise the full-sequence one: the two give the same bits by the family's
contract, so the choice is speed only. Backward: the shared norm kernel (`kernels/norm_backward.py`), the files'
own backward entry points (RoPE, SiLU-and-mul) and the embedding's (`kernels/embedding_backward.py`), each an op
too, so AOTAutograd traces a backward graph of opaque calls.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

from tik_evo.ops.registry import impl


def _path(decode: bool) -> str:
    return "decode" if decode else "full"


def _rows(x: Tensor) -> Tensor:
    """[..., width] as contiguous rows [n, width] (a copy only where x is not contiguous)."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _heads(x: Tensor) -> Tensor:
    """[..., heads, dim] as contiguous [tokens, heads, dim]."""
    return x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous()


# -- RMSNorm -------------------------------------------------------------------------------------------------------
@custom_op("tik_evo::rmsnorm", mutates_args=())
def rmsnorm(x: Tensor, weight: Tensor, eps: float, decode: bool = False, kernels: str = "root") -> Tensor:
    """RMSNorm over the last dimension of x (bf16) with weight [hidden]."""
    rows = _rows(x)
    out = torch.empty_like(rows)
    if rows.shape[0]:
        getattr(impl(kernels, "rmsnorm"), f"rmsnorm_{_path(decode)}")(rows, weight.contiguous(), eps, out)
    return out.view(x.shape)


@rmsnorm.register_fake
def _(x, weight, eps, decode=False, kernels="root"):
    return x.new_empty(x.shape)


@custom_op("tik_evo::rmsnorm_backward", mutates_args=())
def rmsnorm_backward(x: Tensor, weight: Tensor, grad_out: Tensor, eps: float,
                     grad_res: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_weight); with grad_res (add + RMSNorm: x is the sum) that gradient is added to grad_x."""
    from tik_evo_kernels.norm_backward import rms_backward

    dx, dw = rms_backward(x, weight.contiguous(), grad_out, eps, grad_res)
    return dx.reshape(x.shape).contiguous(), dw


@rmsnorm_backward.register_fake
def _(x, weight, grad_out, eps, grad_res=None):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs[:3]
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    dx, dw = rmsnorm_backward(x, weight, grad, ctx.eps)
    return dx, dw, None, None, None


rmsnorm.register_autograd(_rms_grad, setup_context=_rms_setup)


# -- add + RMSNorm -------------------------------------------------------------------------------------------------
@custom_op("tik_evo::add_rmsnorm", mutates_args=())
def add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, decode: bool = False,
                kernels: str = "root") -> tuple[Tensor, Tensor]:
    """(rmsnorm(x + residual), x + residual): the sum rounded to bf16 once, then normalised."""
    xr, rr = _rows(x), _rows(residual)
    out, res = torch.empty_like(xr), torch.empty_like(xr)
    if xr.shape[0]:
        getattr(impl(kernels, "add_rmsnorm"), f"add_rmsnorm_{_path(decode)}")(xr, rr, weight.contiguous(), eps, out,
                                                                              res)
    return out.view(x.shape), res.view(x.shape)


@add_rmsnorm.register_fake
def _(x, residual, weight, eps, decode=False, kernels="root"):
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _add_rms_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs[2])
    ctx.eps = inputs[3]


def _add_rms_grad(ctx, grad_out, grad_res):
    h, weight = ctx.saved_tensors
    grad_out = torch.zeros_like(h) if grad_out is None else grad_out
    dh, dw = rmsnorm_backward(h, weight, grad_out, ctx.eps, grad_res)
    return dh, dh, dw, None, None, None


add_rmsnorm.register_autograd(_add_rms_grad, setup_context=_add_rms_setup)


# -- QK RMSNorm ----------------------------------------------------------------------------------------------------
@custom_op("tik_evo::qk_rmsnorm", mutates_args=())
def qk_rmsnorm(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float, decode: bool = False,
               kernels: str = "root") -> tuple[Tensor, Tensor]:
    """Per-head RMSNorm of q [..., q_heads, head_dim] and k [..., kv_heads, head_dim] in one launch."""
    qh, kh = _heads(q), _heads(k)
    q_out, k_out = torch.empty_like(qh), torch.empty_like(kh)
    if qh.shape[0]:
        getattr(impl(kernels, "qk_rmsnorm"), f"qk_rmsnorm_{_path(decode)}")(
            qh, kh, q_weight.contiguous(), k_weight.contiguous(), eps, q_out, k_out)
    return q_out.view(q.shape), k_out.view(k.shape)


@qk_rmsnorm.register_fake
def _(q, k, q_weight, k_weight, eps, decode=False, kernels="root"):
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _qk_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.eps = inputs[4]


def _qk_grad(ctx, gq, gk):
    q, k, qw, kw = ctx.saved_tensors
    dq, dqw = rmsnorm_backward(q, qw, torch.zeros_like(q) if gq is None else gq, ctx.eps)
    dk, dkw = rmsnorm_backward(k, kw, torch.zeros_like(k) if gk is None else gk, ctx.eps)
    return dq, dk, dqw, dkw, None, None, None


qk_rmsnorm.register_autograd(_qk_grad, setup_context=_qk_setup)


# -- RoPE ----------------------------------------------------------------------------------------------------------
def _inv_freq_kw(fn, inv_freq: Tensor | None) -> dict:
    from tik_evo_kernels.rope.family import inv_freq_kwargs

    return inv_freq_kwargs(fn, inv_freq)


@custom_op("tik_evo::rope", mutates_args=())
def rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, inv_freq: Tensor | None = None,
         decode: bool = False, kernels: str = "root") -> tuple[Tensor, Tensor]:
    """NeoX RoPE of q [..., q_heads, head_dim] and k [..., kv_heads, head_dim] at `positions` (one per token, the
    same leading shape) from the fp32 tables cos/sin [max_pos, head_dim // 2]; inv_freq: the table's fp64
    frequencies, read only by kernels that compute cos/sin themselves."""
    qh, kh = _heads(q), _heads(k)
    pos = positions.reshape(-1).to(torch.int32).contiguous()
    q_out, k_out = torch.empty_like(qh), torch.empty_like(kh)
    if qh.shape[0]:
        fn = getattr(impl(kernels, "rope"), f"rope_{_path(decode)}")
        fn(qh, kh, cos, sin, pos, q_out, k_out, **_inv_freq_kw(fn, inv_freq))
    return q_out.view(q.shape), k_out.view(k.shape)


@rope.register_fake
def _(q, k, cos, sin, positions, inv_freq=None, decode=False, kernels="root"):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@custom_op("tik_evo::rope_backward", mutates_args=())
def rope_backward(grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor,
                  inv_freq: Tensor | None = None, kernels: str = "root") -> tuple[Tensor, Tensor]:
    """The inverse rotation of the incoming gradients (the kernel file's rope_backward)."""
    gq, gk = _heads(grad_q), _heads(grad_k)
    pos = positions.reshape(-1).to(torch.int32).contiguous()
    dq, dk = torch.empty_like(gq), torch.empty_like(gk)
    if gq.shape[0]:
        fn = impl(kernels, "rope").rope_backward
        fn(gq, gk, cos, sin, pos, dq, dk, **_inv_freq_kw(fn, inv_freq))
    return dq.view(grad_q.shape), dk.view(grad_k.shape)


@rope_backward.register_fake
def _(grad_q, grad_k, cos, sin, positions, inv_freq=None, kernels="root"):
    return grad_q.new_empty(grad_q.shape), grad_k.new_empty(grad_k.shape)


def _rope_setup(ctx, inputs, output):
    q, k, cos, sin, positions, inv_freq, _, kernels = inputs
    ctx.save_for_backward(cos, sin, positions, inv_freq)
    ctx.kernels = kernels


def _rope_grad(ctx, gq, gk):
    cos, sin, positions, inv_freq = ctx.saved_tensors
    dq, dk = rope_backward(gq, gk, cos, sin, positions, inv_freq, ctx.kernels)
    return dq, dk, None, None, None, None, None, None


rope.register_autograd(_rope_grad, setup_context=_rope_setup)


# -- SiLU-and-mul --------------------------------------------------------------------------------------------------
@custom_op("tik_evo::silu_mul", mutates_args=())
def silu_mul(gate: Tensor, up: Tensor, decode: bool = False, kernels: str = "root") -> Tensor:
    """silu(gate) * up over [..., intermediate] (bf16)."""
    g, u = _rows(gate), _rows(up)
    out = torch.empty_like(g)
    if g.shape[0]:
        getattr(impl(kernels, "silu_mul"), f"silu_mul_{_path(decode)}")(g, u, out)
    return out.view(gate.shape)


@silu_mul.register_fake
def _(gate, up, decode=False, kernels="root"):
    return gate.new_empty(gate.shape)


@custom_op("tik_evo::silu_mul_backward", mutates_args=())
def silu_mul_backward(gate: Tensor, up: Tensor, grad_out: Tensor, kernels: str = "root") -> tuple[Tensor, Tensor]:
    g, u, gy = _rows(gate), _rows(up), _rows(grad_out)
    if not g.shape[0]:
        return torch.empty_like(gate), torch.empty_like(up)
    dg, du = impl(kernels, "silu_mul").silu_mul_backward(g, u, gy)
    return dg.reshape(gate.shape).contiguous(), du.reshape(up.shape).contiguous()


@silu_mul_backward.register_fake
def _(gate, up, grad_out, kernels="root"):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _silu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.kernels = inputs[3]


def _silu_grad(ctx, grad):
    gate, up = ctx.saved_tensors
    dg, du = silu_mul_backward(gate, up, grad, ctx.kernels)
    return dg, du, None, None


silu_mul.register_autograd(_silu_grad, setup_context=_silu_setup)


# -- embedding -----------------------------------------------------------------------------------------------------
@custom_op("tik_evo::embedding", mutates_args=())
def embedding(ids: Tensor, weight: Tensor, decode: bool = False, kernels: str = "root") -> Tensor:
    """weight[ids] for ids of any shape (int32/int64) -> [*ids.shape, hidden]."""
    flat = ids.reshape(-1).contiguous()
    out = weight.new_empty((flat.shape[0], weight.shape[1]))
    if flat.shape[0]:
        getattr(impl(kernels, "embedding"), f"embedding_{_path(decode)}")(flat, weight.contiguous(), out)
    return out.view(*ids.shape, weight.shape[1])


@embedding.register_fake
def _(ids, weight, decode=False, kernels="root"):
    return weight.new_empty((*ids.shape, weight.shape[1]))


@custom_op("tik_evo::embedding_backward", mutates_args=())
def embedding_backward(ids: Tensor, grad_out: Tensor, num_rows: int) -> Tensor:
    """The table's gradient: each id's rows summed in fp32 over the stably sorted ids (no atomics)."""
    from tik_evo_kernels.embedding_backward import embedding_backward as _backward

    return _backward(ids.reshape(-1), _rows(grad_out), num_rows)


@embedding_backward.register_fake
def _(ids, grad_out, num_rows):
    return grad_out.new_empty((num_rows, grad_out.shape[-1]))


def _emb_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.rows = inputs[1].shape[0]


def _emb_grad(ctx, grad):
    (ids,) = ctx.saved_tensors
    return None, embedding_backward(ids, grad, ctx.rows), None, None


embedding.register_autograd(_emb_grad, setup_context=_emb_setup)
