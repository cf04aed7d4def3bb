"""Every family's kernel file as a differentiable call, for the policy update.

The forward of each call is the file's full-sequence entry point with the arguments the model's training
forward gives it, so its values are the kernel's bits, the ones the rollout's decode agrees with. The backward
uses the file's own backward entry point where it has one (RoPE, SiLU-and-mul, log-prob), one shared kernel for
the norms (RMSNorm, QK RMSNorm, add + RMSNorm: `kernels/norm_backward.py`), one for the embedding table
(`kernels/embedding_backward.py`), the MoE glue's own (`kernels/moe_combine.py`), fp32 torch arithmetic for the
router, torch's attention for the attention recompute (`kernels/attention/autograd.py`), and cuBLAS for the
linear layers, as a torch trainer does (`KernelOps(impls, matmul_backward="kernel")`: the linear kernel file's
own backward). Backward need not be bit-exact.

    ops = KernelOps(impls)                       # impls: {family: kernel module}, e.g. tik_evo_kernels.decoder.roots()
    y = ops.linear(x, w)                         # bf16 [tokens, out], differentiable in x and w

`TorchOps` has the same calls written in torch (fp32 arithmetic, bf16 in and out, the same expert choice
rule): a reference for the gradients. `TorchOps(native=True)` is the same model as a trainer runs it without
tik-evo (bf16 matmuls and attention through cuBLAS and SDPA; norms and softmax in fp32): a speed baseline.
"""

from __future__ import annotations

import warnings
from types import ModuleType

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from tik_evo_kernels.attention.autograd import attention as _attention
from tik_evo_kernels.attention.autograd import attention_packed as _attention_packed
from tik_evo_kernels.embedding_backward import embedding_backward
from tik_evo_kernels.moe_combine import combine, combine_backward
from tik_evo_kernels.norm_backward import rms_backward


class _Call(torch.autograd.Function):
    """One kernel call: `forward(*inputs)` returns its outputs; `backward(inputs, outputs, *grads)` returns a
    gradient (or None) per input. Integer outputs (expert ids) are not differentiable. Each half runs under a
    profiler label, "policy:<family>.fwd" / ".bwd", so a profile of a policy step can be split by family."""

    @staticmethod
    def forward(ctx, name, forward, backward, *inputs):
        with record_function(f"policy:{name}.fwd"):
            outs = forward(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        ctx.name, ctx.backward, ctx.n_inputs = name, backward, len(inputs)
        ctx.save_for_backward(*inputs, *outs)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        with record_function(f"policy:{ctx.name}.bwd"):
            return (None, None, None, *ctx.backward(saved[:ctx.n_inputs], saved[ctx.n_inputs:], *grads))


def _apply(name, forward, backward, *inputs):
    return _Call.apply(name, forward, backward, *inputs)


def routing_backward(logits: torch.Tensor, ids: torch.Tensor, grad_weights: torch.Tensor) -> torch.Tensor:
    """Gradient w.r.t. the router logits of the renormalised top-k weights, which are the softmax over the chosen
    experts' logits (the discrete choice itself has no gradient)."""
    sel = logits.float().gather(1, ids.long())
    p = torch.softmax(sel, -1)
    g = grad_weights.float()
    gsel = p * (g - (g * p).sum(-1, keepdim=True))
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
        1, ids.long(), gsel).to(logits.dtype)


