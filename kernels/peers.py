"""The families' entry points written with the kernels a trainer uses without tik-evo: cuBLAS (torch.matmul),
PyTorch SDPA for attention (flash or efficient kernels on the GPU), torch element-wise ops for norms, RoPE
(HF's formulation: the cos/sin rows cast to the activations' dtype), SiLU-and-mul, routing, and log_softmax for
the log-prob. Same signatures as the roots, so kernels/moe_decoder.py runs on either (`torch_impls()`): the
model-level cost of the unified kernels is measured against these (tik-evo bench model-speed). Not
batch-invariant and not meant to be.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F


# The per-family benchmarks (tik_evo_bench.ops_rowwise_gpu, ops_matmul_gpu) time these same references, so the
# model-level baseline is the one each family is measured against.
def hf_rmsnorm(x, w, eps=1e-6):
    """Hugging Face's RMSNorm: normalised in fp32, cast back to the activations' dtype, then scaled."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


_rms = hf_rmsnorm


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def logprob_torch(logits, target, temperature=1.0):
    """Log-probs of `target` and the entropy, from log_softmax in fp32."""
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(-1, target[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def routing_torch(logits, top_k=8):
    """Softmax over the experts, the top k, weights renormalised."""
    p = torch.softmax(logits.float(), -1)
    w, i = torch.topk(p, top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    return w.to(logits.dtype), i



def _both(name: str, fn) -> SimpleNamespace:
    return SimpleNamespace(**{f"{name}_full": fn, f"{name}_decode": fn})


def embedding(ids, weight, out):
    torch.index_select(weight, 0, ids.long(), out=out)


def rmsnorm(x, weight, eps, out, out32=None):
    out.copy_(_rms(x, weight, eps))


def add_rmsnorm(x, residual, weight, eps, out, res_out, out32=None):
    torch.add(x, residual, out=res_out)
    out.copy_(_rms(res_out, weight, eps))


def qk_rmsnorm(q, k, q_weight, k_weight, eps, q_out, k_out, q32=None, k32=None):
    q_out.copy_(_rms(q, q_weight, eps))
    k_out.copy_(_rms(k, k_weight, eps))


def linear(x, weight, bias, out, out32=None):
    torch.matmul(x, weight.t(), out=out)
    if bias is not None:
        out.add_(bias)


def linear_grouped(x, weights, starts, out, out32=None):
    """An MoE layer's experts in one launch: torch._grouped_mm (CUTLASS grouped GEMM) where this torch and GPU
    have it, else one matmul per expert."""
    if getattr(torch, "_grouped_mm", None) is not None and x.is_cuda and torch.cuda.get_device_capability()[0] >= 9:
        out.copy_(torch._grouped_mm(x, weights.transpose(1, 2), offs=starts[1:].to(torch.int32)))
        return
    bounds = starts.tolist()
    for e in range(weights.shape[0]):
        if bounds[e + 1] > bounds[e]:
            torch.matmul(x[bounds[e]:bounds[e + 1]], weights[e].t(), out=out[bounds[e]:bounds[e + 1]])


def rope(q, k, cos, sin, positions, q_out, k_out, q32=None, k32=None, inv_freq=None, rows=None):
    pos = positions.long()
    c = torch.cat([cos[pos], cos[pos]], -1).to(q.dtype)[:, None, :]
    s = torch.cat([sin[pos], sin[pos]], -1).to(q.dtype)[:, None, :]
    for x, o in ((q, q_out), (k, k_out)):
        o.copy_(x * c + rotate_half(x) * s)


def kv_append_full(k, v, k_cache, v_cache, block_table, cu_seqlens, start_pos, max_seqlen):
    page = k_cache.shape[1]
    for b in range(cu_seqlens.numel() - 1):
        lo, hi = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        p = torch.arange(hi - lo, device=k.device) + start_pos[b]
        slots = block_table[b, p // page].long() * page + p % page
        k_cache.view(-1, *k_cache.shape[2:])[slots] = k[lo:hi]
        v_cache.view(-1, *v_cache.shape[2:])[slots] = v[lo:hi]


def kv_append_decode(k, v, k_cache, v_cache, block_table, positions):
    page = k_cache.shape[1]
    p = positions.long()
    slots = block_table[torch.arange(p.numel(), device=p.device), p // page].long() * page + p % page
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v


def silu_mul(gate, up, out, out32=None):
    torch.mul(F.silu(gate), up, out=out)


def moe_routing(logits, weights, ids, weights32=None, renormalize=True):
    if not renormalize:
        raise ValueError("the torch routing peer renormalises the top-k weights (Qwen3-MoE); renormalize=False "
                         "is not implemented")
    w, i = routing_torch(logits, weights.shape[1])
    weights.copy_(w)
    ids.copy_(i)


def logprob(logits, target, temperature, lp, entropy, lse=None):
    got, ent = logprob_torch(logits, target.long(), temperature)
    lp.copy_(got)
    entropy.copy_(ent)


def prefill(q, k, v, sm_scale, out, out32=None):
    out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=sm_scale, enable_gqa=True))


def decode(q, k_cache, v_cache, context_lens, sm_scale, out, out32=None):
    keys = torch.arange(k_cache.shape[2], device=q.device)
    mask = (keys[None, :] < context_lens[:, None])[:, None, None, :]
    out.copy_(F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, scale=sm_scale, enable_gqa=True))


def torch_impls() -> dict[str, SimpleNamespace]:
    """family -> an object with the root's entry points, for kernels/moe_decoder.MoEDecoder(impls=...)."""
    impls = {name: _both(name, fn) for name, fn in (
        ("embedding", embedding), ("rmsnorm", rmsnorm), ("add_rmsnorm", add_rmsnorm), ("qk_rmsnorm", qk_rmsnorm),
        ("linear", linear), ("rope", rope), ("silu_mul", silu_mul), ("moe_routing", moe_routing),
        ("logprob", logprob))}
    impls["linear"].linear_grouped_full = impls["linear"].linear_grouped_decode = linear_grouped
    impls["kv_append"] = SimpleNamespace(kv_append_full=kv_append_full, kv_append_decode=kv_append_decode)
    impls["attention"] = SimpleNamespace(prefill=prefill, decode=decode)
    return impls
