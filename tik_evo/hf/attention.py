"""The unified attention as a transformers attention function, registered as "tik_evo" in `AttentionInterface`
(with a mask function of the same name in `AttentionMaskInterface`), so the training forward, the prefill and each
decode step of `generate` all go through it.

What it is given (transformers' attention-function signature): q [B, HQ, Sq, D] and the layer's keys and values
[B, HKV, Skv, D] (a cache's whole contents in a decode step), and the 2D padding mask [B, seen] (1 for a token,
0 for padding) or None. Each row of the batch must hold one sequence as one contiguous run of 1s (left padding,
as `generate` pads prompts, or right padding).

- Sq > 1 (training, or a prefill from an empty cache): the rows are packed as they lie, [B * Sq, HQ, D], into one
  `tik_evo::attention_packed` launch whose segments are each row's padding before, its sequence, and its padding
  after (2B + 1 segments; positions come from the device, so no host sync and fixed shapes under torch.compile).
  Each token gets the bits of a prefill of its sequence alone, wherever the padding put it.
- Sq == 1 (a decode step): each row's keys are moved to start at cache position 0 (a gather; padding before the
  sequence would otherwise shift the key tiles, which are anchored at key 0), then `tik_evo::attention_decode`
  reads context length = the row's token count. It equals the prefill's row for that position, bit for bit.
"""

from __future__ import annotations

import torch

NAME = "tik_evo"


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask handed to the attention function: the 2D padding mask as given (bool), or None without one."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"tik_evo attention: a {attention_mask.dim()}D attention mask; expected the 2D padding mask "
                         "[batch, tokens] (custom 4D masks are not supported)")
    return attention_mask.to(torch.bool)


def _runs(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first index, length) of each row's run of 1s, int64 [B] (a row without tokens: (0, 0))."""
    m = mask.to(torch.int32)
    return m.argmax(1), m.sum(1, dtype=torch.int64)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature; returns (out [B, Sq, HQ, D], None)."""
    import tik_evo.ops as ops

    kernels = getattr(module, "_tik_evo_kernels", "root")
    if dropout:
        raise ValueError(f"tik_evo attention: dropout {dropout} is not supported (set attention_dropout to 0)")
    if kwargs.get("sliding_window"):
        raise ValueError(f"tik_evo attention: sliding window {kwargs['sliding_window']} is not supported")
    scale = float(scaling if scaling is not None else query.shape[-1] ** -0.5)
    B, HQ, S, D = query.shape
    if S == 1:
        return _decode(ops, query, key, value, attention_mask, kwargs.get("position_ids"), scale, kernels), None
    if attention_mask is None and getattr(module, "layer_idx", 0) == 0:
        _refuse_packed_rows(kwargs.get("position_ids"), S)
    key, value = key[:, :, :S], value[:, :, :S]  # a prefill from an empty cache: the fresh keys lead it
    if attention_mask is None:
        start = torch.zeros(B, dtype=torch.int64, device=query.device)
        length = torch.full((B,), S, dtype=torch.int64, device=query.device)
    else:
        start, length = _runs(attention_mask[:, -S:])
    base = torch.arange(B, device=query.device, dtype=torch.int64) * S + start
    edges = torch.stack([base, base + length], 1).reshape(-1)
    zero = torch.zeros(1, dtype=torch.int64, device=query.device)
    cu = torch.cat([zero, edges, zero + B * S]).to(torch.int32)
    rows = lambda t: t.transpose(1, 2).reshape(B * S, t.shape[1], D)  # noqa: E731 - [B, S, H, D] as packed rows
    out = ops.attention_packed(rows(query), rows(key), rows(value), cu, S, scale, kernels)
    return out.view(B, S, HQ, D), None


def _decode(ops, query, key, value, attention_mask, position_ids, scale, kernels):
    B, HQ, _, D = query.shape
    if attention_mask is not None:
        start, context = _runs(attention_mask)
        cap = key.shape[2]
        idx = (torch.arange(cap, device=key.device)[None, :] + start[:, None]).clamp_(max=cap - 1)
        idx = idx[:, None, :, None].expand(B, key.shape[1], cap, D)
        key, value = key.gather(2, idx), value.gather(2, idx)  # each sequence from cache position 0
    elif position_ids is not None:  # no padding: the row's position + 1 keys
        context = position_ids.reshape(-1, position_ids.shape[-1])[:, -1].expand(B) + 1
    else:
        raise ValueError("tik_evo attention: a decode step needs the attention mask or the position ids to know each "
                         "sequence's context length")
    out = ops.attention_decode(query, key, value, context.to(torch.int32), scale, kernels)
    return out.transpose(1, 2)


def _refuse_packed_rows(position_ids, S: int) -> None:
    """Several sequences packed into one row (positions restarting inside it) are not supported: refuse them in
    eager runs (one host check per forward, at the first layer) rather than attend across their boundaries."""
    if position_ids is None or S < 2 or torch.compiler.is_compiling():
        return
    if bool((position_ids[..., 1:] != position_ids[..., :-1] + 1).any()):
        raise ValueError("tik_evo attention: position_ids restart inside a row (sequences packed into one row): "
                         "give each sequence its own row with an attention_mask for the padding")


def register() -> None:
    """Register the attention function and its mask function with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, padding_mask)
