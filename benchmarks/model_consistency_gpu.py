"""Rollout vs training log-probs of a one-layer decoder built from the families' roots, on a GPU, at a
realistic width. Writes JSON (mismatching log-prob bits per seed, max |difference|, environment).

    PYTHONPATH=$PWD python3 benchmarks/model_consistency_gpu.py --out results/model/consistency.json

Imports only torch/triton (+ kernels.decoder and the families), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import triton

from kernels.decoder import Shape, TinyDecoder, roots, with_sets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="model_consistency.json")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--answer", type=int, default=64)
    ap.add_argument("--attention-set", default="",
                    help="attention as this named set (kernels/attention/bench.py) instead of its root; needs the "
                         "engine's packages (omegaconf)")
    args = ap.parse_args(argv)
    impls = with_sets({"attention": args.attention_set}, "--attention-set") if args.attention_set else roots()
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
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "shape": shape.__dict__, "prompt": args.prompt, "attention_set": args.attention_set or "root",
              "attention_knobs": getattr(impls["attention"], "KNOBS", {}), "runs": rows,
              "all_bit_exact": all(r["mismatching_logprobs"] == 0 for r in rows)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("all bit-exact:", result["all_bit_exact"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
