"""Measurements of the model (kernels/moe_decoder.py) on the kernels, labelled by family: the GPU time of each
family's kernels in a rollout's decode step (`decode_step_us`, tik-evo bench model-speed) and in one policy step,
forward and backward (`policy_breakdown`), from torch.profiler ranges around every call (`kernel_us_by_label`);
and the policy step's GPU time and peak memory on the kernels against the torch trainer's model
(`policy_step_times`, tik-evo bench policy). On the CPU the labels and call counts are recorded, not times.
"""

from __future__ import annotations

import bisect
import statistics

import torch

from tik_evo_kernels.autograd import KernelOps, TorchOps
from tik_evo_kernels.moe_decoder import MoEDecoder, hooked


def decode_step_us(m: MoEDecoder, batch: int, prompt: int, steps: int, vocab: int) -> dict:
    """Rollout: the GPU time of each family's kernels in one decode step (batch sequences at a context of about
    `prompt` tokens), from the CUDA kernels the profiler records under each decode-path call, averaged over
    `steps` steps. Kernel time only: the harness's glue (its page gather, indexing) and host time are left out,
    so it is what the kernels cost a step, whichever engine drives them."""
    from torch.profiler import ProfilerActivity, profile, record_function

    g = torch.Generator().manual_seed(11)
    seqs = [torch.randint(0, vocab, (prompt + steps + 1,), generator=g).to(m.device, torch.int32)
            for _ in range(batch)]
    cuda = str(m.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def labelled(family, path, fn, *a):
        if "decode" not in path:
            return fn(*a)
        with record_function("decode:" + family):
            return fn(*a)

    with hooked(m, labelled):
        m.rollout_logprobs(seqs, [prompt] * batch)  # warm-up: compiles every decode launch shape
        sync()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            m.rollout_logprobs(seqs, [prompt] * batch)
            sync()
    per = kernel_us_by_label(prof, "decode:")
    out: dict = {f: {"us_per_step": v["us"] / steps, "calls_per_step": v["calls"] / steps} for f, v in per.items()
                 if f != "gpu_ranges"}
    out["total_us_per_step"] = sum(v["us_per_step"] for v in out.values())
    out["gpu_ranges"] = per["gpu_ranges"]  # 0 on a GPU: the profiler gave no device-side ranges, so no times
    return out


def kernel_us_by_label(prof, prefix: str) -> dict:
    """{label without `prefix`: {"us": GPU time of the kernels started inside its calls, "calls": its host-side
    calls}} from a torch.profiler profile, and "gpu_ranges": how many device-side ranges the labels left.

    Each labelled call leaves a GPU-side range from its first kernel's start to its last kernel's end. The
    kernels (and copies) that start inside it are summed; the range itself is not, since it spans the idle gaps
    between a host-bound call's kernels. (Triton's launches have no ATen op to hang on, so the host-side events'
    own device times miss them.) Labels must not nest."""
    events = [ev for ev in prof.events() if str(ev.device_type).endswith("CUDA")]
    ranges = sorted((ev.time_range.start, ev.time_range.end, ev.name.removeprefix(prefix))
                    for ev in events if ev.name.startswith(prefix))
    starts = [r[0] for r in ranges]
    out: dict = {}
    for ev in prof.events():  # calls, from the host-side labels (the only ones on the CPU)
        if ev.name.startswith(prefix) and str(ev.device_type).endswith("CPU"):
            out.setdefault(ev.name.removeprefix(prefix), {"us": 0.0, "calls": 0})["calls"] += 1
    for ev in events:
        if ev.name.startswith(prefix):
            continue
        i = bisect.bisect_right(starts, ev.time_range.start) - 1
        if i >= 0 and ev.time_range.start < ranges[i][1]:
            out.setdefault(ranges[i][2], {"us": 0.0, "calls": 0})["us"] += ev.time_range.end - ev.time_range.start
    out["gpu_ranges"] = len(ranges)
    return out


def policy_backward(m: MoEDecoder, seqs, prompts, adv, ops) -> list[torch.Tensor]:
    """log-probs of a policy-gradient loss's forward, after its backward (gradients in the parameters' .grad)."""
    for p in m.parameters():
        p.grad = None
    lp = m.policy_logprobs(seqs, prompts, ops=ops)
    (torch.cat(lp) * adv).sum().backward()
    return lp


def policy_step_times(m: MoEDecoder, seqs, prompts, reps: int, device: str, modes: list[str]) -> dict:
    """Forward + backward of the policy loss, ours (for each matmul_backward mode: "unified" for the first,
    "unified_<mode>_matmul_bwd" for the rest) against the torch trainer's model, interleaved."""
    adv = torch.randn(sum(n - p for n, p in zip(map(len, seqs), prompts)),
                      generator=torch.Generator().manual_seed(6)).to(device)
    runs = {run_label(i, mode): KernelOps(m.k, matmul_backward=mode) for i, mode in enumerate(modes)}
    runs["torch"] = TorchOps(native=True)
    times: dict = {k: [] for k in runs}
    peak: dict = {}
    for r in range(reps + 2):  # two warm-up rounds
        for label, ops in runs.items():
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            policy_backward(m, seqs, prompts, adv, ops)
            if device == "cuda":
                end.record()
                torch.cuda.synchronize()
                peak[label] = (torch.cuda.max_memory_allocated() - base) / 1e9
                if r >= 2:
                    times[label].append(start.elapsed_time(end))
    out = {label: {"ms": statistics.median(t) if t else None, "ms_all": t, "peak_extra_GB": peak.get(label)}
           for label, t in times.items()}
    if m.s.experts:  # the torch model's experts: one torch._grouped_mm per projection, or a loop of matmuls
        from tik_evo_kernels.autograd import _grouped_mm_trains

        out["torch_experts"] = "torch._grouped_mm" if _grouped_mm_trains(torch.device(device)) else "per-expert matmuls"
    for i, mode in enumerate(modes):
        label = run_label(i, mode)
        if out[label]["ms"] and out["torch"]["ms"]:
            out[label + "_over_torch"] = out[label]["ms"] / out["torch"]["ms"]
    return out


def run_label(i: int, mode: str) -> str:
    return "unified" if i == 0 else f"unified_{mode}_matmul_bwd"


def policy_breakdown(m: MoEDecoder, seqs, prompts, device: str, mode: str) -> dict:
    """One policy step on the kernels under the profiler: per family and direction ("linear.fwd", "linear.bwd",
    ...), the GPU time of the kernels inside its calls (ms) and its calls; "other_ms" is the step's remaining
    kernel time (the harness's glue, autograd's own kernels)."""
    from torch.profiler import ProfilerActivity, profile


    adv = torch.randn(sum(n - p for n, p in zip(map(len, seqs), prompts)),
                      generator=torch.Generator().manual_seed(6)).to(device)
    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        policy_backward(m, seqs, prompts, adv, KernelOps(m.k, matmul_backward=mode))
        if cuda:
            torch.cuda.synchronize()
    per = kernel_us_by_label(prof, "policy:")
    out = {k: {"ms": v["us"] / 1e3, "calls": v["calls"]} for k, v in per.items() if k != "gpu_ranges"}
    kernels_ms = sum((ev.time_range.end - ev.time_range.start) / 1e3 for ev in prof.events()
                     if str(ev.device_type).endswith("CUDA") and not ev.name.startswith("policy:"))
    return {"families": out, "other_ms": kernels_ms - sum(v["ms"] for v in out.values()),
            "gpu_ranges": per["gpu_ranges"]}
