"""The PPO-clip objective over packed micro-batches, averaged over tokens (token-mean).

Per token t with new log-prob l_t (the policy being updated), old log-prob o_t (the policy that sampled it, or its
recomputation) and advantage A_t:

    r_t = exp(l_t - o_t)
    loss_t = -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t)

The batch loss is sum_t loss_t / N with N the tokens of the whole batch, so the gradients of the micro-batches,
each backpropagated on its own sum / N, add up to the gradient of the batch's token-mean (DAPO's token-level
normalisation). No KL term: the loss is GRPO's clipped surrogate alone.
"""

from __future__ import annotations

import torch

CLIP = 0.2


def ppo_clip_loss(new: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, batch_tokens: int,
                  clip: float = CLIP) -> tuple[torch.Tensor, torch.Tensor]:
    """(this micro-batch's share of the batch's token-mean loss, the ratios r_t, detached). new, old, advantages:
    fp32 [tokens] of one micro-batch; batch_tokens: the tokens of the whole batch."""
    if not new.shape == old.shape == advantages.shape or new.dim() != 1:
        raise ValueError(f"ppo_clip_loss: new {tuple(new.shape)}, old {tuple(old.shape)}, advantages "
                         f"{tuple(advantages.shape)}: expected three 1-D tensors of one length")
    ratio = torch.exp(new - old.detach())
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    return -surrogate.sum() / batch_tokens, ratio.detach()


IS_CAP = 5.0  # the behaviour importance weight's truncation (stale rollouts)


def decoupled_ppo_loss(new: torch.Tensor, behaviour: torch.Tensor, advantages: torch.Tensor, batch_tokens: int,
                       clip: float = CLIP, cap: float = IS_CAP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's decoupled objective for stale rollouts (AReaL): the clip is taken against the proximal policy and
    the gap between it and the behaviour policy that sampled the tokens is an importance weight,

        r_t = exp(l_t - p_t),  w_t = min(exp(p_t - b_t), cap),  loss_t = -w_t min(r_t A_t, clip(r_t) A_t)

    with b_t the behaviour log-probs and p_t the proximal policy's. With one optimizer step per batch (this
    trainer) the proximal policy is the policy being updated, so p_t is l_t detached and needs no forward of its
    own; b_t is what the rollout recorded (arm B: bit for bit a training forward of the behaviour weights) or its
    recomputation. -> (the micro-batch's share of the batch's token-mean loss, r_t, w_t), both detached."""
    if not new.shape == behaviour.shape == advantages.shape or new.dim() != 1:
        raise ValueError(f"decoupled_ppo_loss: new {tuple(new.shape)}, behaviour {tuple(behaviour.shape)}, "
                         f"advantages {tuple(advantages.shape)}: expected three 1-D tensors of one length")
    prox = new.detach()
    ratio = torch.exp(new - prox)
    weight = torch.exp(prox - behaviour.detach()).clamp(max=cap)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    return -(weight * surrogate).sum() / batch_tokens, ratio.detach(), weight


def ratio_stats(ratio: torch.Tensor, clip: float = CLIP) -> dict:
    """What the report says of a micro-batch's ratios: whether every one is exactly 1.0 (bit for bit: the old and
    new log-probs were equal), how many are not, the distribution of |r - 1| and the clipped fraction."""
    r = ratio.detach().double().cpu()
    dev = (r - 1).abs()
    q = torch.tensor([0.5, 0.9, 0.99, 1.0], dtype=torch.float64)
    quantiles = dev.quantile(q).tolist() if dev.numel() else [0.0] * 4
    return {
        "tokens": int(r.numel()),
        "all_exactly_one": bool((ratio == 1.0).all()),
        "not_one": int((ratio != 1.0).sum()),
        "abs_dev_mean": float(dev.mean()) if dev.numel() else 0.0,
        "abs_dev_p50": quantiles[0], "abs_dev_p90": quantiles[1], "abs_dev_p99": quantiles[2],
        "abs_dev_max": quantiles[3],
        "clipped_fraction": float(((r < 1 - clip) | (r > 1 + clip)).double().mean()) if r.numel() else 0.0,
    }
