"""One GRPO step: the rollout samples from the weights the last update wrote (staleness 0) or from those of
`staleness` updates ago (a rollout engine behind by as many weight syncs, as in asynchronous RL systems).

    other      (stale mode) the rollout model gets the behaviour weights
    rollout    prompts (each `group` times) -> completions with temperature, log-probs recorded at sampling
    other      reward per completion -> group-normalised advantages -> packed micro-batches
    recompute  (arm A only) old log-probs by a training forward of each micro-batch, no gradient, with the weights
               that sampled the batch
    update     per micro-batch: training forward with autograd -> PPO-clip loss (stale mode: the decoupled
               objective, loss.py) -> backward; then one AdamW step on fp32 masters, written back into the
               model's bf16 weights in place

Which log-probs are reused. Synchronous: the policy that sampled a batch is the one being updated, so the old
log-probs are the current policy's log-probs of the sampled tokens. Arm B takes them from the rollout (recorded
at sampling, on the kernels' decode path): the training forward reproduces them bit for bit, so every ratio of the
(single) update is exactly 1.0, and the recompute pass is skipped. Arm A recomputes them with a training forward
(its rollout's differ in some bits); arm C reuses its rollout's anyway. Stale: the rollout's log-probs are the
behaviour policy's, which the decoupled objective needs for its importance weights; arm B reuses them (they equal a
training forward of the behaviour weights bit for bit), arm A recomputes them with those weights, arm C reuses its
mismatched ones. The proximal policy's log-probs are the update's own forward, detached (one optimizer step per
batch), so no arm pays a pass for them; with several optimizer steps per batch every arm would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tik_evo.rl.advantages import group_advantages, token_advantages
from tik_evo.rl.arms import Arm, arm_ops
from tik_evo.rl.loss import CLIP, decoupled_ppo_loss, ppo_clip_loss, ratio_stats
from tik_evo.rl.optim import MasterAdamW, PhaseTimer
from tik_evo.rl.rollout import Rollout, Sampler, generate
from tik_evo.rl.task import EOS, SYMBOLS, AdditionTask, reward

PHASES = ("rollout", "recompute", "update", "other")


DECODE = ("graphs", "eager", "padded")


@dataclass
class GRPOConfig:
    prompts: int = 4  # distinct prompts per step
    group: int = 2  # completions sampled per prompt
    max_new: int = 8  # longest completion
    micro_batch: int = 4  # sequences per packed training forward
    lr: float = 1e-5
    weight_decay: float = 0.0
    clip: float = CLIP
    max_grad_norm: float | None = 1.0
    seed: int = 0
    # decode steps: "graphs" (CUDA graphs over padded batch buckets on a GPU, as serving engines run them; eager
    # elsewhere), "eager" (every step launched, the batch exactly the live sequences), "padded" (eager, padded as
    # for graphs: what a graph replays, checkable on the CPU)
    decode: str = "graphs"
    # a share of the vocabulary (its last ids) that also ends a completion, besides EOS: throughput runs of
    # random-weight models, which almost never sample EOS out of a large vocabulary, then get completions of
    # different lengths, as trained models give (their rewards mean nothing)
    end_fraction: float = 0.0
    # rollouts sampled by the weights of `staleness` updates ago (0: the latest; 1-2: as an asynchronous system
    # with a rollout engine one or two weight syncs behind), trained with PPO's decoupled objective (loss.py)
    staleness: int = 0


class GRPOTrainer:
    """The loop of one arm on one model (`kernels/moe_decoder.py` MoEDecoder; its temperature is the sampling
    temperature). `impls` of the model decide the kernels; `ops` overrides the arm's (rollout ops, training ops);
    `reward_fn(problem, completion token list) -> float` the task's reward (`task.reward` by default)."""

    def __init__(self, model, task: AdditionTask, arm: Arm, cfg: GRPOConfig, ops: tuple | None = None,
                 reward_fn=reward):
        self.m, self.task, self.arm, self.cfg, self.reward_fn = model, task, arm, cfg, reward_fn
        dev = model.device
        if ops is None:
            self.rollout_ops, self.train_ops, self.notes = arm_ops(arm, model, dev)
        else:
            (self.rollout_ops, self.train_ops), self.notes = ops, ["ops given by the caller"]
        self.params = model.parameters()
        self.opt = MasterAdamW(self.params, cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
        self.problems_gen = torch.Generator().manual_seed(cfg.seed)
        self.sample_gen = torch.Generator(dev).manual_seed(cfg.seed + 1)
        if not 0.0 <= cfg.end_fraction < 1.0:
            raise ValueError(f"end_fraction {cfg.end_fraction}: expected a share of the vocabulary in [0, 1)")
        vocab = model.s.vocab  # the extra end ids lie past the task's symbols: an answer never ends by itself
        self.ends = frozenset([EOS, *range(max(len(SYMBOLS), vocab - int(vocab * cfg.end_fraction)), vocab)])
        if cfg.decode not in DECODE:
            raise ValueError(f"decode {cfg.decode!r}: expected one of {', '.join(DECODE)}")
        if cfg.staleness < 0:
            raise ValueError(f"staleness {cfg.staleness}: expected 0 or more updates")
        # Stale rollouts: a second copy of the model, the rollout engine's, given the weights of `staleness`
        # updates ago before each rollout (in place, so its decode graphs stay valid).
        self.behaviour = model if not cfg.staleness else type(model)(
            model.s, cfg.seed, dev, impls=model.k, temperature=model.temperature,
            grouped_experts=getattr(model, "grouped", True))
        # the weights before the next update and after each of the `staleness` updates before it, oldest first:
        # the oldest samples the next rollout
        self.snapshots: list[list[torch.Tensor]] = []
        # one cache and one set of decode graphs for the whole run, as an engine keeps them
        self.sampler = Sampler(self.behaviour, cfg.prompts * cfg.group, model.s.max_pos, self.rollout_ops,
                               graphs=cfg.decode == "graphs", pad=cfg.decode == "padded")
        self.steps = 0
        self.last_rollout: Rollout | None = None  # what the latest step sampled (tests and reports read it)

    # -- the phases ------------------------------------------------------------------------------------------
    def rollout(self) -> tuple[list, Rollout]:
        cfg = self.cfg
        problems = [p for p in self.task.sample(cfg.prompts, self.problems_gen) for _ in range(cfg.group)]
        prompts = [torch.tensor(self.task.prompt(p), dtype=torch.int32, device=self.m.device) for p in problems]
        return problems, generate(self.behaviour, prompts, cfg.max_new, self.sample_gen, ops=self.rollout_ops,
                                  eos=self.ends, sampler=self.sampler)

    def sync(self) -> None:
        """Stale mode: the rollout model gets the weights of `staleness` updates ago (the oldest kept; early in a
        run, the weights it started from)."""
        if not self.cfg.staleness:
            return
        if not self.snapshots:  # the first step: the weights GRPO starts from (after any supervised warm-up)
            self.snapshots.append([p.detach().clone() for p in self.params])
        with torch.no_grad():
            for dst, src in zip(self.behaviour.parameters(), self.snapshots[0]):
                dst.copy_(src)

    def snapshot(self) -> None:
        """After an update: keep its weights for the rollout `staleness` steps later."""
        if self.cfg.staleness:
            self.snapshots.append([p.detach().clone() for p in self.params])
            del self.snapshots[: max(0, len(self.snapshots) - self.cfg.staleness - 1)]

    def micro_batches(self, n: int) -> list[range]:
        return [range(lo, min(lo + self.cfg.micro_batch, n)) for lo in range(0, n, self.cfg.micro_batch)]

    def logprobs(self, roll: Rollout, mb: range, model=None) -> torch.Tensor:
        """The training forward of one packed micro-batch (on `model`, default the policy being updated): its
        completions' log-probs, concatenated."""
        seqs, plens = roll.seqs, roll.prompt_lens
        return torch.cat((model or self.m).policy_logprobs([seqs[i] for i in mb], [plens[i] for i in mb],
                                                           ops=self.train_ops))

    def recompute(self, roll: Rollout, mbs: list[range]) -> list[torch.Tensor]:
        """The old log-probs by a training forward of the policy that sampled the batch (the rollout model's
        weights: the current ones, or with staleness the behaviour weights)."""
        with torch.no_grad():
            return [self.logprobs(roll, mb, self.behaviour) for mb in mbs]

    def update(self, roll: Rollout, mbs: list[range], old: list[torch.Tensor], adv: torch.Tensor) -> dict:
        n_tokens = sum(roll.lengths)
        loss_total, ratios, weights = 0.0, [], []
        for p in self.params:
            p.requires_grad_(True)
        try:
            for mb, old_mb, adv_mb in zip(mbs, old, adv):
                new = self.logprobs(roll, mb)
                if self.cfg.staleness:
                    loss, ratio, weight = decoupled_ppo_loss(new, old_mb, adv_mb, n_tokens, self.cfg.clip)
                    weights.append(weight)
                else:
                    loss, ratio = ppo_clip_loss(new, old_mb, adv_mb, n_tokens, self.cfg.clip)
                loss.backward()
                loss_total += float(loss.detach())
                ratios.append(ratio)
        finally:
            for p in self.params:
                p.requires_grad_(False)
        grad_norm = self.opt.step()
        self.snapshot()
        return {"loss": loss_total, "grad_norm": grad_norm, "ratios": ratios, "weights": weights}

    # -- one step --------------------------------------------------------------------------------------------
    def step(self) -> dict:
        """One GRPO step; -> its record (per-phase seconds, tokens, rewards, loss, ratio statistics)."""
        cfg, cuda = self.cfg, torch.device(self.m.device).type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated() if cuda else 0
        timer = PhaseTimer(self.m.device)
        with timer("other"):
            self.sync()
        with timer("rollout"):
            problems, roll = self.rollout()
        with timer("other"):
            rewards = torch.tensor([self.reward_fn(p, c.tolist()) for p, c in zip(problems, roll.completions)])
            adv = token_advantages(group_advantages(rewards, cfg.group), roll.lengths).to(self.m.device)
            mbs = self.micro_batches(len(problems))
            adv_mbs = list(adv.split([sum(roll.lengths[i] for i in mb) for mb in mbs]))
        with timer("recompute"):
            old = self.recompute(roll, mbs) if self.arm.recompute else \
                [torch.cat([roll.logprobs[i] for i in mb]) for mb in mbs]
        with timer("update"):
            upd = self.update(roll, mbs, old, adv_mbs)
        self.steps += 1
        self.last_rollout = roll
        total = sum(timer.times.values())
        generated = sum(roll.lengths)
        return {
            "step": self.steps, "arm": self.arm.name,
            "times_s": {p: timer.times.get(p, 0.0) for p in PHASES}, "total_s": total,
            "tokens": {"prompt": sum(roll.prompt_lens), "generated": generated},
            "generated_tokens_per_s": generated / total if total else None,
            "tokens_per_s": (generated + sum(roll.prompt_lens)) / total if total else None,
            "decode_steps": roll.decode_steps,
            "decode": {"mode": cfg.decode, "graphs": self.sampler.steps.graphs, **self.sampler.steps.stats},
            "lengths": {"min": min(roll.lengths), "max": max(roll.lengths), "mean": generated / len(roll.lengths)},
            "reward_mean": float(rewards.mean()), "rewards": rewards.tolist(),
            "loss": upd["loss"], "grad_norm": upd["grad_norm"],
            "ratio_first_micro_batch": ratio_stats(upd["ratios"][0], cfg.clip),
            "ratio_all": ratio_stats(torch.cat(upd["ratios"]), cfg.clip),
            "staleness": cfg.staleness,
            # stale rollouts: the behaviour importance weights exp(proximal - behaviour) of the first micro-batch
            "behaviour_weight_first_micro_batch": ratio_stats(upd["weights"][0], cfg.clip) if upd["weights"] else None,
            "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "resident_mem_bytes": resident if cuda else None,
        }

    # -- the supervised warm-up ------------------------------------------------------------------------------
    def supervised_step(self) -> float:
        """One step of teacher-forced cross-entropy on correct completions (the warm-up before GRPO, so a small
        model earns rewards at all): -> the mean token loss. Draws from the same problem stream as `step`."""
        problems = self.task.sample(self.cfg.prompts * self.cfg.group, self.problems_gen)
        dev = self.m.device
        prompts = [torch.tensor(self.task.prompt(p), dtype=torch.int32, device=dev) for p in problems]
        targets = [torch.tensor(self.task.target(p), dtype=torch.int32, device=dev) for p in problems]
        roll = Rollout(prompts, targets, [torch.zeros(len(t), device=dev) for t in targets], 0)
        n_tokens, total = sum(roll.lengths), 0.0
        for p in self.params:
            p.requires_grad_(True)
        try:
            for mb in self.micro_batches(len(problems)):
                loss = -self.logprobs(roll, mb).sum() / n_tokens
                loss.backward()
                total += float(loss.detach())
        finally:
            for p in self.params:
                p.requires_grad_(False)
        self.opt.step()
        return total
