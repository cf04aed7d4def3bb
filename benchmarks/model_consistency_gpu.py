"""Rollout vs training log-probs of a model built from the families' roots, on a GPU, at a realistic width.
Writes JSON (mismatching log-prob bits per seed, max |difference|, environment).

--model dense (default): the one-layer decoder (kernels/decoder.py), one sequence.
--model moe: a Qwen3-30B-A3B-shaped MoE decoder of --layers layers (kernels/moe_decoder.py: every family),
several sequences of different prompt and answer lengths, packed for training, decoded as one batch.

    tik-evo bench model --out results/model/consistency.json

Imports only torch/triton (+ kernels.decoder and the families), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch

import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
from tik_evo_bench.common import header  # noqa: E402
from tik_evo_kernels.decoder import FAMILIES, Shape, TinyDecoder
from tik_evo_kernels.files import add_arguments, impls_from_args
from tik_evo_kernels.moe_decoder import FAMILIES as MOE_FAMILIES
from tik_evo_kernels.moe_decoder import MoEDecoder, MoEShape
from tik_evo_kernels.peers import linear_grouped as cublas_grouped  # noqa: E402

# Prompt and answer lengths of the MoE run's sequences (not multiples of any block or page).
MOE_PROMPTS, MOE_ANSWERS = (517, 300, 129, 411), (33, 48, 21, 40)


def cublas_decode(impls: dict) -> dict:
    """A control: rollout's linear layers through cuBLAS (torch.matmul; the experts' grouped launches through
    torch._grouped_mm), as an inference engine's would be, while training keeps the batch-invariant kernel's full
    path; the log-probs are then expected to differ."""
    root = impls["linear"]

    def linear_decode(x, weight, bias, out, out32=None):
        y = torch.matmul(x, weight.t())
        out.copy_(y if bias is None else y + bias)

    return {**impls, "linear": SimpleNamespace(linear_full=root.linear_full, linear_decode=linear_decode,
                                               linear_grouped_full=root.linear_grouped_full,
                                               linear_grouped_decode=cublas_grouped)}


def moe_runs(args, impls) -> tuple[dict, list[dict]]:
    shape = MoEShape(vocab=151936, hidden=2048, layers=args.layers, q_heads=32, kv_heads=4, head_dim=128,
                     experts=128, top_k=8, intermediate=768, page_size=16,
                     max_pos=max(p + a for p, a in zip(MOE_PROMPTS, MOE_ANSWERS)))
    rows = []
    for seed in range(args.seeds):
        for temperature in (1.0, 0.7):
            m = MoEDecoder(shape, seed, "cuda", impls=impls, temperature=temperature,
                           grouped_experts=not args.per_expert)
            g = torch.Generator().manual_seed(100 + seed)
            seqs = [torch.randint(0, shape.vocab, (p + a,), generator=g).to("cuda", torch.int32)
                    for p, a in zip(MOE_PROMPTS, MOE_ANSWERS)]
            t0 = time.time()
            train = torch.cat(m.training_logprobs(seqs, list(MOE_PROMPTS)))
            t1 = time.time()
            rollout = torch.cat(m.rollout_logprobs(seqs, list(MOE_PROMPTS)))
            torch.cuda.synchronize()
            rows.append({"seed": seed, "temperature": temperature, "sequences": len(seqs),
                         "answer_tokens": int(train.numel()), "expert_rows": m.expert_rows,
                         "mismatching_logprobs": int((train.view(torch.int32) != rollout.view(torch.int32)).sum()),
                         "max_abs_diff": float((train - rollout).abs().max()),
                         "mean_logprob": float(train.mean()), "training_s": round(t1 - t0, 2),
                         "rollout_s": round(time.time() - t1, 2)})
            print(rows[-1], flush=True)
    return {**shape.__dict__, "prompts": MOE_PROMPTS, "answers": MOE_ANSWERS}, rows


def dense_runs(args, impls) -> tuple[dict, list[dict]]:
    shape = Shape(vocab=32768, hidden=2048, q_heads=16, kv_heads=4, head_dim=128, intermediate=4096,
                  max_pos=args.prompt + args.answer + 1)
    rows = []
    for seed in range(args.seeds):
        for temperature in (1.0, 0.7):
            m = TinyDecoder(shape, seed, "cuda", impls=impls, temperature=temperature)
            g = torch.Generator().manual_seed(100 + seed)
            toks = torch.randint(0, shape.vocab, (args.prompt + args.answer,), generator=g).to("cuda", torch.int32)
            train = m.training_logprobs(toks, args.prompt)
            rollout = m.rollout_logprobs(toks, args.prompt)
            torch.cuda.synchronize()
            rows.append({"seed": seed, "temperature": temperature, "answer_tokens": args.answer,
                         "mismatching_logprobs": int((train.view(torch.int32) != rollout.view(torch.int32)).sum()),
                         "max_abs_diff": float((train - rollout).abs().max())})
            print(rows[-1], flush=True)
    return shape.__dict__, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="model_consistency.json")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--model", choices=("dense", "moe"), default="dense")
    ap.add_argument("--layers", type=int, default=4, help="layers of the MoE model")
    ap.add_argument("--per-expert", action="store_true",
                    help="the MoE model's experts one launch per expert and projection (default: grouped launches, "
                         "linear_grouped_*)")
    ap.add_argument("--control", choices=("none", "cublas_decode"), default="none",
                    help="cublas_decode: rollout's linear layers through cuBLAS (a negative control)")
    ap.add_argument("--attention-set", default="",
                    help="attention as this named set (kernels/attention/bench.py) instead of its root; needs the "
                         "engine's packages (omegaconf)")
    add_arguments(ap, "used in the model instead of the family's root")
    args = ap.parse_args(argv)
    families = MOE_FAMILIES if args.model == "moe" else FAMILIES
    loaded = impls_from_args(args, families, args.attention_set)  # before the GPU: named on any machine
    if loaded is None:
        return 2
    impls, replaced = loaded
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (the CPU checks of the same model are tests/model/)")
        return 2
    if args.control == "cublas_decode":
        impls = cublas_decode(impls)
    if args.model == "moe":
        shape_info, rows = moe_runs(args, impls)
    else:
        shape_info, rows = dense_runs(args, impls)
    result = {**header(device=0),
              "model": args.model, "shape": shape_info,
              "prompt": args.prompt if args.model == "dense" else None, "attention_set": args.attention_set or "root",
              "control": args.control, "grouped_experts": not args.per_expert,
              "attention_knobs": getattr(impls["attention"], "KNOBS", {}), "runs": rows,
              "kernels": replaced,
              "all_bit_exact": all(r["mismatching_logprobs"] == 0 for r in rows)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("all bit-exact:", result["all_bit_exact"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
