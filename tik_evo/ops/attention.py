"""Attention (prefill, decode, paged decode, packed prefill) and the paged KV-cache appends as `tik_evo::` ops.

Prefill and packed prefill are differentiable: the forward is the kernel file's, the backward recomputes with torch
SDPA under autograd (`kernels/attention/autograd.py`), inside an op of its own so a compiled backward calls it
opaquely. Decode and the KV appends are rollout-only. The KV appends write into caches the caller owns, so they
are the ops declared with `mutates_args`; they return nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.library import custom_op

from tik_evo.ops.registry import impl


def _autograd_inside_op():
    """A context in which autograd records again. A custom op's body runs below the autograd dispatch keys (the
    dispatcher excludes them for the call), so the SDPA recompute whose gradients the backward ops take would
    record nothing; this lifts that exclusion for the recompute alone."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


# -- prefill (a batch of sequences of one length, heads first) -----------------------------------------------------
@custom_op("tik_evo::attention_prefill", mutates_args=())
def attention_prefill(q: Tensor, k: Tensor, v: Tensor, sm_scale: float, kernels: str = "root") -> Tensor:
    """Causal GQA attention: q [B, HQ, S, D], k/v [B, HKV, S, D] (bf16) -> [B, HQ, S, D]. Row t equals, bit for
    bit, `attention_decode` at context length t + 1."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel():
        impl(kernels, "attention").prefill(q.contiguous(), k.contiguous(), v.contiguous(), sm_scale, out)
    return out


@attention_prefill.register_fake
def _(q, k, v, sm_scale, kernels="root"):
    return q.new_empty(q.shape)


@custom_op("tik_evo::attention_prefill_backward", mutates_args=())
def attention_prefill_backward(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor,
                               sm_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) from torch SDPA's recompute under autograd (backward need not be bit-exact)."""
    with _autograd_inside_op(), torch.enable_grad():
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=sm_scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
        return tuple(g.contiguous() for g in torch.autograd.grad(o, (qs, ks, vs), grad_out))