class KernelOps:
    """The differentiable calls on kernel files (`impls`: {family: module with its entry points}).

    `matmul_backward`: the linear layers' gradients (no bitwise contract) from cuBLAS through torch ("vendor",
    the default: `torch.mm`, and `torch._grouped_mm` for an MoE layer's experts where the GPU and torch have it,
    else the kernel file's), as a torch trainer computes them, or from the kernel file's own backward ("kernel").
    On an H200 the vendor backward took 9.2 ms of a Qwen3-30B-A3B-shaped policy step's kernel time for the
    experts against the kernel file's 13.1 (results/model/h200_policy_2026-12-05e_matmul_bwd_modes.json)."""

    def __init__(self, impls: dict[str, ModuleType], matmul_backward: str = "vendor"):
        if matmul_backward not in ("kernel", "vendor"):
            raise ValueError(f"KernelOps: matmul_backward {matmul_backward!r}: expected 'kernel' or 'vendor'")
        self.k = impls
        self.vendor_backward = matmul_backward == "vendor"

    def linear(self, x, w):
        lin = self.k["linear"]

        def fwd(x, w):
            y = x.new_empty((x.shape[0], w.shape[0]))
            lin.linear_full(x, w, None, y)
            return y

        def bwd(inputs, _, gy):
            x, w = inputs
            if self.vendor_backward:
                return gy @ w, gy.t() @ x
            gx, gw = torch.empty_like(x), torch.empty_like(w)
            lin.linear_backward(x, w, gy.contiguous(), gx, gw, None)
            return gx, gw
        return _apply("linear", fwd, bwd, x, w)

    def linear_grouped(self, x, weights, starts):
        lin = self.k["linear"]

        def fwd(x, weights, starts):
            y = x.new_empty((x.shape[0], weights.shape[1]))
            lin.linear_grouped_full(x, weights, starts, y)
            return y

        def bwd(inputs, _, gy):
            x, weights, starts = inputs
            if self.vendor_backward and _grouped_mm_trains(x.device):
                offs = starts[1:].to(torch.int32)
                gy = gy.contiguous()
                return (torch._grouped_mm(gy, weights, offs=offs), torch._grouped_mm(gy.t(), x, offs=offs), None)
            gx, gw = torch.empty_like(x), torch.empty_like(weights)
            lin.linear_grouped_backward(x, weights, starts, gy.contiguous(), gx, gw)
            return gx, gw, None
        return _apply("linear_grouped", fwd, bwd, x, weights, starts)

    def embedding(self, ids, table):
        def fwd(ids, table):
            h = table.new_empty((ids.shape[0], table.shape[1]))
            self.k["embedding"].embedding_full(ids, table, h)
            return h

        def bwd(inputs, _, gh):
            ids, table = inputs
            return None, embedding_backward(ids, gh, table.shape[0]).to(table.dtype)
        return _apply("embedding", fwd, bwd, ids, table)

    def rmsnorm(self, x, w, eps):
        def fwd(x, w):
            y = torch.empty_like(x)
            self.k["rmsnorm"].rmsnorm_full(x, w, eps, y)
            return y
        return _apply("rmsnorm", fwd, lambda inputs, _, gy: rms_backward(*inputs, gy, eps), x, w)

    def add_rmsnorm(self, x, residual, w, eps):
        """(normalised, x + residual): both differentiable."""
        k = self.k["add_rmsnorm"]

        def fwd(x, residual, w):
            y, h = torch.empty_like(x), torch.empty_like(x)
            k.add_rmsnorm_full(x, residual, w, eps, y, h)
            return y, h

        def bwd(inputs, outputs, gy, gh):  # the shared norm kernel on h (the file's torch backward is slower)
            gsum, gw = rms_backward(outputs[1], inputs[2], gy, eps, gh)
            return gsum, gsum, gw
        return _apply("add_rmsnorm", fwd, bwd, x, residual, w)

    def qk_rmsnorm(self, q, k, q_weight, k_weight, eps):
        def fwd(q, k, qw, kw):
            qn, kn = torch.empty_like(q), torch.empty_like(k)
            self.k["qk_rmsnorm"].qk_rmsnorm_full(q, k, qw, kw, eps, qn, kn)
            return qn, kn

        def bwd(inputs, _, gq, gk):
            q, k, qw, kw = inputs
            (dq, dqw), (dk, dkw) = rms_backward(q, qw, gq, eps), rms_backward(k, kw, gk, eps)
            return dq, dk, dqw, dkw
        return _apply("qk_rmsnorm", fwd, bwd, q, k, q_weight, k_weight)

    def rope(self, q, k, cos, sin, positions, inv_freq=None):
        from tik_evo_kernels.rope.family import inv_freq_kwargs

        rope = self.k["rope"]

        def fwd(q, k, cos, sin, positions):
            qr, kr = torch.empty_like(q), torch.empty_like(k)
            rope.rope_full(q, k, cos, sin, positions, qr, kr, **inv_freq_kwargs(rope.rope_full, inv_freq))
            return qr, kr

        def bwd(inputs, _, gq, gk):
            q, k, cos, sin, positions = inputs
            dq, dk = torch.empty_like(q), torch.empty_like(k)
            rope.rope_backward(gq.contiguous(), gk.contiguous(), cos, sin, positions, dq, dk,
                               **inv_freq_kwargs(rope.rope_backward, inv_freq))
            return dq, dk, None, None, None
        return _apply("rope", fwd, bwd, q, k, cos, sin, positions)

    def silu_mul(self, gate, up):
        k = self.k["silu_mul"]

        def fwd(gate, up):
            act = torch.empty_like(gate)
            k.silu_mul_full(gate, up, act)
            return act
        return _apply("silu_mul", fwd, lambda inputs, _, g: k.silu_mul_backward(*inputs, g.contiguous()), gate, up)

    def moe_routing(self, logits, top_k):
        """(weights bf16 [tokens, top_k], expert ids int32): the weights are differentiable in the logits."""
        def fwd(logits):
            w = logits.new_empty((logits.shape[0], top_k))
            ids = torch.empty((logits.shape[0], top_k), dtype=torch.int32, device=logits.device)
            self.k["moe_routing"].moe_routing_full(logits, w, ids)
            return w, ids

        def bwd(inputs, outputs, gw, _):
            return (routing_backward(inputs[0], outputs[1], gw),)
        return _apply("moe_routing", fwd, bwd, logits)

    def moe_dispatch(self, x, src, pos):
        """x[src] (each token's row once per slot, in the experts' order; pos is src's inverse as [tokens, top_k]),
        differentiable in x: the backward sums each token's slots in slot order."""
        return _apply("moe_dispatch", lambda x, src, pos: x[src],
                      lambda inputs, _, g: (combine(g, None, inputs[2]), None, None), x, src, pos)

    def moe_combine(self, rows, weights, pos):
        """Each token's expert rows weighted and summed in slot order (`tik_evo_kernels.moe_combine.combine`),
        differentiable in the rows and the weights."""
        def bwd(inputs, _, gy):
            return (*combine_backward(*inputs, gy), None)
        return _apply("moe_combine", combine, bwd, rows, weights, pos)

    def logprob(self, logits, targets, temperature):
        """(log-prob of each target, entropy), fp32, differentiable in the logits."""
        k = self.k["logprob"]

        def fwd(logits, targets):
            lp = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            ent = torch.empty_like(lp)
            k.logprob_full(logits, targets, temperature, lp, ent)
            return lp, ent

        def bwd(inputs, _, glp, gent):
            logits, targets = inputs
            gx = torch.empty_like(logits)
            k.logprob_backward(logits, targets, temperature, glp.contiguous(), gent.contiguous(), gx)
            return gx, None
        return _apply("logprob", fwd, bwd, logits, targets)

    def attention(self, q, k, v, sm_scale):
        """Causal attention of one sequence, q [1, HQ, S, D], k/v [1, HKV, S, D]."""
        return _attention(q, k, v, self.k["attention"], sm_scale)

    def attention_packed(self, q, k, v, bounds, sm_scale):
        """Causal attention of packed sequences (rows bounds[b]..bounds[b + 1]), q [T, HQ, D], k/v [T, HKV, D]:
        one packed launch where the kernel file has `prefill_packed`, else one launch per sequence."""
        if hasattr(self.k["attention"], "prefill_packed"):
            return _attention_packed(q, k, v, bounds, self.k["attention"], sm_scale)
        return _per_sequence(self.attention, q, k, v, bounds, sm_scale)


