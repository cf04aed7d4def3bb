"""Arm A's GPU stack: the model as a trainer runs it without tik-evo, with the fastest kernels a user would pick.

`VendorOps` is `TorchOps(native=True)` (bf16 cuBLAS linear layers, `torch._grouped_mm` experts, SDPA) with these
calls replaced where the replacement imports and passes a probe on this device:
- attention: torch's varlen flash attention (`torch.nn.attention.varlen`) for the packed prefill and training
  forward, and for decode reading every sequence's cache in place (`seqused_k`; finished sequences get a dummy
  query row whose output is dropped), else over a gathered copy of the live sequences' caches;
- Liger-Kernel: RMSNorm (also per head, for QK norm), fused add + RMSNorm, RoPE, SwiGLU (SiLU-and-mul), its
  cross-entropy for the log-probs (reduction "none": -log p of each target) and, for the training forward, its fused
  linear cross-entropy (lm_head and log-prob in one chunked call: `linear_logprob`).
A probe runs the call and TorchOps' fp32 version on small inputs of this device, forward and backward, and keeps
the call if both agree to bf16 accuracy; otherwise the torch call stays and `notes` says why. The rollout's
`decode_steps` captures the arm's decode calls, vendor or torch, in CUDA graphs.
"""

from __future__ import annotations

import torch

from tik_evo.rl.rollout import sdpa_decode
from tik_evo_kernels.autograd import TorchOps

TOL = 3e-2  # relative L2, forward and gradients, against TorchOps' fp32 arithmetic


def _liger(notes: list[str]) -> dict:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception as e:  # noqa: BLE001 - not installed, or an API this code does not know
        notes.append(f"Liger-Kernel not used ({e!r:.160})")
        return {}

    def rmsnorm(x, w, eps):
        return LigerRMSNormFunction.apply(x, w, eps)

    def qk_rmsnorm(q, k, qw, kw, eps):
        return rmsnorm(q.reshape(-1, q.shape[-1]), qw, eps).view_as(q), \
            rmsnorm(k.reshape(-1, k.shape[-1]), kw, eps).view_as(k)

    def rope(q, k, cos, sin, positions, inv_freq=None):
        # Liger takes q [batch, heads, seq, dim] (views of [batch, seq, heads, dim] storage) and full-width cos/sin
        # rows, one per token: the packed tokens as one sequence, the table's half-width rows doubled.
        c, s = cos[positions.long()], sin[positions.long()]
        c, s = torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]
        qr, kr = LigerRopeFunction.apply(q[None].transpose(1, 2), k[None].transpose(1, 2), c, s)
        return qr.transpose(1, 2)[0], kr.transpose(1, 2)[0]

    def logprob(logits, targets, temperature):
        x = logits if temperature == 1.0 else logits / temperature
        return -liger_cross_entropy(x, targets.long(), reduction="none").float(), None

    calls = {"rmsnorm": rmsnorm, "qk_rmsnorm": qk_rmsnorm, "rope": rope,
             "silu_mul": lambda a, b: LigerSiLUMulFunction.apply(a, b), "logprob": logprob}
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        def linear_logprob(x, w, targets, temperature):
            # lm_head and log-prob in one chunked call, the logits never whole in memory. Liger has no temperature:
            # log softmax(x W^T / T) = log softmax((x / T) W^T), so the rows are scaled instead.
            xs = x if temperature == 1.0 else x / temperature
            return -liger_fused_linear_cross_entropy(xs, w, targets.long(), reduction="none").float()

        calls["linear_logprob"] = linear_logprob
    except Exception as e:  # noqa: BLE001 - an older Liger: lm_head and log-prob as two calls
        notes.append(f"Liger fused linear cross-entropy not used ({e!r:.120})")
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        calls["add_rmsnorm"] = lambda x, r, w, eps: LigerFusedAddRMSNormFunction.apply(x, r, w, eps)
    except Exception as e:  # noqa: BLE001 - an older Liger: add + RMSNorm in torch
        notes.append(f"Liger fused add + RMSNorm not used ({e!r:.120})")
    return calls


