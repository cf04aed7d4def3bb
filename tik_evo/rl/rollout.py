"""Rollout: prompts -> sampled completions, with the log-prob of every sampled token recorded at sampling, as an
inference engine records them.

The prompts are prefilled together (packed), then every unfinished sequence is decoded together, one token per
sequence per step, the batch shrinking as sequences sample EOS or reach `max_new` tokens. Token j of a
completion is drawn from softmax(logits / T) (T the model's temperature, the one its log-prob kernel applies), and
its log-prob is the model's log-prob call on the same logits and token, at temperature T.

Two backends run the same model weights (`kernels/moe_decoder.py`'s `MoEDecoder`):
- kernels (`ops=None`): every family's unified kernels, the decode entry points for decode steps, a paged KV
  cache filled by the kv_append family: the path whose log-probs equal the training forward's bit for bit;
- torch (`ops`: a `tik_evo_kernels.autograd.TorchOps`-like object): the model's calls through `ops`, a
  contiguous KV cache per sequence, and a decode attention call (`ops.attention_decode` where the ops have one,
  else SDPA over the cache with a length mask): a baseline rollout, whose log-probs differ from a training
  forward in some bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tik_evo.rl.decode_steps import DecodeSteps
from tik_evo.rl.task import EOS


@dataclass
class Rollout:
    """Completions of one batch: `completions[i]` the sampled tokens of prompt i (EOS included where sampled),
    `logprobs[i]` their log-probs recorded at sampling (fp32), `decode_steps` the decode steps run."""

    prompts: list[torch.Tensor]
    completions: list[torch.Tensor]
    logprobs: list[torch.Tensor]
    decode_steps: int

    @property
    def prompt_lens(self) -> list[int]:
        return [int(p.numel()) for p in self.prompts]

    @property
    def lengths(self) -> list[int]:
        return [int(c.numel()) for c in self.completions]

    @property
    def seqs(self) -> list[torch.Tensor]:
        """Prompt + completion of each sequence: what the trainer scores."""
        return [torch.cat([p, c]) for p, c in zip(self.prompts, self.completions)]


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """One token per row of logits [rows, vocab], drawn from softmax(logits / temperature): int32 [rows]."""
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0].to(torch.int32)


def sdpa_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lens: torch.Tensor, scale: float,
                dtype: torch.dtype) -> torch.Tensor:
    """One decode step's attention in torch: q [n, HQ, D], caches [n, capacity, HKV, D], row i attending its first
    lens[i] cache rows; computed in `dtype`; -> bf16 [n, HQ * D]."""
    n, hq, d = q.shape
    kh, vh = (c.transpose(1, 2).to(dtype) for c in (k_cache, v_cache))
    mask = (torch.arange(k_cache.shape[1], device=q.device)[None, :] < lens[:, None].long())[:, None, None, :]
    o = F.scaled_dot_product_attention(q.reshape(n, hq, 1, d).to(dtype), kh, vh, attn_mask=mask, scale=scale,
                                       enable_gqa=hq != k_cache.shape[2])
    return o.to(torch.bfloat16).reshape(n, hq * d)


class PagedCache:
    """The unified kernels' rollout cache (as `MoEDecoder.rollout_logprobs` keeps it): pages of `page_size` rows
    per layer, written by kv_append, read in place by the attention family's paged decode. Its storage holds `n`
    sequences of up to `capacity` tokens and is kept between rollouts (`begin` starts one)."""

    def __init__(self, m, n: int, capacity: int):
        s, dev = m.s, m.device
        self.m, self.n, self.capacity = m, n, capacity
        pages = -(-capacity // s.page_size)
        self.table = torch.arange(n * pages, device=dev, dtype=torch.int32).view(n, pages)
        self.cache = [[torch.zeros((n * pages, s.page_size, s.kv_heads, s.head_dim), device=dev,
                                   dtype=torch.bfloat16) for _ in range(2)] for _ in range(s.layers)]

    def begin(self, prompt_lens: list[int]) -> None:
        dev, n = self.m.device, len(prompt_lens)
        self.rows = self.table[:n]
        self.bounds = [0] + torch.tensor(prompt_lens).cumsum(0).tolist()
        self.cu = torch.tensor(self.bounds, device=dev, dtype=torch.int32)
        self.starts = torch.zeros(n, device=dev, dtype=torch.int32)
        self.max_prompt = max(prompt_lens)

    def prefill(self, layer: int, q, k, v) -> torch.Tensor:
        self.m._op("kv_append", "full", k, v, *self.cache[layer], self.rows, self.cu, self.starts, self.max_prompt)
        return self.m._prefill(q, k, v, self.bounds)

    def decode(self, layer: int, q, k, v, live: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        rows = self.table[live]
        self.m._op("kv_append", "decode", k, v, *self.cache[layer], rows, pos)
        return self.m.paged_decode(q, self.cache[layer], rows, pos + 1)


class TorchCache:
    """A baseline's rollout cache: [sequences, capacity, HKV, D] per layer (rows first, as the projections write
    them), prefill attention through `ops.attention_packed`, decode through `ops.attention_decode` or SDPA. Its
    storage is kept between rollouts (`begin` starts one)."""

    def __init__(self, m, n: int, capacity: int, ops):
        s, dev = m.s, m.device
        self.m, self.ops, self.n, self.capacity = m, ops, n, capacity
        self.cache = [[torch.zeros((n, capacity, s.kv_heads, s.head_dim), device=dev,
                                   dtype=torch.bfloat16) for _ in range(2)] for _ in range(s.layers)]
        self.dtype = torch.bfloat16 if getattr(ops, "native", False) else torch.float32

    def begin(self, prompt_lens: list[int]) -> None:
        dev = self.m.device
        self.bounds = [0] + torch.tensor(prompt_lens).cumsum(0).tolist()
        lens = torch.tensor(prompt_lens)
        self.seq_of_row = torch.repeat_interleave(torch.arange(len(prompt_lens)), lens).to(dev)
        self.pos_of_row = torch.cat([torch.arange(p) for p in prompt_lens]).to(dev)

    def prefill(self, layer: int, q, k, v) -> torch.Tensor:
        kc, vc = self.cache[layer]
        kc[self.seq_of_row, self.pos_of_row] = k
        vc[self.seq_of_row, self.pos_of_row] = v
        return self.m._prefill(q, k, v, self.bounds)

    def decode(self, layer: int, q, k, v, live: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        s = self.m.s
        kc, vc = self.cache[layer]
        kc[live, pos.long()] = k
        vc[live, pos.long()] = v
        scale = 1 / math.sqrt(s.head_dim)
        attend = getattr(self.ops, "attention_decode", None)
        if attend is not None:
            return attend(q, kc, vc, live, pos + 1, scale)
        return sdpa_decode(q, kc[live], vc[live], pos + 1, scale, self.dtype)


class Sampler:
    """What a rollout keeps from one batch to the next, as an inference engine does: the KV cache's storage and
    the decode steps that read it (on a GPU, with `graphs`, CUDA graphs captured on first use and replayed in
    every later rollout). `ops` None: the unified kernels; else the baseline's ops."""

    def __init__(self, m, n: int, capacity: int, ops=None, graphs: bool = False, pad: bool = False):
        self.ops, self.n, self.capacity = ops, n, capacity
        self.cache = PagedCache(m, n, capacity) if ops is None else TorchCache(m, n, capacity, ops)
        self.steps = DecodeSteps(m, self.cache, n, graphs=graphs, pad=pad)

    def fits(self, n: int, capacity: int, ops) -> bool:
        return n <= self.n and capacity <= self.capacity and ops is self.ops


