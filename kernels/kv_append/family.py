"""KV-cache append family harness: paged/contiguous caches, rollout vs full-pass cache bytes, benches, knobs."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import odd


def make_block_table(lengths: list[int], page_size: int, g: torch.Generator, spare: int = 3):
    """A shuffled page assignment (pages of one sequence are not adjacent) and the page count."""
    pages = [-(-n // page_size) for n in lengths]
    n_pages = sum(pages) + spare
    perm = torch.randperm(n_pages, generator=g)
    table = torch.zeros((len(lengths), max(pages)), dtype=torch.int32)
    i = 0
    for b, p in enumerate(pages):
        table[b, :p] = perm[i:i + p].to(torch.int32)
        i += p
    return table, n_pages


def reference_cache(cache: torch.Tensor, rows: torch.Tensor, table: torch.Tensor, seq: torch.Tensor,
                    pos: torch.Tensor) -> torch.Tensor:
    """Exact expected cache: `rows[i]` at sequence seq[i], absolute position pos[i]."""
    out = cache.clone()
    page_size = cache.shape[1]
    pages = table[seq.long(), (pos // page_size).long()].long()
    out[pages, (pos % page_size).long()] = rows
    return out


def slots_of(table: torch.Tensor, seq: list[int], pos: list[int], page_size: int) -> torch.Tensor:
    """vLLM's slot mapping of tokens (seq[i], pos[i]): flat cache row table[seq, pos // page] * page + pos % page."""
    s, p = (torch.tensor(x, dtype=torch.long, device=table.device) for x in (seq, pos))
    return table[s, p // page_size].long() * page_size + p % page_size


def _slots_checks(impl: ModuleType, ks, vs, prompts, answers, table, page_size: int, init, full, g,
                  tag: str) -> list[Check]:
    """D: the rollout's tokens through `kv_append_slots` == the full pass: the prompts in one call (int64 slots), then
    every answer token in another (int32 slots; an engine's step mixes sequences and positions alike, and the slot
    path has no other order). Each call's rows are views of one fused projection row (K, V and padding side by
    side), and a padding token (slot -1) with huge values sits among them: never written."""
    B, (hk, d) = len(prompts), ks[0].shape[1:]
    W = hk * d
    sk, sv = init[0].clone(), init[1].clone()

    def call(rows: list[tuple[int, int]], dtype: torch.dtype) -> None:
        k = torch.stack([ks[b][t] for b, t in rows]) if rows else ks[0][:0]
        v = torch.stack([vs[b][t] for b, t in rows]) if rows else vs[0][:0]
        slots = slots_of(table, [b for b, _ in rows], [t for _, t in rows], page_size)
        pad_at = int(torch.randint(0, len(rows) + 1, (1,), generator=g))
        k = torch.cat([k[:pad_at], torch.full_like(ks[0][:1], 1e4), k[pad_at:]])
        v = torch.cat([v[:pad_at], torch.full_like(vs[0][:1], -1e4), v[pad_at:]])
        slots = torch.cat([slots[:pad_at], torch.tensor([-1], device=slots.device), slots[pad_at:]]).to(dtype)
        fused = torch.cat([k.reshape(-1, W), v.reshape(-1, W), torch.zeros_like(k.reshape(-1, W)[:, :3])], 1)
        impl.kv_append_slots(fused[:, :W].view(-1, hk, d), fused[:, W:2 * W].view(-1, hk, d), sk, sv,
                             slots.contiguous())

    call([(b, t) for b in range(B) for t in range(prompts[b])], torch.int64)
    call([(b, prompts[b] + s) for s in range(max(answers)) for b in range(B) if answers[b] > s], torch.int32)
    return [checks.bitwise(f"slot-mapped rollout K cache == full pass {tag}", sk, full[0]),
            checks.bitwise(f"slot-mapped rollout V cache == full pass {tag}", sv, full[1])]


class KVAppendFamily(Family):
    name = "kv_append"
    entry_points = ("kv_append_full", "kv_append_decode", "kv_append_slots")
    signatures = (
        EntryPoint("kv_append_full", ("k", "v", "k_cache", "v_cache", "block_table", "cu_seqlens", "start_pos",
                                      "max_seqlen"), writes=("k_cache", "v_cache"), updates=("k_cache", "v_cache")),
        EntryPoint("kv_append_decode", ("k", "v", "k_cache", "v_cache", "block_table", "positions"),
                   writes=("k_cache", "v_cache"), updates=("k_cache", "v_cache")),
        # vLLM's form: a flat cache row per token (negative: padding, not written)
        EntryPoint("kv_append_slots", ("k", "v", "k_cache", "v_cache", "slot_mapping"),
                   writes=("k_cache", "v_cache"), updates=("k_cache", "v_cache")),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "seq_len", "kv_heads", "head_dim", "page_size"),
                       "decode": ("batch", "context", "kv_heads", "head_dim", "page_size")}
    knobs = (
        Knob("FULL_TOKENS_PER_PROGRAM", (1, 2, 4, 8, 16, 32), "full", "tokens copied by one program (full)"),
        Knob("FULL_NUM_WARPS", (1, 2, 4, 8), "full", "warps per program (full)"),
        Knob("DECODE_TOKENS_PER_PROGRAM", (1, 2, 4, 8), "decode", "sequences copied by one program (decode)"),
        Knob("DECODE_NUM_WARPS", (1, 2, 4, 8), "decode", "warps per program (decode)"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("full_schedule", "More tokens per program (page lookups amortised, fewer programs) "
                            "and the warp count that saturates bandwidth for 4K-32K token prompts",
                            paths=("full",), knobs=("FULL_TOKENS_PER_PROGRAM", "FULL_NUM_WARPS")),
            OpportunitySpec("decode_schedule", "Decode writes 1-256 rows: launch-bound; warps per row",
                            paths=("decode",), knobs=("DECODE_TOKENS_PER_PROGRAM", "DECODE_NUM_WARPS")),
            OpportunitySpec("fuse_rope", "Append the rotated K directly from the RoPE kernel (one pass fewer); "
                            "both paths must keep writing identical bytes"),
            OpportunitySpec("fp8_cache", "An fp8 cache with a fixed per-head scale: the quantisation must be one "
                            "shared function so both paths write identical bytes (changes attention's inputs)"),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"prompts": [5, 9, 3], "answers": [3, 1, 4], "page_size": 4, "kv_heads": 2, "head_dim": 64}]
        return [
            {"prompts": [5, 9, 3], "answers": [3, 1, 4], "page_size": 4, "kv_heads": 2, "head_dim": 64},
            {"prompts": [17, 1, 11, 6], "answers": [2, 5, 0, 3], "page_size": 16, "kv_heads": 8, "head_dim": 128},
            # Contiguous cache: one page per sequence, page_size = max length.
            {"prompts": [7, 13], "answers": [4, 2], "page_size": 0, "kv_heads": 4, "head_dim": 128},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd lengths and page sizes (no page or token tile divides them); a one-token prompt; batch of one.
        batch, prompt, answer = (4, 12, 4) if interp.interpreting() else (8, 1500, 40)

        def shape() -> dict[str, Any]:
            return {"kv_heads": rng.randint(1, 8), "head_dim": rng.choice((64, 128)),
                    "page_size": rng.choice((0, 1, odd(rng, 3, 15), 16, odd(rng, 17, 63)))}

        b = rng.randint(2, batch)
        prompts = [odd(rng, 1, prompt) for _ in range(b)]
        prompts[rng.randrange(b)] = 1
        return [
            {"prompts": prompts, "answers": [rng.randint(0, answer) for _ in range(b)], **shape()},
            {"prompts": [odd(rng, 1, prompt)], "answers": [rng.randint(1, answer)], **shape()},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        prompts, answers = case["prompts"], case["answers"]
        hk, d = case["kv_heads"], case["head_dim"]
        totals = [p + a for p, a in zip(prompts, answers)]
        B = len(prompts)
        tag = f"P{prompts}+A{answers}xHk{hk}xD{d}/page{case['page_size']}/seed{seed}"
        g = checks.generator(seed)
        page_size = case["page_size"] or max(totals)
        if case["page_size"]:
            table, n_pages = make_block_table(totals, page_size, g)
        else:
            table, n_pages = torch.arange(B, dtype=torch.int32)[:, None], B
        table = table.to(device)
        # Per-sequence K/V of the whole prompt+answer; the packed full pass is their concatenation.
        ks = [checks.randn((n, hk, d), g, torch.bfloat16, device) for n in totals]
        vs = [checks.randn((n, hk, d), g, torch.bfloat16, device) for n in totals]
        init_k = checks.randn((n_pages, page_size, hk, d), g, torch.bfloat16, device, 100.0)
        init_v = checks.randn((n_pages, page_size, hk, d), g, torch.bfloat16, device, 100.0)

        def packed(lens, offs=None):
            offs = offs or [0] * B
            k = torch.cat([ks[b][offs[b]:offs[b] + lens[b]] for b in range(B)]).contiguous()
            v = torch.cat([vs[b][offs[b]:offs[b] + lens[b]] for b in range(B)]).contiguous()
            cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
            return k, v, cu, torch.tensor(offs, dtype=torch.int32, device=device)

        # A: one full pass over prompt+answer (the policy update's view).
        fk, fv = init_k.clone(), init_v.clone()
        k, v, cu, st = packed(totals)
        impl.kv_append_full(k, v, fk, fv, table, cu, st, max(totals))
        seq = torch.repeat_interleave(torch.arange(B), torch.tensor(totals)).to(device)
        pos = torch.cat([torch.arange(n) for n in totals]).to(device)
        rk = reference_cache(init_k, k, table, seq, pos)
        rv = reference_cache(init_v, v, table, seq, pos)
        out = [checks.bitwise(f"full K cache == exact reference {tag}", fk, rk),
               checks.bitwise(f"full V cache == exact reference {tag}", fv, rv)]
        # B: rollout: prefill the prompts, then decode the answers one token per active sequence.
        dk, dv = init_k.clone(), init_v.clone()
        k, v, cu, st = packed(prompts)
        impl.kv_append_full(k, v, dk, dv, table, cu, st, max(prompts))
        for s in range(max(answers)):
            act = [b for b in range(B) if answers[b] > s]
            idx = torch.tensor(act, device=device)
            k = torch.stack([ks[b][prompts[b] + s] for b in act]).contiguous()
            v = torch.stack([vs[b][prompts[b] + s] for b in act]).contiguous()
            p = torch.tensor([prompts[b] + s for b in act], dtype=torch.int32, device=device)
            impl.kv_append_decode(k, v, dk, dv, table[idx].contiguous(), p)
        out += [checks.bitwise(f"prefill+decode K cache == full pass {tag}", dk, fk),
                checks.bitwise(f"prefill+decode V cache == full pass {tag}", dv, fv)]
        # C: chunked prefill (first half, then the rest from its absolute start) == one full pass.
        ck, cv = init_k.clone(), init_v.clone()
        first = [n // 2 for n in totals]
        rest = [n - f for n, f in zip(totals, first)]
        k, v, cu, st = packed(first)
        impl.kv_append_full(k, v, ck, cv, table, cu, st, max(first))
        k, v, cu, st = packed(rest, first)
        impl.kv_append_full(k, v, ck, cv, table, cu, st, max(rest))
        out += [checks.bitwise(f"chunked prefill K cache == full pass {tag}", ck, fk),
                checks.bitwise(f"chunked prefill V cache == full pass {tag}", cv, fv)]
        if hasattr(impl, "kv_append_slots"):  # (files from before it existed: no check)
            out += _slots_checks(impl, ks, vs, prompts, answers, table, page_size, (init_k, init_v), (fk, fv), g, tag)
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        full = workload["phase"] == "full"
        hk, d, page = workload["kv_heads"], workload["head_dim"], workload["page_size"]
        g = checks.generator(seed)
        if full:
            T, L = workload["tokens"], workload["seq_len"]
            lens = [L] * (T // L) + ([T % L] if T % L else [])
        else:
            T, ctx = workload["batch"], workload["context"]
            lens = [ctx + 1] * T
        table, n_pages = make_block_table(lens, page, g, spare=0)
        table = table.to(device)
        kc = checks.randn((n_pages, page, hk, d), g, torch.bfloat16, device)
        vc = checks.randn((n_pages, page, hk, d), g, torch.bfloat16, device)
        tok_bytes = hk * d * 2 * 2
        copies = checks.input_copies(device, T * tok_bytes)
        kn = [checks.randn((T, hk, d), g, torch.bfloat16, device) for _ in range(copies)]
        vn = [checks.randn((T, hk, d), g, torch.bfloat16, device) for _ in range(copies)]
        if full:
            cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32).to(device)
            st = torch.zeros(len(lens), dtype=torch.int32, device=device)
            seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).to(device)
            pos = torch.cat([torch.arange(n) for n in lens]).to(device)

            def call(k, v):
                impl.kv_append_full(k, v, kc, vc, table, cu, st, max(lens))
        else:
            seq = torch.arange(T, device=device)
            pos = torch.full((T,), workload["context"], dtype=torch.int32, device=device)

            def call(k, v):
                impl.kv_append_decode(k, v, kc, vc, table, pos)

        run = checks.rotate(call, kn, vn)

        def verify() -> list[Check]:
            fg = checks.generator(seed + 7919)
            fk = checks.randn((T, hk, d), fg, torch.bfloat16, device)
            fv = checks.randn((T, hk, d), fg, torch.bfloat16, device)
            before_k, before_v = kc.clone(), vc.clone()
            call(fk, fv)
            return [checks.bitwise("fresh K cache == exact reference", kc,
                                   reference_cache(before_k, fk, table, seq, pos)),
                    checks.bitwise("fresh V cache == exact reference", vc,
                                   reference_cache(before_v, fv, table, seq, pos))]

        return Bench(run=run, verify=verify, bytes_moved=T * tok_bytes * 2,
                     graph_friendly=not full or T * hk * d < (1 << 20))