def _flash(notes: list[str]) -> dict:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        notes.append(f"varlen flash attention not in this torch ({e!r:.120})")
        return {}
    import inspect

    # The public wrapper grew its keywords release by release (torch 2.11 has no enable_gqa or seqused_k); the
    # flash kernels under it take fewer KV heads than query heads in every release, and the aten op has long
    # taken seqused_k, so decode calls it directly where the wrapper cannot.
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}

    def gqa(q, k) -> dict:
        return {"enable_gqa": q.shape[1] != k.shape[1]} if "enable_gqa" in params else {}

    def attention_packed(q, k, v, bounds, scale):
        cu = torch.tensor(bounds, device=q.device, dtype=torch.int32)
        longest = max(b - a for a, b in zip(bounds, bounds[1:]))
        return varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, **causal, **gqa(q, k))

    def decode_call(q, k, v, cu_q, cu_k, cap, used, scale):
        if "seqused_k" in params:
            return varlen_attn(q, k, v, cu_q, cu_k, 1, cap, scale=scale, seqused_k=used, **gqa(q, k))
        return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, 1, cap, 0.0, False, False, scale=scale,
                                                       seqused_k=used)[0]

    def decode_in_place(q, k_cache, v_cache, live, lens, scale):
        # Every sequence's cache read where it lies ([sequences * capacity] rows), no copy. The flash kernel's
        # one-query path folds the GQA heads into query rows and needs one query row for every sequence (an empty
        # one fails its reshape), so a finished sequence gets a zero query over its first key, its output dropped.
        b, cap = k_cache.shape[:2]
        q_all = q.new_zeros((b, *q.shape[1:]))
        q_all[live] = q
        used = torch.ones(b, device=q.device, dtype=torch.int32)
        used[live] = lens.to(torch.int32)
        cu = torch.arange(b + 1, device=q.device, dtype=torch.int32)
        o = decode_call(q_all, k_cache.flatten(0, 1), v_cache.flatten(0, 1), cu, cu * cap, cap, used, scale)
        return o[live].reshape(q.shape[0], -1)

    def decode_gathered(q, k_cache, v_cache, live, lens, scale):
        n, cap = q.shape[0], k_cache.shape[1]
        kc, vc = (c[live].flatten(0, 1) for c in (k_cache, v_cache))  # the live sequences' caches, packed
        cu_q = torch.arange(n + 1, device=q.device, dtype=torch.int32)
        o = decode_call(q, kc, vc, cu_q, cu_q * cap, cap, lens.to(torch.int32), scale)
        return o.reshape(n, -1)

    return {"attention_packed": attention_packed, "attention_decode": [decode_in_place, decode_gathered]}


def _probe_inputs(name: str, device: str):
    """(differentiable inputs, other arguments) of a small call of `name` on `device`."""
    from tik_evo_kernels.rope.family import rope_table

    g = torch.Generator(device).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, generator=g, device=device) * scale).to(torch.bfloat16)

    cos, sin = rope_table(64, 128, 1e6, None, device)
    cases = {
        "rmsnorm": ((rnd(33, 256), rnd(256, scale=0.1) + 1), (1e-6,)),
        "add_rmsnorm": ((rnd(33, 256), rnd(33, 256), rnd(256, scale=0.1) + 1), (1e-6,)),
        "qk_rmsnorm": ((rnd(33, 4, 128), rnd(33, 2, 128), rnd(128, scale=0.1) + 1, rnd(128, scale=0.1) + 1), (1e-6,)),
        "rope": ((rnd(33, 4, 128), rnd(33, 2, 128)),
                 (cos, sin, torch.randint(0, 64, (33,), generator=g, device=device).to(torch.int32))),
        "silu_mul": ((rnd(33, 256), rnd(33, 256)), ()),
        "logprob": ((rnd(33, 1000, scale=3.0),),
                    (torch.randint(0, 1000, (33,), generator=g, device=device).to(torch.int32), 0.7)),
        "linear_logprob": ((rnd(33, 256), rnd(1000, 256, scale=3.0 / 16)),
                           (torch.randint(0, 1000, (33,), generator=g, device=device).to(torch.int32), 0.7)),
        "attention_packed": ((rnd(40, 4, 128), rnd(40, 2, 128), rnd(40, 2, 128)), ([0, 17, 40], 128 ** -0.5)),
        "attention_decode": ((rnd(2, 4, 128),), (rnd(3, 24, 2, 128), rnd(3, 24, 2, 128),
                                                 torch.tensor([0, 2], device=device),
                                                 torch.tensor([5, 24], device=device, dtype=torch.int32),
                                                 128 ** -0.5)),
    }
    return cases[name]


