"""The GRPO loop end to end at tiny sizes under the interpreter (tik_evo/rl): arm B's PPO ratios are exactly 1.0
in every bit, before and after an update (so the rollout samples from the updated weights and its recorded
log-probs are the training forward's); a mismatched decode path makes them differ; arm A recomputes the old
log-probs and arm C does not; a reseeded run reproduces its first step exactly."""

from dataclasses import replace

import pytest
import torch

from tik_evo.rl.arms import ARMS, mismatched_decode, parse_arms
from tik_evo.rl.shapes import shape
from tik_evo.rl.task import EOS, AdditionTask
from tik_evo.rl.trainer import GRPOConfig, GRPOTrainer
from tik_evo_kernels.decoder import roots
from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder

# One dense layer and a 16-token vocabulary (the task's 14 symbols and 2 more): EOS is likely enough that
# sequences finish at different steps.
SHAPE = shape("tiny", max_pos=32)
TASK = AdditionTask(digits=1)
CFG = GRPOConfig(prompts=2, group=2, max_new=4, micro_batch=3, lr=1e-2, seed=1)


def varied_reward(problem, completion):
    """A reward that varies between samples of a random model (the task's is almost always 0 there), so the
    advantages, the gradient and the update are not zero."""
    return float(sum(completion))


def trainer(arm="B", impls=None, seed=0, cfg=CFG):
    return GRPOTrainer(MoEDecoder(SHAPE, seed, "cpu", impls=impls), TASK, ARMS[arm], cfg, reward_fn=varied_reward)


def snapshot(t: GRPOTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.params]


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def test_arm_b_ratios_are_exactly_one_and_a_reseeded_run_reproduces_its_first_step():
    # One test, not a module fixture: pytest-xdist would run a shared fixture once per worker.
    t = trainer("B")
    weights, records, rollouts = [snapshot(t)], [], []
    for _ in range(2):
        records.append(t.step())
        rollouts.append(t.last_rollout)
        weights.append(snapshot(t))

    first = rollouts[0]
    assert len(set(first.lengths)) > 1 and max(first.lengths) == CFG.max_new  # the batch shrank as sequences ended
    assert all(int(c[-1]) == EOS for c in first.completions if len(c) < CFG.max_new)
    for rec, roll in zip(records, rollouts):
        assert rec["arm"] == "B"
        for key in ("ratio_first_micro_batch", "ratio_all"):
            assert rec[key]["all_exactly_one"] and rec[key]["not_one"] == 0 and rec[key]["abs_dev_max"] == 0.0, key
        assert rec["ratio_all"]["tokens"] == rec["tokens"]["generated"] == sum(roll.lengths)
        assert rec["ratio_first_micro_batch"]["tokens"] == sum(roll.lengths[:CFG.micro_batch])
        assert rec["grad_norm"] > 0 and rec["loss"] != 0
    # The update changed the weights in place, and the second rollout sampled from them: its log-probs equal a
    # training forward on the weights after step 1 (its ratios of 1.0 above, and directly here).
    assert any(not torch.equal(a, b) for a, b in zip(weights[0], weights[1]))
    assert any(not torch.equal(a, b) for a, b in zip(weights[1], weights[2]))
    m = MoEDecoder(SHAPE, 0, "cpu")
    with torch.no_grad():
        for p, w in zip(m.parameters(), weights[1]):
            p.copy_(w)
    train = m.training_logprobs(rollouts[1].seqs, rollouts[1].prompt_lens)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(train, rollouts[1].logprobs))

    # Reseeded (same model seed, same trainer seed), its decode steps padded to batch buckets as CUDA graphs replay
    # them (finished sequences' rows fill the bucket): the first step again, bit for bit.
    t = trainer("B", cfg=replace(CFG, decode="padded"))
    rec = t.step()
    assert rec["decode"]["padded_rows"] > 0 and records[0]["decode"]["padded_rows"] == 0
    keep = ("rewards", "loss", "grad_norm", "tokens", "lengths", "decode_steps", "ratio_all")
    assert {k: rec[k] for k in keep} == {k: records[0][k] for k in keep}
    assert all(torch.equal(a, b) for a, b in zip(t.last_rollout.completions, rollouts[0].completions))
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(t.last_rollout.logprobs, rollouts[0].logprobs))
    assert all(torch.equal(a, b) for a, b in zip(snapshot(t), weights[1]))


def test_a_mismatched_decode_path_breaks_the_ratios():
    t = trainer("B", impls=mismatched_decode(roots(FAMILIES)))
    rec = t.step()
    lengths = t.last_rollout.lengths
    assert max(lengths) > 1  # decoded tokens exist (a completion's first token comes from the prefill)
    assert not rec["ratio_all"]["all_exactly_one"] and rec["ratio_all"]["not_one"] > 0
    assert rec["ratio_all"]["abs_dev_max"] > 0


def test_arm_a_recomputes_and_arm_c_reuses_the_rollouts_logprobs(monkeypatch):
    calls = []
    real = GRPOTrainer.recompute
    monkeypatch.setattr(GRPOTrainer, "recompute", lambda self, *a: calls.append(self.arm.name) or real(self, *a))
    recs = {arm: [trainer(arm).step() for _ in range(2)] for arm in ("A", "C")}
    assert calls == ["A", "A"]
    for arm, rs in recs.items():
        for rec in rs:
            assert rec["arm"] == arm and rec["grad_norm"] > 0
            assert set(rec["times_s"]) == {"rollout", "recompute", "update", "other"}
    # A's old log-probs are a training forward like its update's, so on the CPU its ratios are exactly 1.0.
    assert all(r["ratio_all"]["all_exactly_one"] for r in recs["A"])
    assert [a.name for a in parse_arms("A, C")] == ["A", "C"]
    # Extra end tokens (throughput runs of random models): the vocabulary's last ids past the task's symbols.
    t = trainer("A", cfg=replace(CFG, end_fraction=0.25))
    assert t.ends == {EOS, 14, 15}
    t.step()
    last = [int(c[-1]) for c in t.last_rollout.completions if len(c) < CFG.max_new]
    assert last and set(last) <= t.ends and set(last) - {EOS}  # some ended on an extra end token
    with pytest.raises(ValueError, match="subset of A, B, C"):
        parse_arms("A,D")


def test_stale_rollouts_reuse_the_behaviour_log_probs_bit_for_bit():
    # Staleness 1: the second step's batch is sampled by the weights before the first update. Arm B's recorded
    # log-probs equal a training forward of those behaviour weights in every bit (so the decoupled objective's
    # importance weights need no recompute pass), while the policy being updated has moved on.
    t = trainer("B", cfg=replace(CFG, staleness=1))
    start = snapshot(t)
    first = t.step()
    assert first["staleness"] == 1 and first["behaviour_weight_first_micro_batch"]["all_exactly_one"]
    second = t.step()
    assert second["ratio_first_micro_batch"]["all_exactly_one"]  # one optimizer step: proximal = current
    assert all(torch.equal(a, b) for a, b in zip(t.behaviour.parameters(), start))  # sampled by the old weights
    roll = t.last_rollout
    with torch.no_grad():
        behaviour = t.behaviour.training_logprobs(roll.seqs, roll.prompt_lens)
        current = t.m.training_logprobs(roll.seqs, roll.prompt_lens)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(behaviour, roll.logprobs))
    assert any(not torch.equal(a, b) for a, b in zip(current, roll.logprobs))
    assert not second["behaviour_weight_first_micro_batch"]["all_exactly_one"]
