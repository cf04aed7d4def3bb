"""A tiny decoder built only from the families' unified kernels, to check the product claim end to end:
the log-probs a rollout records (prefill, then one decode step per token with a KV cache) equal, bit for bit,
the log-probs one full-sequence training forward computes — so the trainer needs no recompute pass.

Layer: embedding → RMSNorm → QKV linear → NeoX RoPE → causal GQA attention → O linear → residual →
RMSNorm → gate/up linear → SiLU-and-mul → down linear → residual; then final RMSNorm → lm_head → log-prob.
Each kernel is the family's root (or any implementation passed in `impls`); the training forward uses every
family's full-sequence entry point, rollout the decode ones after a prompt prefill. Residual adds and
layout copies are torch elementwise ops/copies, identical in both paths.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import torch

from tik_evo_kernels.attention.autograd import prefill_packed

FAMILIES = ("embedding", "rmsnorm", "linear", "rope", "attention", "silu_mul", "logprob")
EPS = 1e-6


@dataclass
class Shape:
    vocab: int = 512
    hidden: int = 128
    q_heads: int = 2
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 256
    max_pos: int = 64
    theta: float = 1e6


def roots(families: tuple[str, ...] = FAMILIES) -> dict[str, ModuleType]:
    return {f: importlib.import_module(f"tik_evo_kernels.{f}.root") for f in families}


def with_sets(sets: dict[str, str], where: str = "decoder",
              families: tuple[str, ...] = FAMILIES) -> dict[str, ModuleType]:
    """The roots, with each family named in `sets` loaded as that named knob set instead (e.g. {"attention":
    "hopper_bn128_tma_s512"}); a family or set name that does not exist is refused naming both."""
    from tik_evo.candidate import load_source
    from tik_evo.families import load_family
    from tik_evo.initialization import knob_changes, source_with

    impls = roots(families)
    for family, name in sets.items():
        if family not in impls:
            raise ValueError(f"{where}: {family!r} is not a family of the decoder ({', '.join(families)})")
        fam = load_family(family)
        changes = knob_changes(fam, name, {}, where, keys=(f"{family} set", f"{family} knobs"))
        impls[family] = load_source(source_with(fam, changes), f"{family}_{name}")
    return impls


def rope(model, path: str, q, k, positions, q_out, k_out) -> None:
    """The model's RoPE kernel on its cos/sin table, given the table's frequencies too where the entry point takes
    them (a kernel computing cos/sin itself, COS_SIN "sincos", needs them)."""
    from tik_evo_kernels.rope.family import inv_freq_kwargs

    kw = inv_freq_kwargs(getattr(model.k["rope"], f"rope_{path}"), model.inv_freq)
    model._op("rope", path, q, k, model.cos, model.sin, positions, q_out, k_out, **kw)


class TinyDecoder:
    def __init__(self, shape: Shape, seed: int, device: str, impls: dict[str, ModuleType] | None = None,
                 temperature: float = 1.0):
        from tik_evo_kernels.rope.family import inv_freq, rope_table

        self.s, self.device = shape, device
        self.temperature = temperature  # the sampling temperature; the trainer must apply the same one
        self.k = impls or roots()
        g = torch.Generator().manual_seed(seed)

        def w(*dims: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(dims, generator=g) * scale / math.sqrt(dims[-1])).to(device, torch.bfloat16)

        s = shape
        qkv = (s.q_heads + 2 * s.kv_heads) * s.head_dim
        self.embed = (torch.randn((s.vocab, s.hidden), generator=g)).to(device, torch.bfloat16)
        self.norm1, self.norm2, self.norm_f = ((1 + 0.1 * torch.randn(s.hidden, generator=g)).to(
            device, torch.bfloat16) for _ in range(3))
        self.w_qkv, self.w_o = w(qkv, s.hidden), w(s.hidden, s.q_heads * s.head_dim)
        self.w_gate, self.w_up = w(s.intermediate, s.hidden), w(s.intermediate, s.hidden)
        self.w_down = w(s.hidden, s.intermediate)
        self.w_lm = w(s.vocab, s.hidden, scale=4.0)
        self.cos, self.sin = rope_table(s.max_pos, s.head_dim, s.theta, None, device)
        self.inv_freq = inv_freq(s.head_dim, s.theta).to(device)  # the table's frequencies: COS_SIN "sincos" kernels

    # -- one op, either path ---------------------------------------------------------------------------------
    def _op(self, family: str, path: str, *args, **kwargs):
        return getattr(self.k[family], f"{family}_{path}")(*args, **kwargs)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, path: str) -> torch.Tensor:
        out = torch.empty((x.shape[0], weight.shape[0]), device=self.device, dtype=torch.bfloat16)
        self._op("linear", path, x, weight, None, out)
        return out

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, path: str) -> torch.Tensor:
        out = torch.empty_like(x)
        self._op("rmsnorm", path, x, weight, EPS, out)
        return out

    def _layer_in(self, ids: torch.Tensor, positions: torch.Tensor, path: str):
        """Embedding → norm → QKV → RoPE for a batch of rows (tokens); returns h, q, k, v (rows first)."""
        s = self.s
        h = torch.empty((ids.shape[0], s.hidden), device=self.device, dtype=torch.bfloat16)
        self._op("embedding", path, ids, self.embed, h)
        qkv = self._linear(self._norm(h, self.norm1, path), self.w_qkv, path)
        nq, nkv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        q = qkv[:, :nq].reshape(-1, s.q_heads, s.head_dim).contiguous()
        k = qkv[:, nq:nq + nkv].reshape(-1, s.kv_heads, s.head_dim).contiguous()
        v = qkv[:, nq + nkv:].reshape(-1, s.kv_heads, s.head_dim).contiguous()
        q_r, k_r = torch.empty_like(q), torch.empty_like(k)
        rope(self, path, q, k, positions, q_r, k_r)
        return h, q_r, k_r, v

    def _layer_out(self, h: torch.Tensor, attn: torch.Tensor, path: str) -> torch.Tensor:
        """O projection, residual, MLP, residual, final norm, lm_head: logits for each row."""
        h = h + self._linear(attn, self.w_o, path)
        x = self._norm(h, self.norm2, path)
        gate, up = self._linear(x, self.w_gate, path), self._linear(x, self.w_up, path)
        act = torch.empty_like(gate)
        self._op("silu_mul", path, gate, up, act)
        h = h + self._linear(act, self.w_down, path)
        return self._linear(self._norm(h, self.norm_f, path), self.w_lm, path)

    def _logprob(self, logits: torch.Tensor, targets: torch.Tensor, path: str) -> torch.Tensor:
        lp = torch.empty(logits.shape[0], device=self.device, dtype=torch.float32)
        ent = torch.empty_like(lp)
        self._op("logprob", path, logits, targets, self.temperature, lp, ent)
        return lp

    def _attend_full(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        impl, n = self.k["attention"], q.shape[0]
        if hasattr(impl, "prefill_packed"):  # the rows in place: a batch of one sequence, no head-first copies
            return prefill_packed(impl, q, k, v, [0, n], 1 / math.sqrt(self.s.head_dim)).reshape(n, -1)
        out = torch.empty_like(_heads_first(q))
        self.k["attention"].prefill(_heads_first(q), _heads_first(k), _heads_first(v), 1 / math.sqrt(self.s.head_dim),
                                    out)
        return out[0].transpose(0, 1).reshape(q.shape[0], -1).contiguous()

    # -- the two ways log-probs are computed ------------------------------------------------------------------
    def training_logprobs(self, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """One full-sequence forward (the policy update): log-probs of tokens[prompt_len:]."""
        pos = torch.arange(tokens.numel(), device=self.device, dtype=torch.int32)
        h, q, k, v = self._layer_in(tokens, pos, "full")
        logits = self._layer_out(h, self._attend_full(q, k, v), "full")
        return self._logprob(logits[prompt_len - 1:-1].contiguous(), tokens[prompt_len:].contiguous(), "full")

    def rollout_logprobs(self, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """Prefill the prompt, then decode the answer one token at a time from a KV cache, recording each
        answer token's log-prob as an inference engine would."""
        s, n = self.s, tokens.numel()
        pos = torch.arange(prompt_len, device=self.device, dtype=torch.int32)
        h, q, k, v = self._layer_in(tokens[:prompt_len], pos, "full")
        k_cache = torch.zeros((1, s.kv_heads, n, s.head_dim), device=self.device, dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        k_cache[0, :, :prompt_len] = k.transpose(0, 1)
        v_cache[0, :, :prompt_len] = v.transpose(0, 1)
        logits = self._layer_out(h, self._attend_full(q, k, v), "full")
        out = [self._logprob(logits[-1:].contiguous(), tokens[prompt_len:prompt_len + 1].contiguous(), "decode")]
        for t in range(prompt_len, n - 1):
            h, q, k, v = self._layer_in(tokens[t:t + 1], torch.tensor([t], device=self.device, dtype=torch.int32),
                                        "decode")
            k_cache[0, :, t] = k[0]
            v_cache[0, :, t] = v[0]
            attn = torch.empty((1, s.q_heads, 1, s.head_dim), device=self.device, dtype=torch.bfloat16)
            ctx = torch.tensor([t + 1], device=self.device, dtype=torch.int32)
            self.k["attention"].decode(q.reshape(1, s.q_heads, 1, s.head_dim).contiguous(), k_cache, v_cache, ctx,
                                       1 / math.sqrt(s.head_dim), attn)
            logits = self._layer_out(h, attn.reshape(1, -1), "decode")
            out.append(self._logprob(logits, tokens[t + 1:t + 2].contiguous(), "decode"))
        return torch.cat(out)


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, dim] -> [1, heads, tokens, dim], the attention family's layout (an exact copy)."""
    return t.transpose(0, 1).unsqueeze(0).contiguous()
