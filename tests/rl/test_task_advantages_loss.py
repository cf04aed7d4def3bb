"""The GRPO loop's arithmetic against hand-worked examples: the addition task's tokenizer and reward, the
group-normalised advantages, the PPO-clip loss, its gradient and the ratio statistics."""

import math

import pytest
import torch

from tik_evo.rl.advantages import group_advantages, token_advantages
from tik_evo.rl.loss import decoupled_ppo_loss, ppo_clip_loss, ratio_stats
from tik_evo.rl.task import EOS, PAD, AdditionTask, Problem, decode, encode, reward


def test_tokenizer_round_trips_and_names_an_unknown_symbol():
    assert encode("12+9=") == [3, 4, 12, 11, 13]  # digits start at id 2
    assert decode([PAD, *encode("12+9="), EOS, 99]) == "_12+9=$?"
    with pytest.raises(ValueError, match="'x' is not a symbol"):
        encode("1x2")


def test_reward_is_one_only_for_the_sum_followed_by_eos():
    p = Problem(58, 67)  # 125
    assert reward(p, encode("125") + [EOS]) == 1.0
    assert reward(p, encode("125") + [EOS, 5, 7]) == 1.0  # what follows the first EOS is not read
    assert reward(p, encode("125")) == 0.0  # no EOS: truncated
    assert reward(p, encode("124") + [EOS]) == 0.0
    assert reward(p, encode("1250") + [EOS]) == 0.0
    assert reward(p, [EOS]) == 0.0
    assert reward(p, encode("12") + [99, EOS]) == 0.0  # an id outside the tokenizer


def test_task_prompts_targets_and_padding():
    task = AdditionTask(digits=2, prompt_len=9)
    problems = task.sample(50, torch.Generator().manual_seed(0))
    assert all(10 <= p.a <= 99 and 10 <= p.b <= 99 for p in problems)
    assert len({(p.a, p.b) for p in problems}) > 1
    assert problems == task.sample(50, torch.Generator().manual_seed(0))  # reseeded: the same problems
    p = Problem(47, 85)
    assert task.prompt(p) == [PAD, PAD, PAD, *encode("47+85=")]
    assert task.target(p) == encode("132") + [EOS] and task.max_answer == 4
    assert reward(p, task.target(p)) == 1.0
    assert AdditionTask(digits=2).prompt(p) == encode("47+85=")
    with pytest.raises(ValueError, match="prompt_len 5 is shorter"):
        AdditionTask(digits=2, prompt_len=5)


def test_group_advantages_by_hand():
    # groups of 2: [1, 0] and [0, 1]: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / (0.70711 + 1e-4)
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert torch.allclose(adv, torch.tensor([a, -a, -a, a]), rtol=0, atol=1e-6)
    # a group of 4: [1, 0, 0, 0]: mean 0.25, unbiased variance 0.75 / 3 = 0.25, std 0.5
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]), 4)
    s = 0.5 + 1e-4
    assert torch.allclose(adv, torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s, 0, 0, 0, 0]), atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards: nothing to learn, exactly 0
    assert torch.equal(token_advantages(torch.tensor([2.0, -1.0]), [3, 1]), torch.tensor([2.0, 2.0, 2.0, -1.0]))
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(torch.zeros(4), 3)


def test_ppo_clip_loss_and_gradient_by_hand():
    # ratios 1, 1.5, 0.5, 1.1 (old log-probs 0); advantages 2, 1, -1, -1; clip 0.2; 10 tokens in the batch.
    # surrogate min(rA, clip(r)A): 2, min(1.5, 1.2) = 1.2, min(-0.5, -0.8) = -0.8, min(-1.1, -1.1) = -1.1
    # loss = -(2 + 1.2 - 0.8 - 1.1) / 10 = -0.13
    new = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.1])).requires_grad_()
    adv = torch.tensor([2.0, 1.0, -1.0, -1.0])
    loss, ratio = ppo_clip_loss(new, torch.zeros(4), adv, batch_tokens=10, clip=0.2)
    assert math.isclose(float(loss.detach()), -0.13, abs_tol=1e-6)
    assert torch.allclose(ratio, torch.tensor([1.0, 1.5, 0.5, 1.1]))
    loss.backward()
    # d loss / d new_t = -r_t A_t / 10 where the unclipped term is the minimum, 0 where the clipped one is
    assert torch.allclose(new.grad, torch.tensor([-0.2, 0.0, 0.0, 0.11]), atol=1e-6)
    with pytest.raises(ValueError, match="three 1-D tensors"):
        ppo_clip_loss(new, torch.zeros(3), adv, 10)


def test_ratio_stats():
    stats = ratio_stats(torch.tensor([1.0, 1.5, 0.5, 1.1]), clip=0.2)
    assert stats["tokens"] == 4 and stats["not_one"] == 3 and not stats["all_exactly_one"]
    assert stats["clipped_fraction"] == 0.5
    assert math.isclose(stats["abs_dev_max"], 0.5) and math.isclose(stats["abs_dev_mean"], (0.5 + 0.5 + 0.1) / 4,
                                                                     rel_tol=1e-6)
    ones = ratio_stats(torch.ones(7))
    assert ones["all_exactly_one"] and ones["not_one"] == 0 and ones["abs_dev_max"] == 0.0
    # one ulp off 1.0 is not exactly one
    assert not ratio_stats(torch.tensor([1.0, float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)))])
                           )["all_exactly_one"]


def test_decoupled_loss_by_hand():
    # Behaviour log-probs equal to the new ones: weights 1, the plain PPO-clip loss and gradient. Otherwise each
    # token's surrogate is scaled by exp(new - behaviour), truncated at the cap, and the weight carries no gradient.
    adv = torch.tensor([1.0, -2.0, 0.5])
    new = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    loss, ratio, weight = decoupled_ppo_loss(new, new.detach().clone(), adv, batch_tokens=4)
    plain, _ = ppo_clip_loss(new, new.detach().clone(), adv, batch_tokens=4)
    assert torch.equal(weight, torch.ones(3)) and torch.equal(ratio, torch.ones(3)) and loss.item() == plain.item()
    (g,) = torch.autograd.grad(loss, new)
    assert torch.allclose(g, -adv / 4)
    behaviour = torch.tensor([-1.0 - math.log(2.0), -2.0 + math.log(2.0), -0.5 - 10.0])
    loss, _, weight = decoupled_ppo_loss(new, behaviour, adv, batch_tokens=4, cap=5.0)
    assert torch.allclose(weight, torch.tensor([2.0, 0.5, 5.0]))
    (g,) = torch.autograd.grad(loss, new)
    assert torch.allclose(g, -weight * adv / 4) and math.isclose(loss.item(), -(weight * adv).sum().item() / 4,
                                                                rel_tol=1e-6)
    with pytest.raises(ValueError, match="three 1-D tensors"):
        decoupled_ppo_loss(new, behaviour[:2], adv, 4)