def generate(m, prompts: list[torch.Tensor], max_new: int, generator: torch.Generator, ops=None,
             eos: int | frozenset[int] = EOS, sampler: Sampler | None = None) -> Rollout:
    """Sample up to `max_new` tokens after each prompt (int32 tensors on the model's device) with the model's
    temperature, on the kernels (`ops` None) or through `ops`; a sequence stops after sampling `eos` (a token
    or a set of them). `sampler`:
    the cache and decode steps to use (kept by the caller between rollouts); None: a fresh one, decoded eagerly."""
    plens = [int(p.numel()) for p in prompts]
    if max_new < 1 or not prompts or min(plens) < 1 or max(plens) + max_new > m.s.max_pos:
        raise ValueError(f"generate: {len(prompts)} prompts of {min(plens, default=0)}..{max(plens, default=0)} "
                         f"tokens and max_new {max_new}: need prompts, max_new >= 1 and prompt + max_new <= "
                         f"max_pos {m.s.max_pos}")
    if sampler is None or not sampler.fits(len(prompts), max(plens) + max_new, ops):
        sampler = Sampler(m, len(prompts), max(plens) + max_new, ops)
    sampler.cache.begin(plens)
    m.ops = ops
    try:
        with torch.no_grad():
            return _generate(m, prompts, plens, max_new, generator, sampler, eos)
    finally:
        m.ops = None


def _generate(m, prompts, plens, max_new, generator, sampler: Sampler, eos) -> Rollout:
    dev, n = m.device, len(prompts)
    ends = frozenset([eos]) if isinstance(eos, int) else frozenset(eos)
    tokens = torch.zeros((n, max_new), device=dev, dtype=torch.int32)  # row b: completion b's tokens so far
    logprobs = torch.zeros((n, max_new), device=dev, dtype=torch.float32)
    lengths = [0] * n
    positions = torch.cat([torch.arange(p, dtype=torch.int32) for p in plens]).to(dev)
    cache = sampler.cache
    last = torch.tensor(cache.bounds[1:], device=dev) - 1  # only each prompt's last row is scored
    logits = m._forward(torch.cat(prompts), positions, "full", cache.prefill, keep=last)
    live = list(range(n))
    step = 0
    while True:
        idx = torch.tensor(live, device=dev)
        tok = sample(logits, m.temperature, generator)
        tokens[idx, step] = tok
        logprobs[idx, step] = m._logprob(logits, tok, "decode")
        for b in live:
            lengths[b] += 1
        # A sequence goes on unless it sampled EOS or holds max_new tokens (a host sync per step: the batch
        # shrinks, as an engine's does).
        live_tok = [(b, t) for b, t in zip(live, tok.tolist()) if t not in ends and lengths[b] < max_new]
        if not live_tok:
            break
        live = [b for b, _ in live_tok]
        feed = tokens[torch.tensor(live, device=dev), step]
        logits = sampler.steps(live, feed, [plens[b] + step for b in live])
        step += 1
    return Rollout(list(prompts), [tokens[b, :lengths[b]] for b in range(n)],
                   [logprobs[b, :lengths[b]] for b in range(n)], step)
