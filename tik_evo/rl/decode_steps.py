"""Decode steps as a serving engine runs them: the live sequences padded to a batch bucket, and on a GPU each
bucket's step captured once in a CUDA graph and replayed.

A step's batch shrinks as sequences finish. An engine captures one graph per batch size it will meet, rounded
up to a few buckets (here powers of two, capped at the rollout's batch), pads the live rows to the bucket and
replays. The rows added are finished sequences of the same batch: their caches are no longer read, so their
slot 0 may be overwritten, and they keep every sequence index distinct and ascending, as the in-place decodes
of both caches want (`rollout.PagedCache`, `vendor`'s flash decode). The unified kernels compute each row of a
decode step on its own (their contract), so padding changes no live row's bits: `tests/rl/test_grpo_loop.py`
checks that arm B's padded rollout equals its unpadded one bit for bit. A vendor stack's matmuls may choose
another algorithm for another batch size, as they do in an engine.

Graphs read the model's weights and the cache by address: both persist between rollouts (the optimizer writes
the weights in place, the `rollout.Sampler` keeps the cache), so a graph stays valid for the whole run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class _Captured:
    ids: torch.Tensor  # int32 [bucket]: the tokens fed
    pos: torch.Tensor  # int32 [bucket]: their positions
    seqs: torch.Tensor  # int64 [bucket]: their sequences (cache rows)
    graph: object = None
    logits: torch.Tensor | None = None


@dataclass
class DecodeSteps:
    """``steps(live, tokens, positions)`` -> the logits of the live sequences' next tokens, [len(live), vocab].

    m: the model (`MoEDecoder`); cache: its rollout cache (``decode(layer, q, k, v, seqs, pos)``); n: sequences
    in the batch; graphs: capture and replay CUDA graphs (a GPU only); pad: pad to buckets (with graphs always)."""

    m: object
    cache: object
    n: int
    graphs: bool = False
    pad: bool = False
    stats: dict = field(default_factory=lambda: {"captures": 0, "capture_s": 0.0, "replays": 0, "eager": 0,
                                                   "padded_rows": 0})

    def __post_init__(self) -> None:
        self.graphs = bool(self.graphs) and torch.device(self.m.device).type == "cuda"
        self.pad = self.pad or self.graphs
        self._captured: dict[int, _Captured] = {}
        self._pool = None

    def bucket(self, k: int) -> int:
        return min(self.n, 1 << (k - 1).bit_length()) if self.pad else k

    def __call__(self, live: list[int], tokens: torch.Tensor, positions: list[int]) -> torch.Tensor:
        dev, k = self.m.device, len(live)
        b = self.bucket(k)
        self.stats["padded_rows"] += b - k
        taken = set(live)
        seqs = sorted(live + [s for s in range(self.n) if s not in taken][: b - k])
        slot = {s: i for i, s in enumerate(seqs)}
        at = torch.tensor([slot[s] for s in live], device=dev)  # the live rows' places in the padded batch
        pos = [0] * b
        for s, p in zip(live, positions):
            pos[slot[s]] = p
        ids = torch.zeros(b, device=dev, dtype=torch.int32)
        ids[at] = tokens.to(torch.int32)
        pos_t = torch.tensor(pos, device=dev, dtype=torch.int32)
        seqs_t = torch.tensor(seqs, device=dev)
        if not self.graphs:
            self.stats["eager"] += 1
            logits = self._run(ids, pos_t, seqs_t)
        else:
            logits = self._replay(b, ids, pos_t, seqs_t)
        return logits if b == k and seqs == live else logits[at]

    def _run(self, ids: torch.Tensor, pos: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        return self.m._forward(ids, pos, "decode",
                               lambda layer, q, k, v: cache.decode(layer, q, k, v, seqs, pos))

    def _replay(self, b: int, ids: torch.Tensor, pos: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
        g = self._captured.get(b)
        if g is None:
            return self._capture(b, ids, pos, seqs)
        g.ids.copy_(ids)
        g.pos.copy_(pos)
        g.seqs.copy_(seqs)
        g.graph.replay()
        self.stats["replays"] += 1
        return g.logits

    def _capture(self, b: int, ids: torch.Tensor, pos: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
        """Warm up on a side stream with this step's inputs (compiling what is new, writing this step's KV rows),
        capture, then replay: the replay writes the same rows again and gives this step's logits."""
        t0 = time.perf_counter()
        g = _Captured(ids.clone(), pos.clone(), seqs.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._run(g.ids, g.pos, g.seqs)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()  # one pool: buckets replay one at a time
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self._pool):
            g.logits = self._run(g.ids, g.pos, g.seqs)
        g.graph.replay()
        torch.cuda.synchronize()
        self._captured[b] = g
        self.stats["captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return g.logits