_GROUPED_MM: dict = {}


def _grouped_mm_trains(device: torch.device) -> bool:
    """Whether torch._grouped_mm runs forward and backward here (a Hopper GPU and a torch that has it), probed
    once per device (grad mode on: the first probe may come from inside a backward)."""
    if device.type != "cuda" or getattr(torch, "_grouped_mm", None) is None:
        return False
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    if device not in _GROUPED_MM:
        try:
            with torch.enable_grad():
                x = torch.randn((32, 16), device=device, dtype=torch.bfloat16, requires_grad=True)
                w = torch.randn((2, 16, 16), device=device, dtype=torch.bfloat16, requires_grad=True)
                offs = torch.tensor([16, 32], device=device, dtype=torch.int32)
                gx, gw = torch.autograd.grad(torch._grouped_mm(x, w.transpose(1, 2), offs=offs).float().sum(), (x, w))
            _GROUPED_MM[device] = gx is not None and gw is not None
        except Exception as e:  # noqa: BLE001 - unsupported GPU or build: the per-expert loop instead
            warnings.warn(f"torch._grouped_mm does not train on {device} ({e!r:.200}): MoE experts' matmuls run "
                          "per expert", RuntimeWarning, stacklevel=2)
            _GROUPED_MM[device] = False
    return _GROUPED_MM[device]


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class TorchOps:
    """The same calls in torch under autograd: fp32 arithmetic, bf16 in and out, experts chosen by the kernels'
    rule (largest logit, ties to the lower index). `native`: matmuls and attention in the inputs' dtype, and an
    MoE layer's experts in one `torch._grouped_mm` where the GPU and torch have it."""

    def __init__(self, native: bool = False):
        self.native = native

    def linear(self, x, w):
        if self.native:
            return F.linear(x, w)
        return (x.float() @ w.float().t()).to(x.dtype)

    def linear_grouped(self, x, weights, starts):
        if self.native and _grouped_mm_trains(x.device):
            return torch._grouped_mm(x, weights.transpose(1, 2), offs=starts[1:].to(torch.int32))
        b = starts.tolist()
        return torch.cat([self.linear(x[lo:hi], weights[e]) for e, (lo, hi) in enumerate(zip(b, b[1:]))])

    def embedding(self, ids, table):
        return table[ids.long()]

    def rmsnorm(self, x, w, eps):
        return _rms(x, w, eps)

    def add_rmsnorm(self, x, residual, w, eps):
        h = (x.float() + residual.float()).to(x.dtype)
        return _rms(h, w, eps), h

    def qk_rmsnorm(self, q, k, q_weight, k_weight, eps):
        return _rms(q, q_weight, eps), _rms(k, k_weight, eps)

    def rope(self, q, k, cos, sin, positions, inv_freq=None):  # the table is the reference; inv_freq is not used
        c, s = cos[positions.long()][:, None, :], sin[positions.long()][:, None, :]  # [tokens, 1, dim / 2]

        def rot(t):
            a, b = t.float().chunk(2, -1)
            return torch.cat([a * c - b * s, b * c + a * s], -1).to(t.dtype)
        return rot(q), rot(k)

    def silu_mul(self, gate, up):
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)

    def moe_routing(self, logits, top_k):
        ids = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
        w = torch.softmax(logits.float().gather(1, ids), -1)
        return w.to(logits.dtype), ids.to(torch.int32)

    def moe_dispatch(self, x, src, pos):
        return x[src]

    def moe_combine(self, rows, weights, pos):
        picked = rows[pos.long()]  # [tokens, top_k, hidden]
        if self.native:  # as a trainer weights and sums the experts' outputs: one batched bf16 product
            return torch.bmm(weights[:, None, :], picked)[:, 0]
        return (weights.float()[:, :, None] * picked.float()).sum(1).to(rows.dtype)

    def logprob(self, logits, targets, temperature):
        logp = torch.log_softmax(logits.float() / temperature, -1)
        return logp.gather(1, targets.long()[:, None])[:, 0], -(logp.exp() * logp).sum(-1)

    def attention(self, q, k, v, sm_scale):
        dt = q.dtype if self.native else torch.float32
        o = F.scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), is_causal=True, scale=sm_scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
        return o.to(q.dtype)

    def attention_packed(self, q, k, v, bounds, sm_scale):
        return _per_sequence(self.attention, q, k, v, bounds, sm_scale)


def _per_sequence(attention, q, k, v, bounds, sm_scale):
    """Packed attention ([T, heads, D], sequences at rows bounds[b]..bounds[b + 1]) as one `attention` call per
    sequence on its heads-first copies ([1, heads, S, D])."""
    outs = [attention(*(t[lo:hi].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v)), sm_scale)
            for lo, hi in zip(bounds, bounds[1:])]
    return torch.cat([o[0].transpose(0, 1) for o in outs])


class RecordingRouting:
    """Wraps an ops object and keeps each call's expert ids (`ids`, one tensor per MoE layer and forward): two
    forwards' choices can be compared, since tokens routed differently have different gradients by design."""

    def __init__(self, ops):
        self.ops, self.ids = ops, []

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def moe_routing(self, logits, top_k):
        w, ids = self.ops.moe_routing(logits, top_k)
        self.ids.append(ids.detach().clone())
        return w, ids
