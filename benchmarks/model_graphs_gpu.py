"""Rollout from CUDA graphs, as inference engines run it: every family call of a model's rollout (the packed
prefill and each decode step) runs eagerly, is put back, is captured in a CUDA graph and replayed, and the
model goes on from the replay's outputs. Each replay must write the eager call's bits, and the rollout's
log-probs must still equal the (eager) training forward's bit for bit. Writes JSON: per family and path, calls,
outputs written, elements that differ, capture failures; mismatching log-probs per model.

    tik-evo bench model-graphs --out model_graphs.json

Imports only torch/triton (+ the kernels), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tik_evo.graph_replay import graph_rollout, mismatches  # noqa: E402
from tik_evo_bench.common import header  # noqa: E402
from tik_evo_bench.model_consistency_gpu import MOE_ANSWERS, MOE_PROMPTS  # noqa: E402
from tik_evo_kernels.files import add_arguments, impls_from_args  # noqa: E402
from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder, MoEShape  # noqa: E402

WIDTHS = {  # four layers at the widths of the models named
    "qwen3-4b.dense": dict(vocab=151936, hidden=2560, layers=4, q_heads=32, kv_heads=8, head_dim=128, experts=0,
                           intermediate=9728),
    "qwen3-30b-a3b.moe": dict(vocab=151936, hidden=2048, layers=4, q_heads=32, kv_heads=4, head_dim=128,
                              experts=128, top_k=8, intermediate=768),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(WIDTHS), help=f"comma-separated, of {','.join(WIDTHS)}")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--out", default="model_graphs.json")
    add_arguments(ap, "used in the model instead of the family's root")
    args = ap.parse_args(argv)
    loaded = impls_from_args(args, FAMILIES)  # before the GPU: a wrong argument is named on any machine
    if loaded is None:
        return 2
    impls, replaced = loaded
    if not torch.cuda.is_available():
        print("error: replaying kernels from CUDA graphs needs a CUDA GPU (tests/model/test_graph_replay.py checks the "
              "harness on the CPU)")
        return 2
    names = args.models.split(",")
    if bad := [n for n in names if n not in WIDTHS]:
        ap.error(f"--models: unknown {bad}; choose from {list(WIDTHS)}")
    lens = [p + a for p, a in zip(MOE_PROMPTS, MOE_ANSWERS)]
    out = {**header(),
           "prompts": list(MOE_PROMPTS), "lens": lens, "runs": [],
           "kernels": replaced}
    ok = True
    for name in names:
        shape = MoEShape(**WIDTHS[name], max_pos=max(lens))
        for seed in range(args.seeds):
            g = torch.Generator().manual_seed(seed)
            seqs = [torch.randint(0, shape.vocab, (n,), generator=g).to("cuda", torch.int32) for n in lens]
            m = MoEDecoder(shape, seed, "cuda", impls=impls)
            train = m.training_logprobs(seqs, list(MOE_PROMPTS))
            t0 = time.time()
            roll, tally = graph_rollout(m, seqs, list(MOE_PROMPTS))
            row = {"model": name, "seed": seed, "answer_tokens": sum(x.numel() for x in train),
                   "mismatching_logprobs": mismatches(roll, train), "wall_s": round(time.time() - t0, 1),
                   "families": tally}
            row["replays_equal_eager"] = all(t["differ"] == 0 and t["capture_failures"] == 0 for t in tally.values())
            ok &= row["replays_equal_eager"] and row["mismatching_logprobs"] == 0
            out["runs"].append(row)
            print(f"{name} seed {seed}: {row['mismatching_logprobs']} of {row['answer_tokens']} log-probs differ "
                  f"from training; replays equal eager: {row['replays_equal_eager']} ({row['wall_s']} s)", flush=True)
            for key, t in tally.items():
                print(f"  {key:24s} calls {t['calls']:5d}  outputs written {t['written']:5d}  differing elements "
                      f"{t['differ']}  capture failures {t['capture_failures']} {t.get('first_failure', '')}")
    out["all_equal"] = ok
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"all equal: {ok}; json {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
