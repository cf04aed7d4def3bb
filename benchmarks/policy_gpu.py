"""The policy update on the unified kernels (kernels/moe_decoder.py `policy_logprobs`, kernels/autograd.py), for the
dense and MoE models at Qwen3 widths:

1. bits: the differentiable forward's log-probs against the training forward's and the batched rollout's
   (prompts and answers as tik-evo bench model), elements whose bits differ;
2. gradients of sum(log-prob x advantage) for every parameter against autograd of the same model in torch with
   fp32 arithmetic (`TorchOps()`), relative L2, and the tokens whose experts the two forwards chose differently
   (a discrete choice: such tokens' expert gradients differ by design, not by error);
3. one policy step (forward + backward; 4 sequences of 2048 tokens, the last 1024 of each scored, as
   tik-evo bench model-speed) against the same model as a trainer runs it without tik-evo
   (`TorchOps(native=True)`: cuBLAS, SDPA, torch._grouped_mm for the experts, fp32 norms and softmax): GPU time
   (CUDA events, the two interleaved, median of --reps after two warm-up rounds) and peak memory.

Checks and steps run once per --matmul-backward mode: the linear layers' gradients from the kernel file's own
backward ("kernel") or from cuBLAS ("vendor"), `KernelOps`' two ways.

    tik-evo bench policy --out policy.json
    tik-evo bench policy --smoke --out x.json    # tiny shapes on the CPU (the interpreter): the code

Imports only torch/triton and the kernels, so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from tik_evo import checks  # noqa: E402
from tik_evo_kernels.attention import autograd as attention_autograd  # noqa: E402
from tik_evo_kernels.attention.autograd import packed_backward_path  # noqa: E402
from tik_evo_kernels.autograd import KernelOps, RecordingRouting, TorchOps  # noqa: E402
from tik_evo_kernels.files import add_arguments, impls_from_args  # noqa: E402
from tik_evo_kernels.measure import policy_backward as backward  # noqa: E402
from tik_evo_kernels.measure import policy_breakdown as breakdown  # noqa: E402
from tik_evo_kernels.measure import policy_step_times as step_times  # noqa: E402
from tik_evo_kernels.measure import run_label  # noqa: E402
from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder, MoEShape  # noqa: E402

MOE_PROMPTS, MOE_ANSWERS = (517, 300, 129, 411), (33, 48, 21, 40)  # tik-evo bench model's
SHAPES = {
    "qwen3-4b.dense": MoEShape(vocab=151936, hidden=2560, layers=4, q_heads=32, kv_heads=8, head_dim=128, experts=0,
                               intermediate=9728, max_pos=2048),
    "qwen3-30b-a3b.moe": MoEShape(vocab=151936, hidden=2048, layers=4, q_heads=32, kv_heads=4, head_dim=128,
                                  experts=128, top_k=8, intermediate=768, max_pos=2048),
}
STEP_LENS, STEP_PROMPTS = [2048] * 4, [1024] * 4
SMOKE = {"dense": MoEShape(experts=0, intermediate=96), "moe": MoEShape()}
SMOKE_LENS, SMOKE_PROMPTS = [9, 12, 7], [5, 8, 4]


def sequences(vocab: int, lens: list[int], device: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).to(device, torch.int32) for n in lens]


def bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> int:
    x, y = torch.cat(a).detach().contiguous(), torch.cat(b).detach().contiguous()
    return int((x.view(torch.int32) != y.view(torch.int32)).sum())


def policy_checks(m: MoEDecoder, seqs, prompts, device: str, modes: list[str]) -> dict:
    """Bits against training and rollout; each parameter's gradient against the fp32 torch model's, for each
    way of taking the linear layers' gradients (`KernelOps`' matmul_backward; the first one's key has no
    suffix)."""
    train = m.training_logprobs(seqs, prompts)
    rollout = m.rollout_logprobs(seqs, prompts)
    adv = torch.randn(sum(t.numel() for t in train), generator=torch.Generator().manual_seed(5)).to(device)
    ref = RecordingRouting(TorchOps())
    runs = {}
    for mode in modes:
        ours = RecordingRouting(KernelOps(m.k, matmul_backward=mode))
        runs[mode] = ours, backward(m, seqs, prompts, adv, ours), [p.grad.clone() for p in m.parameters()]
    backward(m, seqs, prompts, adv, ref)
    ours, lp, _ = runs[modes[0]]
    out = {"answer_tokens": int(torch.cat(train).numel()), "policy_vs_training_mismatches": bits(lp, train),
           "policy_vs_rollout_mismatches": bits(lp, rollout), "training_vs_rollout_mismatches": bits(train, rollout)}
    for i, (mode, (_, _, grads)) in enumerate(runs.items()):
        rel = [checks.rel_l2(a, p.grad) for a, p in zip(grads, m.parameters())]
        out["grad_rel_l2_vs_fp32_torch" + (f"_{mode}_matmul_bwd" if i else "")] = {
            "max": max(rel), "median": statistics.median(rel), "per_param": rel}
    out["tokens_routed_differently_vs_fp32_torch"] = sum(
        int((a.sort(-1).values != b.sort(-1).values).any(-1).sum()) for a, b in zip(ours.ids, ref.ids))
    out["token_layer_pairs_routed"] = sum(int(i.shape[0]) for i in ours.ids)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="policy.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", default="", help=f"comma-separated (default all): {', '.join(SHAPES)}; with "
                    f"--smoke: {', '.join(SMOKE)}")
    ap.add_argument("--no-step", action="store_true", help="bits and gradients only (no policy-step timing)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under the interpreter")
    ap.add_argument("--matmul-backward", default="vendor,kernel",
                    help="comma-separated ways to take the linear layers' gradients, each checked and timed: vendor "
                         "(cuBLAS through torch, KernelOps' default), kernel (the kernel file's backward); the first "
                         "is 'unified'")
    ap.add_argument("--attention-backward", choices=("sdpa_per_sequence", "varlen_flash"),
                    default=attention_autograd.PACKED_BACKWARD,
                    help="the packed attention's backward (kernels/attention/autograd.py PACKED_BACKWARD)")
    add_arguments(ap, "used in the model instead of the family's root")
    args = ap.parse_args(argv)
    attention_autograd.PACKED_BACKWARD = args.attention_backward
    loaded = impls_from_args(args, FAMILIES)  # before the GPU: a wrong argument is named on any machine
    if loaded is None:
        return 2
    impls, replaced = loaded
    modes = [m for m in args.matmul_backward.split(",") if m]
    if not modes or any(m not in ("kernel", "vendor") for m in modes):
        print(f"error: --matmul-backward {args.matmul_backward!r}: expected a comma-separated list of kernel, vendor")
        return 2
    if args.smoke:
        from tik_evo import interp

        interp.install()
        device, shapes = "cpu", SMOKE
    elif not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (--smoke runs its code on the CPU; tests/model/ has the checks)")
        return 2
    else:
        device, shapes = "cuda", SHAPES
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter smoke run)",
              "torch": torch.__version__, "triton": triton.__version__, "configs": {},
              "kernels": replaced}
    for name in [c for c in args.configs.split(",") if c] or list(shapes):
        if name not in shapes:
            raise SystemExit(f"--configs: unknown config {name!r} (known: {', '.join(shapes)})")
        shape = shapes[name]
        lens = SMOKE_LENS if args.smoke else [p + a for p, a in zip(MOE_PROMPTS, MOE_ANSWERS)]
        prompts = SMOKE_PROMPTS if args.smoke else list(MOE_PROMPTS)
        m = MoEDecoder(shape, 0, device, impls=impls)
        for p in m.parameters():
            p.requires_grad_(True)
        row = {"shape": shape.__dict__,
               # The modules the model holds for the replaced families (not the arguments): proof the files are used.
               "kernels_in_model": {f: m.k[f].__name__ for f in replaced},
               "checks": policy_checks(m, sequences(shape.vocab, lens, device, 100), prompts, device, modes)}
        c = row["checks"]
        print(f"{name}: {c['answer_tokens']} log-probs, policy vs training {c['policy_vs_training_mismatches']}, vs "
              f"rollout {c['policy_vs_rollout_mismatches']} differ; gradients vs fp32 torch: max rel "
              f"{c['grad_rel_l2_vs_fp32_torch']['max']:.3g}, median {c['grad_rel_l2_vs_fp32_torch']['median']:.3g}; "
              f"{c['tokens_routed_differently_vs_fp32_torch']} of {c['token_layer_pairs_routed']} token-layers routed "
              "differently", flush=True)
        for mode in modes[1:]:
            r = c[f"grad_rel_l2_vs_fp32_torch_{mode}_matmul_bwd"]
            print(f"{name}: gradients with the {mode} matmul backward vs fp32 torch: max rel {r['max']:.3g}, median "
                  f"{r['median']:.3g}", flush=True)
        if not args.no_step:
            step_lens, step_prompts = (SMOKE_LENS, SMOKE_PROMPTS) if args.smoke else (STEP_LENS, STEP_PROMPTS)
            row["step"] = step_times(m, sequences(shape.vocab, step_lens, device, 7), step_prompts,
                                     1 if args.smoke else args.reps, device, modes)
            for i, mode in enumerate(modes):
                row["step"]["breakdown" + ("" if i == 0 else f"_{mode}_matmul_bwd")] = breakdown(
                    m, sequences(shape.vocab, step_lens, device, 7), step_prompts, device, mode)
            st = row["step"]
            st["attention_backward"] = packed_backward_path(device)  # torch's varlen flash, or SDPA per sequence
            fams = st["breakdown"]["families"]
            print(f"{name}: kernel time of one step by family (ms): " + ", ".join(
                f"{k} {v['ms']:.2f}" for k, v in sorted(fams.items(), key=lambda kv: -kv[1]["ms"])) +
                f", other {st['breakdown']['other_ms']:.2f} (attention backward: {st['attention_backward']})",
                flush=True)
            for i, mode in enumerate(modes):
                label = run_label(i, mode)
                if label + "_over_torch" in st:
                    print(f"{name}: policy step ({mode} matmul backward) {st[label]['ms']:.1f} ms "
                          f"({st[label]['peak_extra_GB']:.1f} GB) against {st['torch']['ms']:.1f} ms "
                          f"({st['torch']['peak_extra_GB']:.1f} GB) for torch: {st[label + '_over_torch']:.3f}x",
                          flush=True)
        result["configs"][name] = row
        del m
        if device == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
