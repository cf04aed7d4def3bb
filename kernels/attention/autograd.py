"""Attention for the policy update: a differentiable call whose forward is a kernel file's `prefill`.

The forward values are the kernel's, the bits the rollout's decode agrees with. The backward recomputes the
attention with torch under autograd and returns its gradients: SDPA, and for a packed batch torch's varlen flash
attention in one call on a GPU (SDPA per sequence elsewhere; PACKED_BACKWARD). Backward need not be bit-exact; only
the forward log-probs have to equal the rollout's.

    impl = load_kernel("attention_kernel.py")     # e.g. from `tik-evo kernel attention --set ... -o ...`
    out = attention(q, k, v, impl)                 # q [B, HQ, S, D], k/v [B, HKV, S, D], bf16
    loss(out).backward()
    out = attention_packed(q, k, v, bounds, impl, sm_scale)   # packed: q [T, HQ, D], k/v [T, HKV, D]; needs
                                                              # impl.prefill_packed
"""

from __future__ import annotations

import math
import warnings
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
    impl.prefill_packed(q, k, v, *_cu_seqlens(bounds, q.device), sm_scale, out)
    return out


def _cu_seqlens(bounds: list[int], device: torch.device) -> tuple[torch.Tensor, int]:
    """Host row bounds -> (int32 cu_seqlens on `device`, the longest sequence as a host int: no sync)."""
    cu = torch.tensor(bounds, dtype=torch.int32).to(device, non_blocking=True)
    return cu, max(hi - lo for lo, hi in zip(bounds, bounds[1:]))


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
        with torch.enable_grad(), record_function("policy:attention.bwd"):
            grads = packed_grads(q, k, v, ctx.bounds, ctx.sm_scale, grad_out)
        return (*grads, None, None, None)


# The packed backward's recompute and gradients: "sdpa_per_sequence" (SDPA on each sequence's heads-first copies),
# "varlen_flash" (torch's varlen flash attention on the packed rows in one call, no copies) or "auto" (varlen flash
# on a GPU, else SDPA per sequence). At one fixed length SDPA per sequence was the faster on an H100 (torch 2.11,
# 4 x 2048 tokens, 32/4 heads of 128: 1.57 against 2.01 ms, results/ops/policy_glue_h100_2026-12-05.json). RL
# batches are not one length: per sequence means a host loop of SDPA calls and autograd graphs per sequence and
# layer, and on Hopper SDPA picks cuDNN, which plans each new sequence length anew; varlen flash is one launch per
# layer whatever the lengths (it is also arm A's backward in `tik-evo bench rl`, which times both settings).
PACKED_BACKWARD = "auto"
PACKED_BACKWARDS = ("auto", "varlen_flash", "sdpa_per_sequence")

# Whether torch's varlen flash attention ran forward and backward in this process (None: not tried yet). A torch
# without it, or failing at these shapes, falls back to SDPA per sequence once and for all, with one warning.
_VARLEN: dict[str, bool | None] = {"ok": None}


def _use_varlen(q: torch.Tensor) -> bool:
    return q.is_cuda and _VARLEN["ok"] is not False


def _setting() -> str:
    if PACKED_BACKWARD not in PACKED_BACKWARDS:
        raise ValueError(f"PACKED_BACKWARD {PACKED_BACKWARD!r}: expected one of {', '.join(PACKED_BACKWARDS)}")
    return PACKED_BACKWARD


def packed_backward_path(device: str | torch.device) -> str:
    """What the packed attention's backward ran in this process on `device`, for benchmark records."""
    if torch.device(device).type != "cuda" or _setting() == "sdpa_per_sequence":
        return "sdpa_per_sequence"
    return {True: "varlen_flash", False: "sdpa_per_sequence (varlen failed)", None: "not run"}[_VARLEN["ok"]]


def packed_grads(q, k, v, bounds: list[int], sm_scale: float, grad_out: torch.Tensor):
    """(dq, dk, dv) of the causal packed attention over rows bounds[b]..bounds[b + 1] (empty sequences allowed), as
    PACKED_BACKWARD says; autograd must be recording."""
    setting = _setting()
    bounds = [b for i, b in enumerate(bounds) if i == 0 or b != bounds[i - 1]]  # empty sequences need no work
    grads = None
    if setting != "sdpa_per_sequence" and _use_varlen(q) and len(bounds) > 1:
        grads = _varlen_grads(q, k, v, bounds, sm_scale, grad_out)
    return grads if grads is not None else _per_sequence_grads(q, k, v, bounds, sm_scale, grad_out)


def _varlen_grads(q, k, v, bounds: list[int], sm_scale: float, grad_out: torch.Tensor):
    """dq, dk, dv from one varlen flash recompute and its backward (no head-first copies), or None."""
    try:
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        o = varlen_flash(qs, ks, vs, *_cu_seqlens(bounds, q.device), sm_scale)
        grads = torch.autograd.grad(o, (qs, ks, vs), grad_out.contiguous())
    except (RuntimeError, TypeError, NotImplementedError, AttributeError) as e:
        _VARLEN["ok"] = False
        warnings.warn(f"attention_packed backward: torch's varlen flash attention failed ({e!r:.200}); "
                      "using SDPA per sequence", RuntimeWarning, stacklevel=2)
        return None
    _VARLEN["ok"] = True
    return grads


def _per_sequence_grads(q, k, v, bounds: list[int], sm_scale: float, grad_out: torch.Tensor):
    grads = [torch.zeros_like(t) for t in (q, k, v)]  # rows of no sequence (bounds not from 0 to T) get zeros
    for lo, hi in zip(bounds, bounds[1:]):  # SDPA per sequence, on its heads-first copies
        if lo == hi:
            continue
        qs, ks, vs = (t[lo:hi].transpose(0, 1).unsqueeze(0).detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=sm_scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
        for g, gs in zip(grads, torch.autograd.grad(o, (qs, ks, vs), grad_out[lo:hi].transpose(0, 1)[None])):
            g[lo:hi] = gs[0].transpose(0, 1)
    return grads


def varlen_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                 scale: float) -> torch.Tensor:
    """Causal flash attention over a packed batch, as torch offers it to trainers: `torch.nn.attention.varlen`
    where this torch has it (its keywords changed across releases, so each known form is tried), else the
    flash kernel's own op (GQA needs no expanded K/V in either)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    forms = [{"scale": scale, "window_size": (-1, 0), "enable_gqa": q.shape[1] != k.shape[1]},
             {"scale": scale, "window_size": (-1, 0)}]
    if scale == q.shape[-1] ** -0.5:  # the oldest form has no scale keyword: its default must be ours
        forms.append({"is_causal": True})
    for kw in forms if varlen_attn is not None else ():
        try:
            return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)
        except TypeError:  # a keyword this release does not take
            continue
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, True, False,
                                                   scale=scale)[0]


def attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], impl: ModuleType,
                     sm_scale: float) -> torch.Tensor:
    """Causal attention of packed sequences (rows bounds[b]..bounds[b + 1] of q [T, HQ, D], k/v [T, HKV, D]) ->
    [T, HQ, D]: one `impl.prefill_packed` launch forward; backward as PACKED_BACKWARD says (SDPA per sequence, or
    torch's varlen flash attention on a GPU with SDPA per sequence where that fails)."""
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
