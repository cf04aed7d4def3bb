"""linear (dense and grouped), log-prob and the MoE router and glue as `tik_evo::` ops.

Backward has no bitwise contract (only the forward log-probs must equal the rollout's), so the linear layers'
gradients are torch matmuls, as a torch trainer computes them (cuBLAS on a GPU; traceable, so a compiled backward
may fuse around them), and the grouped experts' through `torch._grouped_mm` where the GPU and torch have it, else
the kernel file's `linear_grouped_backward`. Log-prob, the MoE combine and dispatch take their kernels' backward.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import custom_op

from tik_evo.ops.registry import impl
from tik_evo.ops.rowwise import _path, _rows


# -- linear --------------------------------------------------------------------------------------------------------
@custom_op("tik_evo::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, decode: bool = False,
           kernels: str = "root") -> Tensor:
    """x [..., in] @ weight[out, in]^T + bias [out] (bf16, fp32 accumulation)."""
    rows = _rows(x)
    out = rows.new_empty((rows.shape[0], weight.shape[0]))
    if rows.shape[0]:
        getattr(impl(kernels, "linear"), f"linear_{_path(decode)}")(
            rows, weight.contiguous(), None if bias is None else bias.contiguous(), out)
    return out.view(*x.shape[:-1], weight.shape[0])


@linear.register_fake
def _(x, weight, bias=None, decode=False, kernels="root"):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _linear_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.has_bias = inputs[2] is not None


def _linear_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    g2 = grad.reshape(-1, grad.shape[-1])
    gx = (g2 @ weight).view(x.shape)
    gw = g2.t() @ x.reshape(-1, x.shape[-1])
    gb = g2.float().sum(0).to(grad.dtype) if ctx.has_bias else None
    return gx, gw, gb, None, None


linear.register_autograd(_linear_grad, setup_context=_linear_setup)


# -- grouped linear (an MoE layer's experts) -----------------------------------------------------------------------
@custom_op("tik_evo::linear_grouped", mutates_args=())
def linear_grouped(x: Tensor, weights: Tensor, starts: Tensor, decode: bool = False, kernels: str = "root") -> Tensor:
    """Rows starts[e]:starts[e + 1] of x [T, in] (sorted by expert) through weights[e] ([E, out, in]); each row
    gets linear's bits for its expert's weight. starts: int32 [E + 1] on the device (no host sync)."""
    out = x.new_empty((x.shape[0], weights.shape[1]))
    if x.shape[0]:
        getattr(impl(kernels, "linear"), f"linear_grouped_{_path(decode)}")(
            x.contiguous(), weights.contiguous(), starts.to(torch.int32), out)
    return out


@linear_grouped.register_fake
def _(x, weights, starts, decode=False, kernels="root"):
    return x.new_empty((x.shape[0], weights.shape[1]))


@custom_op("tik_evo::linear_grouped_backward", mutates_args=())
def linear_grouped_backward(x: Tensor, weights: Tensor, starts: Tensor, grad_out: Tensor,
                            kernels: str = "root") -> tuple[Tensor, Tensor]:
    from tik_evo_kernels.autograd import _grouped_mm_trains

    gy = grad_out.contiguous()
    if _grouped_mm_trains(x.device):
        offs = starts[1:].to(torch.int32)
        return torch._grouped_mm(gy, weights, offs=offs), torch._grouped_mm(gy.t(), x, offs=offs)
    gx, gw = torch.empty_like(x), torch.empty_like(weights)
    impl(kernels, "linear").linear_grouped_backward(x.contiguous(), weights.contiguous(), starts.to(torch.int32), gy,
                                                    gx, gw)
    return gx, gw


@linear_grouped_backward.register_fake
def _(x, weights, starts, grad_out, kernels="root"):
    return x.new_empty(x.shape), weights.new_empty(weights.shape)


def _grouped_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.kernels = inputs[4]


def _grouped_grad(ctx, grad):
    x, weights, starts = ctx.saved_tensors
    gx, gw = linear_grouped_backward(x, weights, starts, grad, ctx.kernels)
    return gx, gw, None, None, None


linear_grouped.register_autograd(_grouped_grad, setup_context=_grouped_setup)


# -- log-prob ------------------------------------------------------------------------------------------------------
@custom_op("tik_evo::logprob", mutates_args=())
def logprob(logits: Tensor, target: Tensor, temperature: float = 1.0, decode: bool = False,
            kernels: str = "root") -> tuple[Tensor, Tensor]:
    """(log-prob of each target under softmax(logits / temperature), entropy), fp32, for logits [..., vocab]
    (bf16) and target [...]."""
    rows, tgt = _rows(logits), target.reshape(-1).contiguous()
    lp = torch.empty(rows.shape[0], dtype=torch.float32, device=logits.device)
    ent = torch.empty_like(lp)
    if rows.shape[0]:
        getattr(impl(kernels, "logprob"), f"logprob_{_path(decode)}")(rows, tgt, temperature, lp, ent)
    return lp.view(target.shape), ent.view(target.shape)


@logprob.register_fake
def _(logits, target, temperature=1.0, decode=False, kernels="root"):
    return (logits.new_empty(target.shape, dtype=torch.float32),
            logits.new_empty(target.shape, dtype=torch.float32))


@custom_op("tik_evo::logprob_backward", mutates_args=())
def logprob_backward(logits: Tensor, target: Tensor, temperature: float, grad_logprob: Tensor,
                     grad_entropy: Tensor, kernels: str = "root") -> Tensor:
    rows, tgt = _rows(logits), target.reshape(-1).contiguous()
    gx = torch.empty_like(rows)
    if rows.shape[0]:
        impl(kernels, "logprob").logprob_backward(rows, tgt, temperature, grad_logprob.reshape(-1).contiguous(),
                                                  grad_entropy.reshape(-1).contiguous(), gx)
    return gx.view(logits.shape)


@logprob_backward.register_fake
def _(logits, target, temperature, grad_logprob, grad_entropy, kernels="root"):
    return logits.new_empty(logits.shape)


def _logprob_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.temperature, ctx.kernels = inputs[2], inputs[4]


def _logprob_grad(ctx, glp, gent):
    logits, target = ctx.saved_tensors
    zeros = lambda: torch.zeros(target.shape, dtype=torch.float32, device=logits.device)  # noqa: E731
    gx = logprob_backward(logits, target, ctx.temperature, zeros() if glp is None else glp,
                          zeros() if gent is None else gent, ctx.kernels)
    return gx, None, None, None, None


logprob.register_autograd(_logprob_grad, setup_context=_logprob_setup)


# -- MoE routing, dispatch, combine --------------------------------------------------------------------------------
@custom_op("tik_evo::moe_routing", mutates_args=())
def moe_routing(logits: Tensor, top_k: int, renormalize: bool = True, decode: bool = False,
                kernels: str = "root") -> tuple[Tensor, Tensor]:
    """(weights [tokens, top_k] in logits' dtype, expert ids int32 [tokens, top_k]) from router logits
    [tokens, experts]: fp32 softmax, the top_k largest (ties to the lower expert), renormalised when asked."""
    rows = _rows(logits)
    w = rows.new_empty((rows.shape[0], top_k))
    ids = torch.empty((rows.shape[0], top_k), dtype=torch.int32, device=logits.device)
    if rows.shape[0]:
        getattr(impl(kernels, "moe_routing"), f"moe_routing_{_path(decode)}")(rows, w, ids, None, renormalize)
    return w, ids


@moe_routing.register_fake
def _(logits, top_k, renormalize=True, decode=False, kernels="root"):
    n = logits.numel() // logits.shape[-1]
    return logits.new_empty((n, top_k)), logits.new_empty((n, top_k), dtype=torch.int32)


def _routing_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[1])
    ctx.renormalize = inputs[2]


def _routing_grad(ctx, gw, _):
    logits, ids = ctx.saved_tensors
    rows, sel = _rows(logits).float(), ids.long()
    if ctx.renormalize:  # the weights are the softmax over the chosen experts' logits
        p = torch.softmax(rows.gather(1, sel), -1)
        g = gw.float()
        gsel = p * (g - (g * p).sum(-1, keepdim=True))
        grad = torch.zeros_like(rows).scatter(1, sel, gsel)
    else:  # the chosen entries of the softmax over every expert
        p = torch.softmax(rows, -1)
        g = torch.zeros_like(rows).scatter(1, sel, gw.float())
        grad = p * (g - (g * p).sum(-1, keepdim=True))
    return grad.to(logits.dtype).view(logits.shape), None, None, None, None


moe_routing.register_autograd(_routing_grad, setup_context=_routing_setup)


@custom_op("tik_evo::moe_combine", mutates_args=())
def moe_combine(rows: Tensor, weights: Tensor | None, pos: Tensor) -> Tensor:
    """y[t] = sum over slots k, in slot order, of weights[t, k] * rows[pos[t, k]], in fp32, returned in rows'
    dtype (without weights: the plain slot-order sum)."""
    from tik_evo_kernels.moe_combine import combine

    return combine(rows, weights, pos)


@moe_combine.register_fake
def _(rows, weights, pos):
    return rows.new_empty((pos.shape[0], rows.shape[1]))


@custom_op("tik_evo::moe_combine_backward", mutates_args=())
def moe_combine_backward(rows: Tensor, weights: Tensor, pos: Tensor, grad_out: Tensor) -> tuple[Tensor, Tensor]:
    from tik_evo_kernels.moe_combine import combine_backward

    return combine_backward(rows, weights, pos, grad_out)


@moe_combine_backward.register_fake
def _(rows, weights, pos, grad_out):
    return rows.new_empty(rows.shape), weights.new_empty(weights.shape)


def _combine_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _combine_grad(ctx, grad):
    rows, weights, pos = ctx.saved_tensors
    if weights is None:  # the dispatch's backward: a plain slot-order sum has the rows' gradient only
        return moe_combine_backward_unweighted(rows, pos, grad), None, None
    g_rows, g_w = moe_combine_backward(rows, weights, pos, grad)
    return g_rows, g_w, None


moe_combine.register_autograd(_combine_grad, setup_context=_combine_setup)


@custom_op("tik_evo::moe_combine_backward_unweighted", mutates_args=())
def moe_combine_backward_unweighted(rows: Tensor, pos: Tensor, grad_out: Tensor) -> Tensor:
    """grad of the unweighted slot-order sum: each slot's row gets its token's gradient (zeros elsewhere)."""
    g = torch.zeros_like(rows)
    g[pos.reshape(-1).long()] = grad_out.repeat_interleave(pos.shape[1], 0).to(rows.dtype)
    return g


@moe_combine_backward_unweighted.register_fake
def _(rows, pos, grad_out):
    return rows.new_empty(rows.shape)


@custom_op("tik_evo::moe_dispatch", mutates_args=())
def moe_dispatch(x: Tensor, src: Tensor, pos: Tensor) -> Tensor:
    """x[src]: each token's row once per slot in the experts' order (pos [tokens, top_k], src's inverse, is the
    row of token t's slot k); its backward sums a token's slots in slot order (no atomics)."""
    return x[src.long()]


@moe_dispatch.register_fake
def _(x, src, pos):
    return x.new_empty((src.shape[0], x.shape[1]))


def _dispatch_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _dispatch_grad(ctx, grad):
    (pos,) = ctx.saved_tensors
    return moe_combine(grad, None, pos), None, None


moe_dispatch.register_autograd(_dispatch_grad, setup_context=_dispatch_setup)