def _reference(name: str):
    if name == "linear_logprob":
        torch_ops = TorchOps()
        return lambda x, w, t, temp: torch_ops.logprob(torch_ops.linear(x, w), t, temp)[0]
    if name == "attention_decode":
        return lambda q, kc, vc, live, lens, scale: sdpa_decode(q, kc[live], vc[live], lens, scale, torch.float32)
    return getattr(TorchOps(), name)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def probe(name: str, call, device: str) -> str | None:
    """None if `call` agrees with TorchOps' fp32 version of `name`, forward and (where there is one) backward, on
    a small case of this device; else why not."""
    try:
        diff, const = _probe_inputs(name, device)
        results = []
        for fn in (call, _reference(name)):
            xs = [t.clone().requires_grad_(name != "attention_decode") for t in diff]
            # non-leaf copies, as a model's activations are (a call may write its inputs in place, as Liger's RoPE)
            outs = fn(*[x.clone() for x in xs], *const)
            outs = list(outs) if isinstance(outs, tuple) else [outs]
            outs = [o for o in outs[:1 if name == "logprob" else None] if o.is_floating_point()]  # lp, not entropy
            if name != "attention_decode":
                w = [torch.randn(o.shape, generator=torch.Generator(device).manual_seed(1), device=device)
                     for o in outs]
                sum((o.float() * wi).sum() for o, wi in zip(outs, w)).backward()
            results.append(([o.detach() for o in outs], [x.grad for x in xs if x.grad is not None]))
        (out, grads), (ref_out, ref_grads) = results
        errs = [_rel(a, b) for a, b in zip(out, ref_out)] + [_rel(a, b) for a, b in zip(grads, ref_grads)]
        if len(out) != len(ref_out) or len(grads) != len(ref_grads) or not all(e < TOL for e in errs):
            return f"differs from torch: relative errors {[round(e, 4) for e in errs]}"
    except Exception as e:  # noqa: BLE001 - an API mismatch or an unsupported device: keep torch's call
        return f"failed: {e!r:.160}"
    return None


class VendorOps(TorchOps):
    """TorchOps(native=True) with the vendor calls that passed their probe (`candidates`: {call name: function or
    list of alternatives, the first that passes kept}, default Liger-Kernel's and torch's varlen flash attention,
    on a GPU). `notes` records each decision."""

    def __init__(self, device: str, candidates: dict | None = None):
        super().__init__(native=True)
        self.notes: list[str] = []
        if candidates is None:
            if torch.device(device).type != "cuda":
                candidates = {}
                self.notes.append("not on a GPU: no vendor kernels")
            else:
                candidates = {**_flash(self.notes), **_liger(self.notes)}
        self.fast = {}
        for name, calls in candidates.items():  # a call, or alternatives tried in order
            for call in calls if isinstance(calls, list) else [calls]:
                why = probe(name, call, device)
                label = f"{name} ({getattr(call, '__name__', 'call')})"
                self.notes.append(f"{label}: {'vendor' if why is None else 'torch, the vendor call ' + why}")
                if why is None:
                    self.fast[name] = call
                    break
        if "attention_decode" not in self.fast:
            self.attention_decode = None  # the rollout's cache then runs SDPA with a length mask
        if "linear_logprob" in self.fast:  # the model's training forward then fuses lm_head and log-prob
            self.linear_logprob = self.fast["linear_logprob"]

    def _call(self, name, *args):
        fast = self.fast.get(name)
        return fast(*args) if fast is not None else getattr(super(), name)(*args)

    def rmsnorm(self, x, w, eps):
        return self._call("rmsnorm", x, w, eps)

    def add_rmsnorm(self, x, residual, w, eps):
        return self._call("add_rmsnorm", x, residual, w, eps)

    def qk_rmsnorm(self, q, k, q_weight, k_weight, eps):
        return self._call("qk_rmsnorm", q, k, q_weight, k_weight, eps)

    def rope(self, q, k, cos, sin, positions, inv_freq=None):
        return self._call("rope", q, k, cos, sin, positions, inv_freq)

    def silu_mul(self, gate, up):
        return self._call("silu_mul", gate, up)

    def logprob(self, logits, targets, temperature):
        return self._call("logprob", logits, targets, temperature)

    def attention_packed(self, q, k, v, bounds, sm_scale):
        return self._call("attention_packed", q, k, v, bounds, sm_scale)

    def attention_decode(self, q, k_cache, v_cache, live, lens, sm_scale):
        return self.fast["attention_decode"](q, k_cache, v_cache, live, lens, sm_scale)
