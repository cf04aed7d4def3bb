"""The GRPO benchmark (issue 44): the arms of `tik_evo.rl.arms` run the same loop on the same model, in one process,
their steps interleaved (A, B, C, A, B, C, ...) or one arm after another (`--order sequential`, for models whose
three copies and optimizer states do not fit together). Writes a JSON record (date, device, versions, every
step's per-phase seconds, tokens, peak memory, rewards and PPO ratio statistics) and a markdown summary beside it.

    tik-evo bench rl --arms A,B,C --steps 20 --model qwen3-0.6b-shape --prompts 64 --group 8 \\
        --prompt-len 256 --max-new 1024 --out results/rl/h100_grpo_0.6b.json
    tik-evo bench rl --model small --sft-steps 300 --steps 200 --seed 0 --out runs/rl_parity_s0.json

Without a GPU it runs on the CPU, the kernels under Triton's interpreter: the loop's code paths, no speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tik-evo bench rl", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="A,B,C", help="comma-separated arms (A: baseline + recompute, B: unified "
                    "kernels, no recompute, C: baseline without recompute)")
    ap.add_argument("--model", default="qwen3-0.6b-shape", help="a shape of tik_evo/rl/shapes.py")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the shape's)")
    ap.add_argument("--steps", type=int, default=5, help="GRPO steps per arm")
    ap.add_argument("--skip", type=int, default=1, help="steps per arm left out of the times (compilation)")
    ap.add_argument("--sft-steps", type=int, default=0, help="supervised warm-up steps per arm before GRPO")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts per step")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt")
    ap.add_argument("--digits", type=int, default=3, help="digits of each operand")
    ap.add_argument("--prompt-len", type=int, default=0, help="left-pad prompts to this many tokens (0: none)")
    ap.add_argument("--max-new", type=int, default=None, help="longest answer (default: a correct answer's length)")
    ap.add_argument("--decode", choices=("graphs", "eager", "padded"), default="graphs",
                    help="decode steps: CUDA graphs over padded batch buckets (a GPU), eager, or padded eager")
    ap.add_argument("--staleness", type=int, default=0,
                    help="rollouts from the weights of this many updates ago (decoupled PPO objective)")
    ap.add_argument("--end-fraction", type=float, default=0.0,
                    help="share of the vocabulary that also ends a completion (random-weight throughput runs)")
    ap.add_argument("--micro-batch", type=int, default=8, help="sequences per packed training forward")
    ap.add_argument("--packed-backward", choices=("auto", "varlen_flash", "sdpa_per_sequence"), default="auto",
                    help="arm B's packed attention backward (kernels/attention/autograd.py PACKED_BACKWARD; auto: "
                         "varlen flash on a GPU)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="FAMILY=NAME",
                    help="arm B's kernel for FAMILY as that named knob set (repeatable), e.g. attention=hopper")
    ap.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, one more step of each arm under torch.profiler (not in the times): "
                         "wall against kernel time, the top kernels and host ops")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda where available)")
    ap.add_argument("--out", required=True, help="the JSON record; the markdown summary is written beside it")
    return ap.parse_args(argv)


def versions() -> dict:
    import torch
    import triton

    try:
        from importlib.metadata import version
        liger = version("liger-kernel")
    except Exception:  # noqa: BLE001 - not installed
        liger = None
    return {"torch": torch.__version__, "triton": triton.__version__, "liger": liger,
            "cuda": torch.version.cuda}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # the kernels under the interpreter, with the exact-dot fix (before Triton compiles any)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from tik_evo import interp
        interp.install()
    from tik_evo.config import ConfigError
    from tik_evo.rl.arms import parse_arms
    from tik_evo.rl.report import markdown, summarize
    from tik_evo.rl.shapes import shape
    from tik_evo.rl.task import AdditionTask
    from tik_evo.rl.trainer import GRPOConfig, GRPOTrainer
    from tik_evo_kernels.attention import autograd as attention_autograd
    from tik_evo_kernels.decoder import with_sets
    from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder

    attention_autograd.PACKED_BACKWARD = args.packed_backward

    try:
        arms = parse_arms(args.arms)
        sets = dict(s.split("=", 1) for s in args.set)
        task = AdditionTask(digits=args.digits, prompt_len=args.prompt_len)
        max_new = args.max_new or task.max_answer
        prompt_tokens = max(args.prompt_len, 2 * args.digits + 2)
        # room for the longest sample and, for the warm-up, the longest correct answer
        model_shape = shape(args.model, prompt_tokens + max(max_new, task.max_answer), args.layers)
        impls = with_sets(sets, "--set", FAMILIES)
    except (ValueError, ConfigError) as e:
        print(f"error: {e}")
        return 2
    if model_shape.vocab < 14:
        print(f"error: {args.model} has {model_shape.vocab} tokens, fewer than the task's 14")
        return 2
    if args.staleness < 0:
        print(f"error: --staleness {args.staleness}: 0 or more updates")
        return 2
    if not 0.0 <= args.end_fraction < 1.0:
        print(f"error: --end-fraction {args.end_fraction}: a share of the vocabulary in [0, 1)")
        return 2
    cfg = GRPOConfig(prompts=args.prompts, group=args.group, max_new=max_new, micro_batch=args.micro_batch,
                     lr=args.lr, seed=args.seed, decode=args.decode, end_fraction=args.end_fraction,
                     staleness=args.staleness)

    def build(arm):
        m = MoEDecoder(model_shape, args.seed, device, impls=impls if arm.kernels else None,
                       temperature=args.temperature)
        return GRPOTrainer(m, task, arm, cfg)

    record = {"kind": "rl_grpo", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
              "timed": device == "cuda", **versions(), "command": [sys.executable, "-m", "tik_evo.rl.bench",
                                                                   *(argv if argv is not None else sys.argv[1:])],
              "model": args.model, "shape": asdict(model_shape), "config": asdict(cfg), "order": args.order,
              "temperature": args.temperature, "sets": sets,
              "task": {"name": "addition", "digits": args.digits, "prompt_tokens": prompt_tokens},
              "arms": {a.name: {"doc": a.doc, "notes": [], "sft_loss": [], "steps": []} for a in arms}}

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(final: bool) -> None:
        """The record as it stands (rewritten after every step, so a run cut short keeps what it measured)."""
        record["partial"] = not final
        record["summary"] = summarize(record["arms"], min(args.skip, max(args.steps - 1, 0)))
        out.write_text(json.dumps(record, indent=1) + "\n")

    def run(trainer, n_steps: int) -> None:
        rec = record["arms"][trainer.arm.name]
        for _ in range(n_steps):
            step = trainer.step()
            rec["steps"].append(step)
            save(False)
            ratio = step["ratio_first_micro_batch"]
            print(f"{trainer.arm.name} step {step['step']}: {step['total_s']:.3f} s "
                  f"(rollout {step['times_s']['rollout']:.3f}, recompute {step['times_s']['recompute']:.3f}, "
                  f"update {step['times_s']['update']:.3f}), reward {step['reward_mean']:.3f}, "
                  f"ratios {'exactly 1.0' if ratio['all_exactly_one'] else str(ratio['not_one']) + ' not 1'}",
                  flush=True)

    def start(arm):
        t = build(arm)
        rec = record["arms"][arm.name]
        rec["notes"] = list(t.notes)
        t0 = time.perf_counter()
        rec["sft_loss"] = [t.supervised_step() for _ in range(args.sft_steps)]
        rec["sft_s"] = time.perf_counter() - t0
        return t

    def profiled(trainer) -> None:
        if args.profile:
            from tik_evo.profiling import profile_call

            record["arms"][trainer.arm.name]["profile"] = profile_call(trainer.step, device)
            save(False)

    if args.order == "interleaved":
        trainers = [start(a) for a in arms]
        for _ in range(args.steps):
            for t in trainers:
                run(t, 1)
        for t in trainers:
            profiled(t)
    else:
        for a in arms:
            t = start(a)
            run(t, args.steps)
            profiled(t)
            del t
            if device == "cuda":
                torch.cuda.empty_cache()
    record["packed_backward"] = {"setting": args.packed_backward,
                                 "ran": attention_autograd.packed_backward_path(device)}
    save(True)
    out.with_suffix(".md").write_text(markdown(record))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
