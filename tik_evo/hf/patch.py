"""What `tik_evo.hf.apply` changes in a transformers model, module by module (each instance's `forward` is
replaced; the classes and other models are untouched):

- every RMSNorm (the layers', the final one): `tik_evo::rmsnorm`;
- every projection (attention, MLP, router, lm_head): `tik_evo::linear` (bias included: Qwen2's QKV);
- attention: projections, Qwen3's per-head QK norm (`tik_evo::qk_rmsnorm`), RoPE by absolute position from one
  fp32 table (`tik_evo::rope`), the cache update, then the attention function registered as "tik_evo"
  (`attention.py`);
- the MLP: gate and up projections, `tik_evo::silu_mul`, down projection;
- a Qwen3-MoE block: router projection, `tik_evo::moe_routing`, the experts' projections as grouped launches
  (`tik_evo::linear_grouped`) over the rows sorted by expert, `tik_evo::moe_combine` in slot order;
- the rotary module returns the fp32 tables instead of computing cos/sin per forward.

The token embedding stays torch's: a gather, exact in every path, with its padding row's gradient rule. Residual
adds stay the model's bf16 adds (elementwise: the same bits in every path). Each call takes the decode entry point
when the input holds one token per sequence ([batch, 1, ...]), else the full-sequence one (same bits: speed only).
"""

from __future__ import annotations

from types import MethodType

import torch

from tik_evo_kernels.rope.family import table_from_inv_freq

SUPPORTED = {  # model_type -> what the patch relies on, for messages
    "llama": "Llama 3 (RMSNorm, SiLU MLP, GQA, RoPE default or llama3)",
    "qwen2": "Qwen2 / Qwen2.5 (QKV bias, tied embeddings where configured)",
    "qwen3": "Qwen3 dense (per-head QK RMSNorm)",
    "qwen3_moe": "Qwen3-MoE (softmax top-k router, experts as 3D weights)",
}
ROPE_TYPES = ("default", "llama3", "linear")  # scalings that only rescale inv_freq (attention scaling 1)


class UnsupportedModelError(ValueError):
    """A model (or a part of it) the patch does not cover; the message names the class and what is missing."""


def _decode(x: torch.Tensor) -> bool:
    """One token per sequence ([batch, 1, ...]): a decode step."""
    return x.dim() > 2 and x.shape[1] == 1


def _kernels(module) -> str:
    return module._tik_evo_kernels


def linear_forward(self, x):
    import tik_evo.ops as ops

    return ops.linear(x, self.weight, self.bias, _decode(x), _kernels(self))


def rmsnorm_forward(self, x):
    import tik_evo.ops as ops

    return ops.rmsnorm(x, self.weight, self._tik_evo_eps, _decode(x), _kernels(self))


def mlp_forward(self, x):
    import tik_evo.ops as ops

    return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x), _decode(x), _kernels(self)))


def rotary_forward(self, x, position_ids):
    """The fp32 tables ([max_pos, head_dim / 2]) in place of per-token cos/sin: attention gathers by position."""
    cos, sin = self._tik_evo_cos, self._tik_evo_sin
    if cos.dtype != torch.float32:  # a dtype cast of the model reached the buffers: recompute them
        cos, sin = table_from_inv_freq(self._tik_evo_inv64, cos.shape[0], cos.device)
    return cos, sin


def attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                      past_key_values=None, **kwargs):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    import tik_evo.ops as ops
    from tik_evo.hf.attention import attention as tik_attention

    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ValueError(f"{type(self).__name__} (tik_evo): position_ids are needed (the model's forward passes them)")
    B, S = hidden_states.shape[:2]
    decode, kernels, D = _decode(hidden_states), _kernels(self), self.head_dim
    q = self.q_proj(hidden_states).view(B, S, -1, D)
    k = self.k_proj(hidden_states).view(B, S, -1, D)
    v = self.v_proj(hidden_states).view(B, S, -1, D)
    if getattr(self, "q_norm", None) is not None:
        q, k = ops.qk_rmsnorm(q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm._tik_evo_eps, decode,
                              kernels)
    cos, sin = position_embeddings
    q, k = ops.rope(q, k, cos, sin, position_ids.expand(B, S), None, decode, kernels)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    cache = cache if cache is not None else past_key_values
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, tik_attention)
    out, weights = fn(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
    return self.o_proj(out.reshape(B, S, -1)), weights


def moe_forward(self, hidden_states):
    """Qwen3-MoE's sparse block on the kernels: route, sort the (token, slot) pairs by expert, three grouped
    launches, combine in slot order. Counts per expert come from a scatter (fixed shapes: no host sync)."""
    import tik_evo.ops as ops

    B, S, H = hidden_states.shape
    decode, kernels = _decode(hidden_states), _kernels(self)
    experts, router = self.experts, self.gate
    x = hidden_states.reshape(B * S, H)
    logits = ops.linear(x, router.weight, None, decode, kernels)
    weights, ids = ops.moe_routing(logits, router.top_k, bool(router.norm_topk_prob), decode, kernels)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=x.device)
    pos = pos.view(-1, router.top_k)
    counts = torch.zeros(experts.num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0, dtype=torch.int32)])
    xs = ops.moe_dispatch(x, order // router.top_k, pos)
    gate_up = ops.linear_grouped(xs, experts.gate_up_proj, starts, decode, kernels)
    inter = experts.gate_up_proj.shape[1] // 2
    act = ops.silu_mul(gate_up[:, :inter], gate_up[:, inter:], decode, kernels)
    down = ops.linear_grouped(act, experts.down_proj, starts, decode, kernels)
    return ops.moe_combine(down, weights, pos).view(B, S, H)


# -- checks ----------------------------------------------------------------------------------------------------------
def _need(owner, names: tuple[str, ...], where: str, model_name: str) -> None:
    missing = [n for n in names if getattr(owner, n, None) is None]
    if missing:
        raise UnsupportedModelError(f"{model_name}: {where} ({type(owner).__name__}) has no {', '.join(missing)}; "
                                    "the tik_evo patch needs them")


def _is_rmsnorm(m) -> bool:
    return type(m).__name__.endswith("RMSNorm") and hasattr(m, "weight") and hasattr(m, "variance_epsilon")


def check(model) -> None:
    """Refuse, naming the class and what is missing, a model the patch does not cover."""
    name = type(model).__name__
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED:
        raise UnsupportedModelError(
            f"tik_evo.hf: {name} (model_type {mtype!r}) is not supported; supported: "
            + "; ".join(f"{k}: {v}" for k, v in SUPPORTED.items()))
    _need(model, ("model", "lm_head"), "the model", name)
    _need(model.model, ("embed_tokens", "layers", "norm", "rotary_emb"), "model.model", name)
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"{name}: hidden_act {cfg.hidden_act!r}: the silu_mul family computes SiLU only")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.bfloat16}:
        raise UnsupportedModelError(f"{name}: parameters of dtype {sorted(map(str, dtypes))}: the unified kernels run "
                                    "in bfloat16 (load with dtype=torch.bfloat16)")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in ROPE_TYPES or getattr(model.model.rotary_emb, "attention_scaling", 1.0) != 1.0:
        raise UnsupportedModelError(f"{name}: rope_type {rope_type!r} is not supported (supported: "
                                    f"{', '.join(ROPE_TYPES)}, which only rescale the frequencies)")
    sliding = [i for i, t in enumerate(getattr(cfg, "layer_types", None) or []) if t != "full_attention"]
    if sliding:
        raise UnsupportedModelError(f"{name}: layers {sliding} use {cfg.layer_types[sliding[0]]!r}: the tik_evo "
                                    "attention is full causal attention only (turn off sliding windows)")
    if getattr(cfg, "attention_dropout", 0.0):
        raise UnsupportedModelError(f"{name}: attention_dropout {cfg.attention_dropout}: not supported")
    for i, layer in enumerate(model.model.layers):
        _need(layer, ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm"), f"layer {i}", name)
        _need(layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "layer_idx"),
              f"layer {i}'s self_attn", name)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            _need(mlp, ("gate",), f"layer {i}'s MoE block", name)
            _need(mlp.experts, ("gate_up_proj", "down_proj", "num_experts"), f"layer {i}'s experts", name)
            _need(mlp.gate, ("weight", "top_k"), f"layer {i}'s router", name)
            if getattr(mlp.experts, "is_transposed", False) or not getattr(mlp.experts, "is_concatenated", True) \
                    or getattr(mlp.experts, "has_bias", False):
                raise UnsupportedModelError(f"{name}: layer {i}'s experts store weights in a layout the grouped "
                                            "launch does not take (expected [experts, out, in], gate then up, no bias)")
            if getattr(mlp, "shared_expert", None) is not None:
                raise UnsupportedModelError(f"{name}: layer {i} has a shared expert: not supported")
        else:
            _need(mlp, ("gate_proj", "up_proj", "down_proj"), f"layer {i}'s mlp", name)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not _is_rmsnorm(norm):
                raise UnsupportedModelError(f"{name}: layer {i}: {type(norm).__name__} is not an RMSNorm")


# -- patching --------------------------------------------------------------------------------------------------------
def _bind(module, fn, kernels: str) -> None:
    module._tik_evo_kernels = kernels
    module.forward = MethodType(fn, module)


def _norm(module, kernels: str) -> None:
    module._tik_evo_eps = float(module.variance_epsilon)
    _bind(module, rmsnorm_forward, kernels)


def patch(model, kernels: str) -> None:
    """Patch `model` in place (after `check`)."""
    inner = model.model
    rotary = inner.rotary_emb
    inv = getattr(rotary, "original_inv_freq", None)
    inv = rotary.inv_freq if inv is None else inv
    rotary._tik_evo_inv64 = inv.detach().to("cpu", torch.float64)
    max_pos = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    if max_pos <= 0:
        raise UnsupportedModelError(f"{type(model).__name__}: config.max_position_embeddings is missing: the RoPE "
                                    "table needs it")
    cos, sin = table_from_inv_freq(rotary._tik_evo_inv64, max_pos, inv.device)
    # Buffers follow model.to(device); not saved with the model (a checkpoint stays transformers').
    rotary.register_buffer("_tik_evo_cos", cos, persistent=False)
    rotary.register_buffer("_tik_evo_sin", sin, persistent=False)
    _bind(rotary, rotary_forward, kernels)
    _norm(inner.norm, kernels)
    _bind(model.lm_head, linear_forward, kernels)
    for layer in inner.layers:
        attn = layer.self_attn
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            _bind(proj, linear_forward, kernels)
        if getattr(attn, "q_norm", None) is not None:
            _norm(attn.q_norm, kernels)
            _norm(attn.k_norm, kernels)
        _bind(attn, attention_forward, kernels)
        _norm(layer.input_layernorm, kernels)
        _norm(layer.post_attention_layernorm, kernels)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            _bind(mlp, moe_forward, kernels)
        else:
            for proj in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                _bind(proj, linear_forward, kernels)
            _bind(mlp, mlp_forward, kernels)
    model._tik_evo_kernels = kernels

