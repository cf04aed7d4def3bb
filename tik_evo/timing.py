"""Timer helpers and labels. The audit times candidates from the judge's process (`tik_evo.timed`); the graph
helpers here serve the benchmarks (ours and the peers are timed by one function) and the runner's capture. CPU
figures are wall clock under the interpreter, labelled as such everywhere they are shown: they say nothing about
GPU speed."""

from __future__ import annotations

import contextlib
import statistics
from typing import Any

WALL_INTERPRETER = "wall-interpreter"
LABELS = {
    "judge-graph": "GPU time (the judge's clock around CUDA-graph replays, median per launch)",
    "judge-eager": "GPU time (the judge's clock around synchronised launches, median per launch)",
    # Timers of runs recorded before the audit timed from the judge's process:
    "cuda-event": "GPU time (CUDA events, median)",
    "cuda-graph": "GPU time (CUDA-graph replays, median per launch)",
    WALL_INTERPRETER: "interpreter wall clock (CPU, not GPU time)",
}


def _summary(samples_s: list[float], timer: str) -> dict[str, Any]:
    med = statistics.median(samples_s)
    if len(samples_s) >= 4:
        q = statistics.quantiles(samples_s, n=4)
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (max(samples_s) - min(samples_s)) / med if med > 0 else 0.0
    return {"median_s": med, "spread": spread, "reps": len(samples_s), "timer": timer,
            "min_s": min(samples_s), "max_s": max(samples_s)}


def graph_replay_us(fn, calls: int = 20, replays: int = 30, warmup: int = 3) -> float:
    """Benchmarks' graph timer: median microseconds per call over ``replays`` replays of one CUDA graph that
    captured ``calls`` calls of ``fn`` (zero-arg; it may cycle through input sets), after ``warmup`` warm-up calls
    on a side stream (as capture requires) and ``warmup`` warm-up replays. Ours and the peers are timed by this one
    function. Fewer calls, replays and warm-ups bound the time spent on long launches (tens of ms each)."""
    graph = capture_graph(fn, calls, warmup)
    times = [replay_us(graph, 1, calls) for _ in range(replays)]
    return sorted(times)[len(times) // 2]


def capture_graph(fn, calls: int, warmup: int = 3):
    """A CUDA graph of ``calls`` calls of ``fn`` (zero-arg), after ``warmup`` calls on a side stream (as capture
    requires) and followed by ``warmup`` replays."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = _capture(fn, calls)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def replay_us(graph, replays: int, calls: int) -> float:
    """Microseconds per captured call over ``replays`` back-to-back replays of ``graph`` (CUDA events)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * calls)


def _capture(fn, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn``. A capture that fails (``fn`` syncs, say) is undone here, so the
    caller can go on: torch.cuda.graph would leave its side stream current and the default CUDA generator marked
    as capturing (every later torch.randn on the GPU then raises)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            graph.capture_begin()
            try:
                for _ in range(calls):
                    fn()
            except BaseException:
                with contextlib.suppress(Exception):  # ends the invalidated capture; fn's error is the one to see
                    graph.capture_end()
                raise
            graph.capture_end()
    except BaseException:
        _end_generator_capture()
        raise
    return graph


def _end_generator_capture() -> None:
    """Clear the capturing mark a failed capture leaves on the default CUDA generator: a capture that ends well
    (here of one tiny kernel) runs the generator's epilogue, which the failed one skipped."""
    import torch

    x = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()):
        graph.capture_begin()
        x.add_(1)
        graph.capture_end()
    torch.cuda.synchronize()


def timer_of(measurements: dict[str, dict[str, Any]]) -> str:
    """The timers behind a set of measurements, e.g. "cuda-event+cuda-graph"."""
    return "+".join(sorted({m.get("timer", "") for m in measurements.values()}))
