"""Per-head QK RMSNorm family harness (Qwen3 style): inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import SPREAD, draw_scale, spread_randn

EPS = 1e-6


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


class QKRMSNormFamily(Family):
    name = "qk_rmsnorm"
    entry_points = ("qk_rmsnorm_full", "qk_rmsnorm_decode")
    signatures = tuple(
        EntryPoint(name, ("q", "k", "q_weight", "k_weight", "eps", "q_out", "k_out", "q32", "k32"),
                   writes=("q_out", "k_out", "q32", "k32"), optional=("q32", "k32"))
        for name in entry_points)
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "q_heads", "kv_heads", "head_dim"),
                       "decode": ("batch", "q_heads", "kv_heads", "head_dim")}
    knobs = (
        Knob("HEADS_PER_TILE", (1, 2, 4, 8, 16, 32, 64), "contract",
             "head rows per 2-D tile; sets the reduction layout of each row sum, so both paths change together"),
        Knob("NUM_WARPS", (1, 2, 4, 8), "contract", "warps per tile; changes the row sum's bits"),
        Knob("CAST_BEFORE_WEIGHT", (False, True), "contract",
             "round the normalised row to bf16 before the weight multiply (the HF eager order) or stay in fp32"),
        Knob("FULL_TILES_PER_PROGRAM", (1, 2, 4, 8), "full", "tiles walked by one program in the full path"),
        Knob("FULL_NUM_STAGES", (1, 2, 3), "full", "software pipelining depth of the full path"),
        Knob("DECODE_TILES_PER_PROGRAM", (1, 2, 4), "decode", "tiles walked by one program in decode"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3), "decode", "software pipelining depth of decode"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("tile_height", "Taller or shorter head tiles: fewer programs and wider loads vs more "
                            "parallelism at decode batch 1 (joint: the reduction layout changes)",
                            knobs=("HEADS_PER_TILE", "NUM_WARPS")),
            OpportunitySpec("full_schedule", "Several tiles per program in the full path to cut program count "
                            "at 4K-32K tokens", paths=("full",),
                            knobs=("FULL_TILES_PER_PROGRAM", "FULL_NUM_STAGES")),
            OpportunitySpec("decode_schedule", "Decode launch shape for batches of 1-256 (launch-bound)",
                            paths=("decode",), knobs=("DECODE_TILES_PER_PROGRAM", "DECODE_NUM_STAGES")),
            OpportunitySpec("fuse_rope", "Fuse the following RoPE into the same pass (read q/k once); both paths "
                            "must then share the fused per-row function and keep the norm's reduction layout"),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 13, "q_heads": 4, "kv_heads": 2, "head_dim": 128, "seqs": 3}]
        return [
            # Row (token, head) scales spread over four decades: skipping the normalisation shows at once.
            {"tokens": 13, "q_heads": 4, "kv_heads": 2, "head_dim": 128, "seqs": 3, "scale": 1.0, "spread": SPREAD},
            {"tokens": 29, "q_heads": 12, "kv_heads": 2, "head_dim": 128, "seqs": 5, "scale": 30.0},
            {"tokens": 9, "q_heads": 6, "kv_heads": 3, "head_dim": 64, "seqs": 4, "scale": 0.01},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Head counts giving row counts (tokens x heads) that no HEADS_PER_TILE divides; GQA groups up to 8.
        tokens, kv, group = (9, 3, 4) if interp.interpreting() else (300, 8, 8)

        def shape(t: int) -> dict[str, Any]:
            hk = rng.randint(1, kv)
            return {"tokens": t, "q_heads": hk * rng.randint(1, group), "kv_heads": hk,
                    "head_dim": rng.choice((64, 128)), "seqs": rng.randint(1, min(t, 5))}

        t = rng.randint(2, tokens)
        return [
            # Tiny inputs and padding tokens (every head zero: normalised to 0), one of them a decoded token.
            {**shape(t), "scale": draw_scale(rng, "tiny"), "zero_rows": sorted({rng.randrange(t), t - 1})},
            {**shape(1), "scale": draw_scale(rng, "large")},  # one token, large inputs
            {**shape(rng.randint(2, tokens)), "scale": 1.0, "spread": SPREAD},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        T, hq, hk, d, seqs = case["tokens"], case["q_heads"], case["kv_heads"], case["head_dim"], case["seqs"]
        scale = case.get("scale", 1.0)
        tag = f"T{T}xHq{hq}xHk{hk}xD{d}/seed{seed}"
        g = checks.generator(seed)
        if case.get("spread"):  # every (token, head) row its own scale
            q = spread_randn((T, hq, d), g, device, scale, case["spread"])
            k = spread_randn((T, hk, d), g, device, scale, case["spread"])
        else:
            q = checks.randn((T, hq, d), g, torch.bfloat16, device, scale)
            k = checks.randn((T, hk, d), g, torch.bfloat16, device, scale)
        for i in case.get("zero_rows", ()):  # padding tokens
            q[i], k[i] = 0, 0
        qw = checks.randn((d,), g, torch.bfloat16, device, 0.5) + 1.0
        kw = checks.randn((d,), g, torch.bfloat16, device, 0.5) + 1.0
        # fp32 values rounded to bf16 before the weight multiply (HF order) carry bf16 error by design.
        tol32 = 8e-3 if getattr(impl, "KNOBS", {}).get("CAST_BEFORE_WEIGHT") else 1e-5
        fq, fk, fq32, fk32 = _outputs(T, hq, hk, d, device)
        impl.qk_rmsnorm_full(q, k, qw, kw, EPS, fq, fk, fq32, fk32)
        qr, kr = reference(q, qw), reference(k, kw)
        out = [checks.finite(f"full q finite {tag}", fq), checks.finite(f"full k finite {tag}", fk),
               checks.finite(f"full q fp32 finite {tag}", fq32), checks.finite(f"full k fp32 finite {tag}", fk32),
               checks.reference(f"full q vs fp64 {tag}", fq, qr), checks.reference(f"full k vs fp64 {tag}", fk, kr),
               checks.reference(f"full q fp32 vs fp64 {tag}", fq32, qr, tol=tol32),
               checks.reference(f"full k fp32 vs fp64 {tag}", fk32, kr, tol=tol32)]
        bounds = torch.linspace(0, T, seqs + 1).round().long()[1:] - 1
        dq, dk, dq32, dk32 = _outputs(seqs, hq, hk, d, device)
        impl.qk_rmsnorm_decode(q[bounds].contiguous(), k[bounds].contiguous(), qw, kw, EPS, dq, dk, dq32, dk32)
        out += [checks.bitwise(f"decode q == full rows (bf16) {tag}", dq, fq[bounds]),
                checks.bitwise(f"decode k == full rows (bf16) {tag}", dk, fk[bounds]),
                checks.bitwise(f"decode q == full rows (fp32) {tag}", dq32, fq32[bounds]),
                checks.bitwise(f"decode k == full rows (fp32) {tag}", dk32, fk32[bounds])]
        oq, ok, oq32, ok32 = _outputs(1, hq, hk, d, device)
        impl.qk_rmsnorm_decode(q[bounds[-1:]].contiguous(), k[bounds[-1:]].contiguous(), qw, kw, EPS,
                               oq, ok, oq32, ok32)
        out += [checks.bitwise(f"decode alone == in batch q (fp32) {tag}", oq32, dq32[-1:]),
                checks.bitwise(f"decode alone == in batch k (fp32) {tag}", ok32, dk32[-1:]),
                checks.bitwise(f"decode alone == in batch q (bf16) {tag}", oq, dq[-1:])]
        p = int(bounds[seqs // 2]) + 1
        pq, pk, pq32, pk32 = _outputs(p, hq, hk, d, device)
        impl.qk_rmsnorm_full(q[:p].contiguous(), k[:p].contiguous(), qw, kw, EPS, pq, pk, pq32, pk32)
        out += [checks.bitwise(f"prompt-only full == prefix q (fp32) {tag}", pq32, fq32[:p]),
                checks.bitwise(f"prompt-only full == prefix k (fp32) {tag}", pk32, fk32[:p]),
                checks.bitwise(f"prompt-only full == prefix q (bf16) {tag}", pq, fq[:p])]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        full = workload["phase"] == "full"
        T = workload["tokens"] if full else workload["batch"]
        hq, hk, d = workload["q_heads"], workload["kv_heads"], workload["head_dim"]
        fn = impl.qk_rmsnorm_full if full else impl.qk_rmsnorm_decode
        g = checks.generator(seed)
        tok_bytes = (hq + hk) * d * 2 * 2
        copies = checks.input_copies(device, T * tok_bytes)
        qs = [checks.randn((T, hq, d), g, torch.bfloat16, device) for _ in range(copies)]
        ks = [checks.randn((T, hk, d), g, torch.bfloat16, device) for _ in range(copies)]
        qw = checks.randn((d,), g, torch.bfloat16, device, 0.5) + 1.0
        kw = checks.randn((d,), g, torch.bfloat16, device, 0.5) + 1.0
        qo = torch.empty((T, hq, d), dtype=torch.bfloat16, device=device)
        ko = torch.empty((T, hk, d), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda q, k: fn(q, k, qw, kw, EPS, qo, ko), qs, ks)

        def verify() -> list[Check]:
            # (token, head) rows over four decades of scale: a kernel skipping the normalisation fails by far.
            fg = checks.generator(seed + 7919)
            fq = spread_randn((T, hq, d), fg, device)
            fk = spread_randn((T, hk, d), fg, device)
            checks.poison(qo, ko)
            fn(fq, fk, qw, kw, EPS, qo, ko)
            return [checks.finite("fresh q finite", qo), checks.finite("fresh k finite", ko),
                    checks.reference("fresh q vs fp64", qo, reference(fq, qw)),
                    checks.reference("fresh k vs fp64", ko, reference(fk, kw))]

        return Bench(run=run, verify=verify, bytes_moved=T * tok_bytes + 4 * d,
                     graph_friendly=not full or T * (hq + hk) * d < (1 << 20))


def _outputs(T: int, hq: int, hk: int, d: int, device: str):
    outs = (torch.empty((T, hq, d), dtype=torch.bfloat16, device=device),
            torch.empty((T, hk, d), dtype=torch.bfloat16, device=device),
            torch.empty((T, hq, d), dtype=torch.float32, device=device),
            torch.empty((T, hk, d), dtype=torch.float32, device=device))
    checks.poison(*outs)
    return outs