@attention_prefill_backward.register_fake
def _(q, k, v, grad_out, sm_scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _prefill_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.sm_scale = inputs[3]


def _prefill_grad(ctx, grad):
    q, k, v = ctx.saved_tensors
    return (*attention_prefill_backward(q, k, v, grad, ctx.sm_scale), None, None)


attention_prefill.register_autograd(_prefill_grad, setup_context=_prefill_setup)


# -- packed prefill (rows of several sequences, as trainers feed them) ---------------------------------------------
@custom_op("tik_evo::attention_packed", mutates_args=())
def attention_packed(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, sm_scale: float,
                     kernels: str = "root") -> Tensor:
    """Causal attention of packed sequences: q [T, HQ, D], k/v [T, HKV, D]; sequence b is rows cu_seqlens[b] ..
    cu_seqlens[b + 1] (int32 [B + 1] from 0) and attends its own rows; max_seqlen (a host int) is at least the
    longest. Each row gets `attention_prefill`'s bits for its sequence alone."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel():
        impl(kernels, "attention").prefill_packed(q.contiguous(), k.contiguous(), v.contiguous(),
                                                  cu_seqlens.to(torch.int32), max_seqlen, sm_scale, out)
    return out


@attention_packed.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, sm_scale, kernels="root"):
    return q.new_empty(q.shape)


@custom_op("tik_evo::attention_packed_backward", mutates_args=())
def attention_packed_backward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, grad_out: Tensor,
                              sm_scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the packed prefill: the family's packed backward (varlen flash on a GPU, else SDPA per
    sequence; `kernels/attention/autograd.py`), reading the bounds on the host (backward only)."""
    from tik_evo_kernels.attention.autograd import packed_grads

    with _autograd_inside_op(), torch.enable_grad():
        return tuple(g.contiguous() for g in packed_grads(q, k, v, cu_seqlens.tolist(), sm_scale, grad_out))


@attention_packed_backward.register_fake
def _(q, k, v, cu_seqlens, grad_out, sm_scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _packed_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.sm_scale = inputs[5]


def _packed_grad(ctx, grad):
    q, k, v, cu = ctx.saved_tensors
    return (*attention_packed_backward(q, k, v, cu, grad, ctx.sm_scale), None, None, None, None)


attention_packed.register_autograd(_packed_grad, setup_context=_packed_setup)


# -- decode --------------------------------------------------------------------------------------------------------
@custom_op("tik_evo::attention_decode", mutates_args=())
def attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, context_lens: Tensor, sm_scale: float,
                     kernels: str = "root") -> Tensor:
    """One query per sequence: q [B, HQ, 1, D]; k_cache/v_cache [B, HKV, capacity, D] holding each sequence's keys
    from position 0, the new token's included; context_lens int32 [B] (1 .. capacity). Keys past a sequence's
    length are never read."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel():
        impl(kernels, "attention").decode(q.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
                                          context_lens.to(torch.int32).contiguous(), sm_scale, out)
    return out


@attention_decode.register_fake
def _(q, k_cache, v_cache, context_lens, sm_scale, kernels="root"):
    return q.new_empty(q.shape)


@custom_op("tik_evo::attention_decode_paged", mutates_args=())
def attention_decode_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, context_lens: Tensor,
                           sm_scale: float, kernels: str = "root") -> Tensor:
    """`attention_decode` from a paged cache, with its bits: k/v_pages [num_pages, page_size, HKV, D] (the layout
    serving engines use), key j of sequence b in row j % page_size of page block_table[b, j // page_size]
    (int32 [B, max_pages]); context_lens int32 [B]."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if q.numel():
        impl(kernels, "attention").decode_paged(q.contiguous(), k_pages, v_pages, block_table.to(torch.int32),
                                                context_lens.to(torch.int32).contiguous(), sm_scale, out)
    return out


@attention_decode_paged.register_fake
def _(q, k_pages, v_pages, block_table, context_lens, sm_scale, kernels="root"):
    return q.new_empty(q.shape)


# -- the paged KV-cache append -------------------------------------------------------------------------------------
@custom_op("tik_evo::kv_append", mutates_args=("k_cache", "v_cache"))
def kv_append(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, cu_seqlens: Tensor,
              start_pos: Tensor, max_seqlen: int, kernels: str = "root") -> None:
    """A packed prompt's keys and values, k/v [T, HKV, D], into paged caches [pages, page_size, HKV, D]: sequence
    b's rows cu_seqlens[b] .. cu_seqlens[b + 1] go to its absolute positions start_pos[b], start_pos[b] + 1, ...
    through block_table [B, max_pages] (int32)."""
    if k.shape[0]:
        impl(kernels, "kv_append").kv_append_full(k.contiguous(), v.contiguous(), k_cache, v_cache, block_table,
                                                  cu_seqlens, start_pos, max_seqlen)


@kv_append.register_fake
def _(k, v, k_cache, v_cache, block_table, cu_seqlens, start_pos, max_seqlen, kernels="root"):
    return None


@custom_op("tik_evo::kv_append_decode", mutates_args=("k_cache", "v_cache"))
def kv_append_decode(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, positions: Tensor,
                     kernels: str = "root") -> None:
    """One token per sequence: k/v [B, HKV, D] to absolute position positions[b] of sequence b."""
    if k.shape[0]:
        impl(kernels, "kv_append").kv_append_decode(k.contiguous(), v.contiguous(), k_cache, v_cache, block_table,
                                                    positions)


@kv_append_decode.register_fake
def _(k, v, k_cache, v_cache, block_table, positions, kernels="root"):
    return None


@custom_op("tik_evo::kv_append_slots", mutates_args=("k_cache", "v_cache"))
def kv_append_slots(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor,
                    kernels: str = "root") -> None:
    """Token i of k/v [T, HKV, D] to flat cache row slot_mapping[i] (page * page_size + row; negative: padding,
    not written), as serving engines map a step's tokens."""
    if k.shape[0]:
        impl(kernels, "kv_append").kv_append_slots(k, v, k_cache, v_cache, slot_mapping)


@kv_append_slots.register_fake
def _(k, v, k_cache, v_cache, slot_mapping, kernels="root"):
    return None
