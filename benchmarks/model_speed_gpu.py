"""Model-level cost of the unified kernels: the training forward (packed sequences -> answer log-probs) of
kernels/moe_decoder.py with every family's root against the same model on the kernels a trainer uses without
tik-evo (kernels/peers.py: cuBLAS, SDPA, torch ops). Same weights, same tokens; GPU time per forward
(CUDA events; the models' forwards interleaved, median of --reps after two warm-up rounds) and peak memory.
Writes JSON.

    tik-evo bench model-speed --out model_speed.json

Imports only torch/triton (+ the kernels and tik_evo_kernels.peers), so it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tik_evo import launch  # noqa: E402
from tik_evo_bench.common import header  # noqa: E402
from tik_evo_kernels.decoder import roots  # noqa: E402
from tik_evo_kernels.files import add_arguments, impls_from_args  # noqa: E402
from tik_evo_kernels.measure import decode_step_us  # noqa: E402
from tik_evo_kernels.moe_decoder import FAMILIES, MoEDecoder, MoEShape, hooked  # noqa: E402
from tik_evo_kernels.peers import torch_impls  # noqa: E402

CONFIGS = {
    # Qwen3-4B widths (dense), four layers; four sequences of 2048 tokens, the last 1024 of each scored.
    "qwen3-4b.dense": (MoEShape(vocab=151936, hidden=2560, layers=4, q_heads=32, kv_heads=8, head_dim=128, experts=0,
                                intermediate=9728, max_pos=2048), [2048] * 4, [1024] * 4),
    # Qwen3-30B-A3B widths, four layers: 128 experts top-8, each expert's MLP at the rows routed to it (about 60
    # of 8192 x 8 / 128 = 512 per expert); the per-expert dispatch is Python in both, as in the consistency run.
    "qwen3-30b-a3b.moe": (MoEShape(vocab=151936, hidden=2048, layers=4, q_heads=32, kv_heads=4, head_dim=128,
                                   experts=128, top_k=8, intermediate=768, max_pos=2048), [2048] * 4, [1024] * 4),
}


def forward_ms(m: MoEDecoder, seqs, prompts) -> tuple[float, list[torch.Tensor]]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    lp = m.training_logprobs(seqs, prompts)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), lp


def peak_extra_gb(m: MoEDecoder, seqs, prompts) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m.training_logprobs(seqs, prompts)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1e9


def breakdown(m: MoEDecoder, seqs, prompts) -> dict:
    """Per family, over one forward: GPU time between CUDA events around each call (host gaps before a launch
    count to the call that caused them) and host time spent in the calls; every call of a family summed."""
    events, host = [], {}

    def timed(family, path, fn, *a):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = fn(*a)
        host[family] = host.get(family, 0.0) + time.perf_counter() - t0
        end.record()
        events.append((family, start, end))
        return out

    with hooked(m, timed):
        m.training_logprobs(seqs, prompts)
        torch.cuda.synchronize()
    gpu: dict = {}
    for family, start, end in events:
        gpu[family] = gpu.get(family, 0.0) + start.elapsed_time(end)
    return {f: {"gpu_ms": gpu[f], "host_ms": host[f] * 1e3, "calls": sum(e[0] == f for e in events)} for f in gpu}


def host_us_per_call(calls: int = 2000) -> dict:
    """Host time to issue one launch (no sync inside the loop): linear at M 64 (N 768, K 2048: an expert's gate
    projection) and SiLU-and-mul on its output, ours with the fast path and with Triton's, and torch's."""
    lin, act = roots(("linear",))["linear"], roots(("silu_mul",))["silu_mul"]
    x = torch.randn(64, 2048, device="cuda").to(torch.bfloat16)
    w = torch.randn(768, 2048, device="cuda").to(torch.bfloat16)
    y, z = torch.empty(64, 768, device="cuda", dtype=torch.bfloat16), torch.empty(64, 768, device="cuda",
                                                                                  dtype=torch.bfloat16)
    cases = {"linear": lambda: lin.linear_full(x, w, None, y), "torch_matmul": lambda: torch.matmul(x, w.t(), out=y),
             "silu_mul": lambda: act.silu_mul_full(y, y, z),
             "torch_silu_mul": lambda: torch.mul(torch.nn.functional.silu(y), y, out=z)}
    out = {}
    for fast in (True, False):
        launch.ENABLED = fast
        for name, fn in cases.items():
            if name.startswith("torch") and not fast:
                continue
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name + ("" if fast or name.startswith("torch") else "_triton_launch")] = \
                (time.perf_counter() - t0) / calls * 1e6
            torch.cuda.synchronize()
    launch.ENABLED = True
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="model_speed.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated: " + ", ".join(CONFIGS))
    ap.add_argument("--attention-set", default="",
                    help="attention as this named set (kernels/attention/bench.py) instead of its root; needs the "
                         "engine's packages (omegaconf)")
    ap.add_argument("--decode-batch", type=int, default=64,
                    help="sequences decoded together in the rollout decode-step measurement (0: skip it)")
    ap.add_argument("--decode-context", type=int, default=1024, help="prompt length before the decode steps")
    ap.add_argument("--no-launch-ab", action="store_true",
                    help="skip the unified model with Triton's own launch path (tik_evo.launch off)")
    add_arguments(ap, "used in the unified model instead of the family's root")
    args = ap.parse_args(argv)
    loaded = impls_from_args(args, FAMILIES, args.attention_set)  # before the GPU: named on any machine
    if loaded is None:
        return 2
    unified, replaced = loaded
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (the CPU checks of the same model are tests/model/)")
        return 2
    result = {**header(device=0),
              "attention_set": args.attention_set or "root", "configs": {},
              "kernels": replaced}
    result["host_us_per_call"] = host_us_per_call()
    print("host us per call:", {k: round(v, 1) for k, v in result["host_us_per_call"].items()}, flush=True)
    for name in args.configs.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"--configs: unknown config {name!r} (known: {', '.join(CONFIGS)})")
        shape, lens, prompts = CONFIGS[name]
        g = torch.Generator().manual_seed(7)
        seqs = [torch.randint(0, shape.vocab, (n,), generator=g).to("cuda", torch.int32) for n in lens]
        row = {"shape": shape.__dict__, "lens": lens, "prompts": prompts}
        runs = [("unified", unified, True, False), ("torch", torch_impls(), True, False)]
        if not args.no_launch_ab:
            runs.append(("unified_triton_launch", unified, False, False))
        if shape.experts:  # the experts in grouped launches (linear_grouped_*), three per layer
            runs += [("unified_grouped", unified, True, True), ("torch_grouped", torch_impls(), True, True)]
        # Every model built first, then the forwards interleaved (one of each per repeat), so drift of the host or
        # the GPU's clocks over the run hits them alike; the median per model is reported.
        models = {label: (MoEDecoder(shape, 0, "cuda", impls=impls, grouped_experts=grouped), fast)
                  for label, impls, fast, grouped in runs}
        times: dict = {label: [] for label in models}
        lps: dict = {}
        for r in range(args.reps + 2):  # two warm-up rounds
            for label, (m, fast) in models.items():
                launch.ENABLED = fast
                ms, lps[label] = forward_ms(m, seqs, prompts)
                if r >= 2:
                    times[label].append(ms)
        for label, (m, fast) in models.items():
            launch.ENABLED = fast
            row[label] = {"ms": statistics.median(times[label]), "ms_all": times[label],
                          "peak_extra_GB": peak_extra_gb(m, seqs, prompts),
                          "mean_logprob": float(torch.cat(lps[label]).mean()),
                          "families": breakdown(m, seqs, prompts)}
        if args.decode_batch:
            # Only the families' kernels are timed, so Triton's launch path and the unified model differ only in
            # host time: one unified model per dispatch (per expert or grouped) against its torch counterpart.
            row["decode_step"] = {label: decode_step_us(m, args.decode_batch, args.decode_context, 8, shape.vocab)
                                  for label, (m, fast) in models.items() if label != "unified_triton_launch"}
            for label, d in row["decode_step"].items():
                print(f"{name}: decode step (B{args.decode_batch}, context {args.decode_context}) {label}: "
                      f"{d['total_us_per_step']:.1f} us of kernels " + ", ".join(
                          f"{f} {v['us_per_step']:.1f}" for f, v in d.items() if isinstance(v, dict)), flush=True)
        del models
        torch.cuda.empty_cache()
        launch.ENABLED = True
        row["unified_over_torch"] = row["unified"]["ms"] / row["torch"]["ms"]
        result["configs"][name] = row
        if "unified_triton_launch" in row:
            print(f"{name}: with Triton's own launch path {row['unified_triton_launch']['ms']:.2f} ms", flush=True)
        if "unified_grouped" in row:
            row["grouped_over_torch_grouped"] = row["unified_grouped"]["ms"] / row["torch_grouped"]["ms"]
            print(f"{name}: experts in grouped launches {row['unified_grouped']['ms']:.2f} ms, torch with "
                  f"torch._grouped_mm {row['torch_grouped']['ms']:.2f} ms: {row['grouped_over_torch_grouped']:.3f}x",
                  flush=True)
        print(f"{name}: unified {row['unified']['ms']:.2f} ms ({row['unified']['peak_extra_GB']:.2f} GB peak), "
              f"torch {row['torch']['ms']:.2f} ms ({row['torch']['peak_extra_GB']:.2f} GB peak): "
              f"{row['unified_over_torch']:.3f}x; mean log-prob {row['unified']['mean_logprob']:.3f} / "
              f"{row['torch']['mean_logprob']:.3f}", flush=True)
        for ours, theirs in (("unified", "torch"), ("unified_grouped", "torch_grouped")):
            for f in row.get(ours, {}).get("families", {}):
                u, t = row[ours]["families"][f], row[theirs]["families"].get(f, {})
                print(f"  {f:<12} calls {u['calls']:>5}  gpu ms {u['gpu_ms']:8.2f} / {t.get('gpu_ms', 0):8.2f}  host "
                      f"ms {u['host_ms']:8.2f} / {t.get('host_ms', 0):8.2f}  ({ours} / {theirs})", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
