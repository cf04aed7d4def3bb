"""GRPO's group-normalised advantages: each prompt is sampled `group` times, and a completion's advantage is its
reward's distance from its group's mean in units of the group's standard deviation (DeepSeekMath's GRPO, outcome
supervision: every token of a completion gets its completion's advantage).

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

std is the unbiased (n - 1) one, as TRL's GRPOTrainer takes it; a group whose rewards are all equal gets
advantage 0 for each completion (nothing to learn from it).
"""

from __future__ import annotations

import torch

EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group: int, eps: float = EPS) -> torch.Tensor:
    """rewards [prompts * group] (fp32, each prompt's samples contiguous) -> advantages, the same shape."""
    if rewards.dim() != 1 or group < 2 or rewards.numel() % group:
        raise ValueError(f"group_advantages: {tuple(rewards.shape)} rewards do not split into groups of {group} "
                         "(a 1-D tensor, group >= 2)")
    r = rewards.float().view(-1, group)
    adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)
    return adv.flatten()


def token_advantages(advantages: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Each completion's advantage repeated over its `lengths[i]` tokens: [sum(lengths)]."""
    return advantages.repeat_interleave(torch.tensor(lengths, device=advantages.device))
