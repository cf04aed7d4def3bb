"""A small GRPO trainer (issue 44): the loop that shows what the unified kernels are for.

    task.py        multi-digit addition: a 14-symbol tokenizer, problems generated in the repository, the reward
    rollout.py     prompts -> sampled completions (prefill + decode, shrinking batch), log-probs recorded at sampling
    advantages.py  group-normalised GRPO advantages
    loss.py        PPO-clip over packed micro-batches, token-mean; ratio statistics
    optim.py       AdamW on fp32 masters of the bf16 weights; the per-phase timer
    trainer.py     one synchronous step: rollout -> reward -> advantages -> (recompute) -> update
    arms.py        A (torch baseline + recompute), B (unified kernels, rollout log-probs reused), C (A, no recompute)
    vendor.py      arm A's GPU stack: cuBLAS, flash attention, Liger-Kernel where it imports and passes a probe
    shapes.py      the model shapes; bench.py the runner (`tik-evo bench rl`); report.py its summary

Which log-probs are reused (synchronous mode, staleness 0): the batch is sampled by the weights being updated,
so the "old" log-probs of PPO are the current policy's. Arm B reuses the rollout's (the training forward gives
the same bits, every ratio of the update is exactly 1.0); arm A recomputes them by a training forward; arm C reuses
its rollout's although they differ from its trainer's in some bits. See trainer.py for the asynchronous case.
"""
