"""Where a benchmarked call spends its time, for results files: one call under torch.profiler, summarised as its
wall time, its kernels' device time, the kernels that took most of it and the host ops that took most host time.
A call whose wall time far exceeds its kernels' is bound by the host (launches, syncs, Python)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def profile_call(fn: Callable[[], Any], device: str, top: int = 15) -> dict[str, Any]:
    """Run ``fn`` once under the profiler (after the caller's warm-up) and summarise it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_gpu = str(device).startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    if on_gpu:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    events = prof.key_averages()
    kernels = [e for e in events if on_gpu and e.device_type == torch.autograd.DeviceType.CUDA
               and e.self_device_time_total > 0]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.self_cpu_time_total > 0]
    return {"wall_ms": wall,
            "kernel_ms": sum(e.self_device_time_total for e in kernels) / 1e3 if on_gpu else None,
            "top_kernels": [{"name": e.key[:160], "calls": e.count, "ms": e.self_device_time_total / 1e3}
                            for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]],
            "top_host_ops": [{"name": e.key[:160], "calls": e.count, "ms": e.self_cpu_time_total / 1e3}
                             for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:top]]}
