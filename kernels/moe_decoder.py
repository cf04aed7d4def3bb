"""A Qwen3-style decoder of several layers (MoE or dense MLP) built from every family's unified kernels: the
whole-model claim under batched rollouts. Several sequences of different prompt and answer lengths are
prefilled together (packed), then decoded together one token per sequence per step from a paged KV cache, the
batch shrinking as sequences finish; training packs the same sequences into one full-sequence forward. Every
log-prob the rollout records must equal the trainer's bit for bit, although each kernel sees different row
counts in the two (the linear layers of an expert, for one, get whichever tokens the router sent there).

Layer (Qwen3 / Qwen3-MoE): RMSNorm (first layer) or fused residual add + RMSNorm → QKV linear → per-head QK
RMSNorm → NeoX RoPE → (rollout: KV-cache append) → causal GQA attention → O linear → fused add + RMSNorm →
MLP (gate and up linear → SiLU-and-mul → down linear) or MoE (router linear → softmax top-k routing with
renormalisation → one MLP per expert over the tokens routed to it → slot-order weighted sum); after the last
layer a fused add + final RMSNorm → lm_head linear → log-prob. Glue is torch indexing and copies (exact) and the
MoE combine (`kernels/moe_combine.py`): each token's slots weighted and summed in fp32 in slot order, element by
element, so the same for any batch.

The policy update: `policy_logprobs` is `training_logprobs` with every family call made differentiable
(`tik_evo_kernels.autograd`): the same kernels on the same arguments, so the same bits, and `backward()` gives the
gradients of `parameters()`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import torch

from tik_evo_kernels.attention.autograd import prefill_packed
from tik_evo_kernels.decoder import EPS, _heads_first, roots, rope
from tik_evo_kernels.moe_combine import combine

FAMILIES = ("embedding", "rmsnorm", "add_rmsnorm", "qk_rmsnorm", "linear", "rope", "kv_append", "attention",
            "silu_mul", "moe_routing", "logprob")


@dataclass
class MoEShape:
    vocab: int = 512
    hidden: int = 128
    layers: int = 2
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    experts: int = 8  # 0: a dense MLP
    top_k: int = 2
    intermediate: int = 64  # of each expert (or of the dense MLP)
    max_pos: int = 64
    page_size: int = 16
    theta: float = 1e6


class MoEDecoder:
    def __init__(self, shape: MoEShape, seed: int, device: str, impls: dict[str, ModuleType] | None = None,
                 temperature: float = 1.0, grouped_experts: bool = True):
        from tik_evo_kernels.rope.family import inv_freq, rope_table

        if shape.experts and not 0 < shape.top_k <= shape.experts:
            raise ValueError(f"MoEShape: top_k {shape.top_k} must be in 1..experts ({shape.experts})")
        if shape.q_heads % shape.kv_heads:
            raise ValueError(f"MoEShape: q_heads {shape.q_heads} is not a multiple of kv_heads {shape.kv_heads}")
        self.s, self.device, self.temperature = shape, device, temperature
        self.k = impls or roots(FAMILIES)
        g = torch.Generator(device).manual_seed(seed)

        def w(*dims: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(dims, generator=g, device=device) * (scale / math.sqrt(dims[-1]))).to(torch.bfloat16)

        def gain(n: int) -> torch.Tensor:
            return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(torch.bfloat16)

        s, n_layers = shape, range(shape.layers)
        self.embed = torch.randn((s.vocab, s.hidden), generator=g, device=device).to(torch.bfloat16)
        self.norm_in, self.norm_post = [gain(s.hidden) for _ in n_layers], [gain(s.hidden) for _ in n_layers]
        self.norm_f = gain(s.hidden)
        self.q_norm, self.k_norm = [gain(s.head_dim) for _ in n_layers], [gain(s.head_dim) for _ in n_layers]
        self.w_qkv = [w((s.q_heads + 2 * s.kv_heads) * s.head_dim, s.hidden) for _ in n_layers]
        self.w_o = [w(s.hidden, s.q_heads * s.head_dim) for _ in n_layers]
        self.w_router = [w(s.experts, s.hidden, scale=4.0) for _ in n_layers] if s.experts else []
        mlps = max(s.experts, 1)
        self.w_gate = [[w(s.intermediate, s.hidden) for _ in range(mlps)] for _ in n_layers]
        self.w_up = [[w(s.intermediate, s.hidden) for _ in range(mlps)] for _ in n_layers]
        self.w_down = [[w(s.hidden, s.intermediate) for _ in range(mlps)] for _ in n_layers]
        # Each layer's experts also as one [experts, out, in] tensor (the lists become views of it): the grouped
        # launch (`grouped_experts`: linear_grouped_*, one launch per projection instead of one per expert).
        self.grouped = grouped_experts and bool(s.experts)
        for name in ("w_gate", "w_up", "w_down"):
            stacked = [torch.stack(per_layer) for per_layer in getattr(self, name)]
            setattr(self, name + "_stacked", stacked)
            setattr(self, name, [list(t.unbind(0)) for t in stacked])
        self.w_lm = w(s.vocab, s.hidden, scale=4.0)
        self.cos, self.sin = rope_table(s.max_pos, s.head_dim, s.theta, None, device)
        self.inv_freq = inv_freq(s.head_dim, s.theta).to(device)  # the table's frequencies: COS_SIN "sincos" kernels
        self.expert_rows = 0  # tokens routed, summed over layers and calls (a check that the MoE path ran)
        self.ops = None  # while policy_logprobs runs: the differentiable family calls (kernels.autograd)

    def parameters(self) -> list[torch.Tensor]:
        """The weights, each one tensor the forward reads (the experts' as [experts, out, in] per projection)."""
        return [self.embed, *self.norm_in, *self.norm_post, self.norm_f, *self.q_norm, *self.k_norm, *self.w_qkv,
                *self.w_o, *self.w_router, *self.w_gate_stacked, *self.w_up_stacked, *self.w_down_stacked, self.w_lm]

    # -- kernels, either path ------------------------------------------------------------------------------------
    def _op(self, family: str, path: str, *args, **kwargs):
        return getattr(self.k[family], f"{family}_{path}")(*args, **kwargs)

    def _empty(self, *dims: int, dtype=torch.bfloat16) -> torch.Tensor:
        return torch.empty(dims, device=self.device, dtype=dtype)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, path: str) -> torch.Tensor:
        if self.ops:
            return self.ops.linear(x, weight)
        out = self._empty(x.shape[0], weight.shape[0])
        self._op("linear", path, x, weight, None, out)
        return out

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, path: str):
        if self.ops:
            return self.ops.add_rmsnorm(x, residual, weight, EPS)
        out, res = torch.empty_like(x), torch.empty_like(x)
        self._op("add_rmsnorm", path, x, residual, weight, EPS, out, res)
        return out, res

    def _qkv(self, layer: int, x: torch.Tensor, positions: torch.Tensor, path: str):
        s = self.s
        qkv = self._linear(x, self.w_qkv[layer], path)
        nq, nkv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        # One split, not three slices: autograd takes split's gradient with one cat, where three slices each
        # build a zeroed full-width gradient and then sum them.
        q, k, v = (t.unflatten(1, (-1, s.head_dim)).contiguous() for t in qkv.split([nq, nkv, nkv], dim=1))
        if self.ops:
            qn, kn = self.ops.qk_rmsnorm(q, k, self.q_norm[layer], self.k_norm[layer], EPS)
            return (*self.ops.rope(qn, kn, self.cos, self.sin, positions, self.inv_freq), v)
        qn, kn = torch.empty_like(q), torch.empty_like(k)
        self._op("qk_rmsnorm", path, q, k, self.q_norm[layer], self.k_norm[layer], EPS, qn, kn)
        qr, kr = torch.empty_like(q), torch.empty_like(k)
        rope(self, path, qn, kn, positions, qr, kr)
        return qr, kr, v

    def _silu_mul(self, gate: torch.Tensor, up: torch.Tensor, path: str) -> torch.Tensor:
        if self.ops:
            return self.ops.silu_mul(gate, up)
        act = torch.empty_like(gate)
        self._op("silu_mul", path, gate, up, act)
        return act

    def _ffn(self, layer: int, expert: int, x: torch.Tensor, path: str) -> torch.Tensor:
        # The expert's weights as views of the stacked tensors (the same memory as w_gate[layer][expert]), so the
        # policy gradient reaches the tensors parameters() gives.
        gate = self._linear(x, self.w_gate_stacked[layer][expert], path)
        up = self._linear(x, self.w_up_stacked[layer][expert], path)
        return self._linear(self._silu_mul(gate, up, path), self.w_down_stacked[layer][expert], path)

    def _mlp(self, layer: int, x: torch.Tensor, path: str) -> torch.Tensor:
        s = self.s
        if not s.experts:
            return self._ffn(layer, 0, x, path)
        logits = self._linear(x, self.w_router[layer], path)
        if self.ops:
            weights, ids = self.ops.moe_routing(logits, s.top_k)
        else:
            weights, ids = self._empty(x.shape[0], s.top_k), self._empty(x.shape[0], s.top_k, dtype=torch.int32)
            self._op("moe_routing", path, logits, weights, ids)
        if self.grouped:
            rows, pos = self._grouped_ffn(layer, x, ids, path)
        else:  # one launch per expert: the rows in (token, slot) order
            rows = self._empty(x.shape[0] * s.top_k, s.hidden)
            for e in torch.unique(ids).tolist():
                hit = (ids.flatten() == e).nonzero()[:, 0]
                rows[hit] = self._ffn(layer, e, x[hit // s.top_k].contiguous(), path)
                self.expert_rows += hit.numel()
            pos = torch.arange(rows.shape[0], device=self.device).view(-1, s.top_k)
        if self.ops:
            return self.ops.moe_combine(rows, weights, pos)
        return combine(rows, weights, pos)

    def _grouped_ffn(self, layer: int, x: torch.Tensor, ids: torch.Tensor, path: str
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every (token, slot) pair's expert MLP in three grouped launches over the rows sorted by expert: (the
        rows, pos) with pos[t, k] the row of token t's slot k."""
        s = self.s
        flat = ids.flatten().long()
        order = torch.argsort(flat, stable=True)
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=self.device)
        pos = pos.view(-1, s.top_k)
        starts = torch.zeros(s.experts + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(torch.bincount(flat, minlength=s.experts), 0, out=starts[1:])
        src = order // s.top_k
        xs = self.ops.moe_dispatch(x, src, pos) if self.ops else x[src]

        def grouped(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            if self.ops:
                return self.ops.linear_grouped(rows, weights, starts)
            out = self._empty(rows.shape[0], weights.shape[1])
            self._op("linear", "grouped_" + path, rows, weights, starts, out)
            return out

        gate, up = grouped(xs, self.w_gate_stacked[layer]), grouped(xs, self.w_up_stacked[layer])
        down = grouped(self._silu_mul(gate, up, path), self.w_down_stacked[layer])
        self.expert_rows += xs.shape[0]
        return down, pos

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, path: str, attend,
                 keep: torch.Tensor | None = None, head: bool = True) -> torch.Tensor:
        """Logits of the rows `ids` at `positions` (only of the rows `keep`, when given: the lm_head is
        row-independent, so the same bits); attend(layer, q, k, v) -> [rows, q_heads * head_dim]. `head` False:
        the final hidden rows instead, for a caller that fuses lm_head with what follows."""
        s = self.s
        if self.ops:
            h = self.ops.embedding(ids, self.embed)
            x = self.ops.rmsnorm(h, self.norm_in[0], EPS)
        else:
            h = self._empty(ids.shape[0], s.hidden)
            self._op("embedding", path, ids, self.embed, h)
            x = torch.empty_like(h)
            self._op("rmsnorm", path, h, self.norm_in[0], EPS, x)
        residual = h
        for layer in range(s.layers):
            q, k, v = self._qkv(layer, x, positions, path)
            x, residual = self._add_norm(self._linear(attend(layer, q, k, v), self.w_o[layer], path), residual,
                                         self.norm_post[layer], path)
            nxt = self.norm_in[layer + 1] if layer + 1 < s.layers else self.norm_f
            x, residual = self._add_norm(self._mlp(layer, x, path), residual, nxt, path)
        x = x if keep is None else x[keep].contiguous()
        return self._linear(x, self.w_lm, path) if head else x

    def _logprob(self, logits: torch.Tensor, targets: torch.Tensor, path: str) -> torch.Tensor:
        if self.ops:
            return self.ops.logprob(logits.contiguous(), targets.contiguous(), self.temperature)[0]
        lp = self._empty(logits.shape[0], dtype=torch.float32)
        self._op("logprob", path, logits.contiguous(), targets.contiguous(), self.temperature, lp, torch.empty_like(lp))
        return lp

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        """Causal attention of each packed sequence over its own rows: one packed launch where the attention file
        has `prefill_packed` (each token gets `prefill`'s bits for its sequence alone), else one per sequence."""
        scale = 1 / math.sqrt(self.s.head_dim)
        if self.ops:
            return self.ops.attention_packed(q, k, v, bounds, scale).reshape(q.shape[0], -1)
        impl = self.k["attention"]
        if hasattr(impl, "prefill_packed"):
            return prefill_packed(impl, q, k, v, bounds, scale).reshape(q.shape[0], -1)
        out = self._empty(q.shape[0], q.shape[1] * q.shape[2])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            qh, kh, vh = _heads_first(q[lo:hi]), _heads_first(k[lo:hi]), _heads_first(v[lo:hi])
            o = torch.empty_like(qh)
            impl.prefill(qh, kh, vh, scale, o)
            out[lo:hi] = o[0].transpose(0, 1).reshape(hi - lo, -1)
        return out

    # -- the two ways log-probs are computed ------------------------------------------------------------------
    def _check(self, seqs: list[torch.Tensor], prompt_lens: list[int]) -> list[int]:
        if len(seqs) != len(prompt_lens) or not seqs:
            raise ValueError(f"{len(seqs)} sequences but {len(prompt_lens)} prompt lengths")
        lens = [int(t.numel()) for t in seqs]
        for b, (n, p) in enumerate(zip(lens, prompt_lens)):
            if not 0 < p < n or n > self.s.max_pos:
                raise ValueError(f"sequence {b}: prompt length {p} must be in 1..{n - 1} and length {n} at most "
                                 f"max_pos {self.s.max_pos}")
        return lens

    def training_logprobs(self, seqs: list[torch.Tensor], prompt_lens: list[int]) -> list[torch.Tensor]:
        """One full-sequence forward over the packed sequences (the policy update): the log-probs of each
        sequence's answer tokens."""
        lens = self._check(seqs, prompt_lens)
        bounds = [0] + torch.tensor(lens).cumsum(0).tolist()
        positions = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens]).to(self.device)
        rows = torch.cat([torch.arange(lo + p - 1, hi - 1) for lo, hi, p in zip(bounds, bounds[1:], prompt_lens)])
        # Only the scored rows go through the lm_head (row-independent, so the same bits as all rows then a gather).
        targets = torch.cat([t[p:] for t, p in zip(seqs, prompt_lens)])
        fused = getattr(self.ops, "linear_logprob", None) if self.ops else None  # lm_head + log-prob in one call
        out = self._forward(torch.cat(seqs), positions, "full", lambda _, q, k, v: self._prefill(q, k, v, bounds),
                            keep=rows.to(self.device), head=fused is None)
        lp = fused(out, self.w_lm, targets, self.temperature) if fused else self._logprob(out, targets, "full")
        return list(lp.split([n - p for n, p in zip(lens, prompt_lens)]))

    def policy_logprobs(self, seqs: list[torch.Tensor], prompt_lens: list[int], ops=None) -> list[torch.Tensor]:
        """training_logprobs, differentiable in the parameters (set requires_grad on `parameters()`): every family
        call goes through `ops` (default `tik_evo_kernels.autograd.KernelOps` on this model's kernel files: the same
        calls, so the same bits; `TorchOps` for a torch reference), and `backward()` gives the policy gradient."""
        from tik_evo_kernels.autograd import KernelOps

        self.ops = ops or KernelOps(self.k)
        try:
            return self.training_logprobs(seqs, prompt_lens)
        finally:
            self.ops = None

    def paged_decode(self, q: torch.Tensor, cache: list[torch.Tensor], rows: torch.Tensor, ctx: torch.Tensor
                     ) -> torch.Tensor:
        """One decode step's attention over pages [pages, page_size, HKV, D] through the block table ``rows``
        (int32 [n, pages]); ``ctx`` the context lengths. A kernel file without ``decode_paged`` (written before
        it existed) gets the live sequences' pages gathered into the contiguous [n, HKV, capacity, D] its
        ``decode`` reads: the same bits, at the cost of a copy per layer and step."""
        s, n, att = self.s, rows.shape[0], self.k["attention"]
        o = self._empty(n, s.q_heads, 1, s.head_dim)
        q = q.reshape(n, s.q_heads, 1, s.head_dim).contiguous()
        if hasattr(att, "decode_paged"):
            att.decode_paged(q, cache[0], cache[1], rows, ctx, 1 / math.sqrt(s.head_dim), o)
        else:
            kc, vc = (c[rows].reshape(n, -1, s.kv_heads, s.head_dim).transpose(1, 2).contiguous() for c in cache)
            att.decode(q, kc, vc, ctx, 1 / math.sqrt(s.head_dim), o)
        return o.reshape(n, -1)

    def rollout_logprobs(self, seqs: list[torch.Tensor], prompt_lens: list[int]) -> list[torch.Tensor]:
        """Prefill the packed prompts, then decode every unfinished sequence together, one token per step, from a
        paged KV cache (pages dealt out of order), recording each answer token's log-prob as an inference
        engine would."""
        s, dev = self.s, self.device
        lens = self._check(seqs, prompt_lens)
        pages = -(-max(lens) // s.page_size)
        order = torch.randperm(len(seqs) * pages, generator=torch.Generator().manual_seed(len(seqs)))
        table = order.reshape(len(seqs), pages).to(dev, torch.int32)
        cache = [[torch.zeros((len(seqs) * pages, s.page_size, s.kv_heads, s.head_dim), device=dev,
                              dtype=torch.bfloat16) for _ in range(2)] for _ in range(s.layers)]
        bounds = [0] + torch.tensor(prompt_lens).cumsum(0).tolist()
        cu = torch.tensor(bounds, device=dev, dtype=torch.int32)
        zeros = torch.zeros(len(seqs), device=dev, dtype=torch.int32)

        def prefill(layer, q, k, v):
            self._op("kv_append", "full", k, v, *cache[layer], table, cu, zeros, max(prompt_lens))
            return self._prefill(q, k, v, bounds)

        positions = torch.cat([torch.arange(p, dtype=torch.int32) for p in prompt_lens]).to(dev)
        last = torch.tensor(bounds[1:], device=dev) - 1  # an engine scores only each prompt's last row
        logits = self._forward(torch.cat([t[:p] for t, p in zip(seqs, prompt_lens)]), positions, "full", prefill,
                               keep=last)
        lp = self._logprob(logits, torch.stack([t[p] for t, p in zip(seqs, prompt_lens)]), "decode")
        out = [[lp[b:b + 1]] for b in range(len(seqs))]
        for step in range(max(n - p for n, p in zip(lens, prompt_lens)) - 1):
            live = [b for b, (n, p) in enumerate(zip(lens, prompt_lens)) if p + step < n - 1]
            pos = torch.tensor([prompt_lens[b] + step for b in live], device=dev, dtype=torch.int32)
            rows = table[live].contiguous()

            def decode(layer, q, k, v, pos=pos, rows=rows):
                self._op("kv_append", "decode", k, v, *cache[layer], rows, pos)
                return self.paged_decode(q, cache[layer], rows, pos + 1)

            ids = torch.stack([seqs[b][prompt_lens[b] + step] for b in live])
            targets = torch.stack([seqs[b][prompt_lens[b] + step + 1] for b in live])
            lp = self._logprob(self._forward(ids, pos, "decode", decode), targets, "decode")
            for i, b in enumerate(live):
                out[b].append(lp[i:i + 1])
        return [torch.cat(x) for x in out]


@contextlib.contextmanager
def hooked(m: MoEDecoder, wrap):
    """Within the block, every family call of the model runs as wrap(family, path, call, *args), attention's
    prefill (and packed prefill, where the file has one) with path "full" and its decode (paged or not) with
    "decode"; the model is given back unwrapped. (policy_logprobs' calls go through its differentiable `ops`
    instead.)"""
    op, attn = m._op, m.k["attention"]
    m._op = lambda family, path, *a, **kw: wrap(family, path, lambda *b: op(family, path, *b, **kw), *a)
    entries = {n: path for n, path in (("prefill", "full"), ("prefill_packed", "full"), ("decode", "decode"),
                                       ("decode_paged", "decode")) if hasattr(attn, n)}
    m.k = {**m.k, "attention": SimpleNamespace(**{
        n: (lambda *a, n=n, path=path: wrap("attention", path, getattr(attn, n), *a)) for n, path in entries.items()})}
    try:
        yield
    finally:
        m._op, m.k = op, {**m.k, "attention": attn}
