"""NeoX RoPE family harness: fp32 cos/sin table by absolute position, checks, benches, knobs, opportunities."""

from __future__ import annotations

import functools
import inspect
import math
import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Backward, Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd

_ROPE_PARAMS = ("q", "k", "cos", "sin", "positions", "q_out", "k_out", "q32", "k32", "inv_freq", "rows")


def inv_freq(head_dim: int, theta: float, scaling: str | None = None) -> torch.Tensor:
    """fp64 inverse frequencies; `scaling="llama3"` applies Llama-3.1's frequency-dependent rescale."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling == "llama3":
        factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192.0
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > old_ctx / low, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv = torch.where(medium, smoothed, inv_l)
    elif scaling not in (None, "none"):
        raise ValueError(f"unknown rope scaling {scaling!r}")
    return inv


def rope_table(max_pos: int, head_dim: int, theta: float, scaling: str | None, device: str):
    """The one fp32 cos/sin table [max_pos, head_dim // 2], computed in fp64 and rounded once."""
    return table_from_inv_freq(inv_freq(head_dim, theta, scaling), max_pos, device)


def table_from_inv_freq(inv64: torch.Tensor, max_pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_pos, len(inv64)] from fp64 inverse frequencies: angles in fp64, rounded to fp32 once."""
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv64.double()[None, :]
    return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    half = xd.shape[-1] // 2
    c = cos.double()[pos.long()][:, None, :]
    s = sin.double()[pos.long()][:, None, :]
    x1, x2 = xd[..., :half], xd[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def inv_freq_kwargs(fn, inv: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``{"inv_freq": inv}`` when the entry point takes it (candidates older than the knob COS_SIN do not)."""
    return {"inv_freq": inv} if inv is not None and takes(fn, "inv_freq") else {}


@functools.lru_cache(maxsize=1024)  # the model asks on every RoPE call; a signature costs microseconds to read
def takes(fn, arg: str) -> bool:
    try:
        return arg in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def takes_rows(impl: ModuleType) -> bool:
    """Whether every entry point takes pre-gathered ``rows`` (not with COS_SIN="sincos", which refuses them; read
    from each entry point's own module, as a test's hybrid candidate mixes two)."""
    fns = [getattr(impl, ep, None) for ep in RoPEFamily.entry_points]
    return all(takes(fn, "rows") and getattr(fn, "__globals__", {}).get("KNOBS", {}).get("COS_SIN") != "sincos"
               for fn in fns)


def gathered(cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The harness's own copy of each token's table rows (not the candidate's gather_rows)."""
    return cos[pos.long()].contiguous(), sin[pos.long()].contiguous()


def packed_positions(lengths: list[int], start: int = 0) -> torch.Tensor:
    return torch.cat([torch.arange(start, start + n) for n in lengths]).to(torch.int32)


class RoPEFamily(Family):
    name = "rope"
    entry_points = ("rope_full", "rope_decode", "rope_backward")
    # cos/sin/positions may be None where `rows` (pre-gathered table rows) is given; inv_freq is passed where the
    # entry point takes it (read with COS_SIN="sincos"). The harness gathers rows itself: gather_rows is not called.
    signatures = (
        *(EntryPoint(name, _ROPE_PARAMS, writes=("q_out", "k_out", "q32", "k32"), optional=("q32", "k32"))
          for name in ("rope_full", "rope_decode")),
        Backward("rope_backward", ("grad_q", "grad_k", "cos", "sin", "positions", "dq", "dk", "inv_freq", "rows"),
                   writes=("dq", "dk")),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "seq_len", "q_heads", "kv_heads", "head_dim", "theta"),
                       "decode": ("batch", "context", "q_heads", "kv_heads", "head_dim", "theta")}
    knobs = (
        Knob("ROUND_TABLE_TO_BF16", (False, True), "contract",
             "round cos/sin to bf16 before the fp32 rotation (HF casts the table to the activation dtype)"),
        Knob("COS_SIN", ("table", "sincos"), "contract",
             "cos/sin gathered from the fp32 table by position, or computed in the kernel from the position and "
             "the fp64 inv_freq (fp64 angle and pi/2 reduction, fp32 polynomials; no dependent table load)"),
        Knob("FULL_TOKENS_PER_PROGRAM", (1, 2, 4, 8, 16), "full", "tokens rotated by one program (full path)"),
        Knob("FULL_NUM_WARPS", (1, 2, 4, 8), "full", "warps per program (full path; elementwise, no reduction)"),
        Knob("FULL_NUM_STAGES", (1, 2, 3), "full", "software pipelining depth of the full path"),
        Knob("FULL_LOAD_ORDER", ("serial", "early"), "full",
             "serial: position -> cos/sin -> q -> store q -> k; early: position, all q/k loads, then cos/sin"),
        Knob("FULL_HEAD_SPLIT", (1, 2, 4), "full", "programs sharing one token's q and k heads (full path)"),
        Knob("DECODE_TOKENS_PER_PROGRAM", (1, 2, 4), "decode", "tokens rotated by one program (decode)"),
        Knob("DECODE_NUM_WARPS", (1, 2, 4, 8), "decode", "warps per program (decode)"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3), "decode", "software pipelining depth of decode"),
        Knob("DECODE_LOAD_ORDER", ("serial", "early"), "decode",
             "serial: position -> cos/sin -> q -> store q -> k; early: position, all q/k loads, then cos/sin"),
        Knob("DECODE_HEAD_SPLIT", (1, 2, 4, 0), "decode",
             "programs sharing one token's q and k heads (decode; more programs in flight at batch 1); 0 = auto: "
             "up to 4 while the launch still fits one wave of the GPU's SMs"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("full_schedule", "Several tokens per program (reuse of the index math, fewer "
                            "programs at 4K-32K tokens) and the warp count that saturates bandwidth",
                            paths=("full",), knobs=("FULL_TOKENS_PER_PROGRAM", "FULL_NUM_WARPS",
                                                    "FULL_NUM_STAGES")),
            OpportunitySpec("decode_schedule", "Decode launch shape for batches of 1-256: split heads across "
                            "programs or pack tokens", paths=("decode",),
                            knobs=("DECODE_TOKENS_PER_PROGRAM", "DECODE_NUM_WARPS", "DECODE_NUM_STAGES",
                                   "DECODE_HEAD_SPLIT")),
            OpportunitySpec("load_order", "Issue the q/k loads before the position -> cos/sin lookup chain and "
                            "before any store (serial order waits on position, table, then k after q's stores: "
                            "three round trips; Liger, with pre-gathered cos/sin, one)",
                            paths=("full", "decode"), knobs=("DECODE_LOAD_ORDER", "FULL_LOAD_ORDER")),
            OpportunitySpec("cos_sin_in_kernel", "Compute cos/sin from position and inv_freq in the kernel "
                            "(joint): no dependent table gather, at the price of ~30 instructions per angle "
                            "per thread; pays where the gather's L2 round trip is exposed (small decode)",
                            knobs=("COS_SIN",)),
            OpportunitySpec("table_precision", "Match the model's cast order for cos/sin (joint)",
                            knobs=("ROUND_TABLE_TO_BF16",)),
            OpportunitySpec("fuse_kv_append", "Write rotated k straight into the KV cache (fusing kv_append); "
                            "the rotation helper must stay shared by both paths"),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"lengths": [5, 9, 3], "q_heads": 4, "kv_heads": 2, "head_dim": 128, "theta": 1e6}]
        return [
            {"lengths": [5, 9, 3], "q_heads": 4, "kv_heads": 2, "head_dim": 128, "theta": 1e6},
            {"lengths": [17, 1, 11, 6], "q_heads": 12, "kv_heads": 2, "head_dim": 128, "theta": 1e6,
             "start": 3000, "scale": 30.0},
            {"lengths": [7, 13], "q_heads": 6, "kv_heads": 3, "head_dim": 64, "theta": 5e5, "scaling": "llama3",
             "start": 20000, "scale": 0.01},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd lengths (one of a single token) and head counts no tile or head split divides; far positions.
        seqs, length, kv, group, start = (3, 7, 3, 3, 40_000) if interp.interpreting() else (8, 300, 8, 8, 120_000)

        def shape() -> dict[str, Any]:
            hk = rng.randint(1, kv)
            return {"q_heads": hk * rng.randint(1, group), "kv_heads": hk, "head_dim": rng.choice((64, 128)),
                    "theta": rng.choice((1e4, 5e5, 1e6)), "scaling": rng.choice((None, "llama3")),
                    "start": rng.choice((0, rng.randrange(start)))}

        lengths = [odd(rng, 1, length) for _ in range(rng.randint(2, seqs))]
        lengths[rng.randrange(len(lengths))] = 1
        return [
            # Tiny inputs and padding tokens (zeros), one of them a sequence's last (decoded) token.
            {"lengths": lengths, **shape(), "scale": draw_scale(rng, "tiny"),
             "zero_rows": sorted({rng.randrange(sum(lengths)), sum(lengths) - 1})},
            # One sequence of one token, large inputs.
            {"lengths": [1], **shape(), "scale": draw_scale(rng, "large")},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        lengths = case["lengths"]
        hq, hk, d = case["q_heads"], case["kv_heads"], case["head_dim"]
        start, scale = case.get("start", 0), case.get("scale", 1.0)
        T = sum(lengths)
        tag = f"L{lengths}xHq{hq}xHk{hk}xD{d}@{start}/seed{seed}"
        g = checks.generator(seed)
        q = checks.randn((T, hq, d), g, torch.bfloat16, device, scale)
        k = checks.randn((T, hk, d), g, torch.bfloat16, device, scale)
        for i in case.get("zero_rows", ()):  # padding tokens
            q[i], k[i] = 0, 0
        cos, sin = rope_table(start + max(lengths) + 1, d, case["theta"], case.get("scaling"), device)
        inv = inv_freq(d, case["theta"], case.get("scaling")).to(device)
        kw_full, kw_dec = inv_freq_kwargs(impl.rope_full, inv), inv_freq_kwargs(impl.rope_decode, inv)
        pos = packed_positions(lengths, start).to(device)
        tol32 = 8e-3 if getattr(impl, "KNOBS", {}).get("ROUND_TABLE_TO_BF16") else 1e-5
        fq, fk, fq32, fk32 = _outputs(T, hq, hk, d, device)
        impl.rope_full(q, k, cos, sin, pos, fq, fk, fq32, fk32, **kw_full)
        qr, kr = reference(q, cos, sin, pos), reference(k, cos, sin, pos)
        out = [checks.finite(f"full q finite {tag}", fq), checks.finite(f"full k finite {tag}", fk),
               checks.finite(f"full q fp32 finite {tag}", fq32), checks.finite(f"full k fp32 finite {tag}", fk32),
               checks.reference(f"full q vs fp64 {tag}", fq, qr), checks.reference(f"full k vs fp64 {tag}", fk, kr),
               checks.reference(f"full q fp32 vs fp64 {tag}", fq32, qr, tol=tol32),
               checks.reference(f"full k fp32 vs fp64 {tag}", fk32, kr, tol=tol32)]
        # Decode: the last token of each sequence at its absolute position.
        last = torch.tensor(lengths).cumsum(0) - 1
        dq, dk, dq32, dk32 = _outputs(len(lengths), hq, hk, d, device)
        dpos = pos[last.to(device)].contiguous()
        impl.rope_decode(q[last].contiguous(), k[last].contiguous(), cos, sin, dpos, dq, dk, dq32, dk32, **kw_dec)
        out += [checks.bitwise(f"decode q == full rows (bf16) {tag}", dq, fq[last]),
                checks.bitwise(f"decode k == full rows (bf16) {tag}", dk, fk[last]),
                checks.bitwise(f"decode q == full rows (fp32) {tag}", dq32, fq32[last]),
                checks.bitwise(f"decode k == full rows (fp32) {tag}", dk32, fk32[last])]
        oq, ok, oq32, ok32 = _outputs(1, hq, hk, d, device)
        impl.rope_decode(q[last[-1:]].contiguous(), k[last[-1:]].contiguous(), cos, sin, dpos[-1:].contiguous(),
                         oq, ok, oq32, ok32, **kw_dec)
        out += [checks.bitwise(f"decode alone == in batch q (fp32) {tag}", oq32, dq32[-1:]),
                checks.bitwise(f"decode alone == in batch k (bf16) {tag}", ok, dk[-1:])]
        # Partition: the first sequence alone (prompt-only pass) equals its rows in the packed pass.
        p = lengths[0]
        pq, pk, pq32, pk32 = _outputs(p, hq, hk, d, device)
        impl.rope_full(q[:p].contiguous(), k[:p].contiguous(), cos, sin, pos[:p].contiguous(), pq, pk, pq32, pk32,
                       **kw_full)
        out += [checks.bitwise(f"sequence alone == in packed batch q (fp32) {tag}", pq32, fq32[:p]),
                checks.bitwise(f"sequence alone == in packed batch k (bf16) {tag}", pk, fk[:p])]
        if hasattr(impl, "rope_backward"):
            gq = checks.randn((T, hq, d), g, torch.bfloat16, device)
            gk = checks.randn((T, hk, d), g, torch.bfloat16, device)
            bq = torch.full_like(gq, float("nan"))
            bk = torch.full_like(gk, float("nan"))
            impl.rope_backward(gq, gk, cos, sin, pos, bq, bk, **inv_freq_kwargs(impl.rope_backward, inv))
            rq, rk = _reference_backward(q, k, gq, gk, cos, sin, pos)
            out += [checks.reference(f"backward dq vs fp64 autograd {tag}", bq, rq),
                    checks.reference(f"backward dk vs fp64 autograd {tag}", bk, rk)]
        if takes_rows(impl):
            out += _rows_checks(impl, tag, q, k, cos, sin, pos, p, last, (fq, fk, fq32, fk32), (dq, dk, dq32, dk32),
                                (gq, gk, bq, bk) if hasattr(impl, "rope_backward") else None)
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        full = workload["phase"] == "full"
        hq, hk, d = workload["q_heads"], workload["kv_heads"], workload["head_dim"]
        if full:
            T, L = workload["tokens"], workload["seq_len"]
            pos = packed_positions([L] * (T // L) + ([T % L] if T % L else []))
            max_pos = L
        else:
            T, ctx = workload["batch"], workload["context"]
            g0 = checks.generator(seed + 1)
            pos = torch.randint(0, ctx, (T,), generator=g0, dtype=torch.int32)
            max_pos = ctx
        pos = pos.to(device)
        fn = impl.rope_full if full else impl.rope_decode
        cos, sin = rope_table(max_pos, d, workload["theta"], workload.get("scaling"), device)
        kw = inv_freq_kwargs(fn, inv_freq(d, workload["theta"], workload.get("scaling")).to(device))
        g = checks.generator(seed)
        tok_bytes = (hq + hk) * d * 2 * 2
        copies = checks.input_copies(device, T * tok_bytes)
        qs = [checks.randn((T, hq, d), g, torch.bfloat16, device) for _ in range(copies)]
        ks = [checks.randn((T, hk, d), g, torch.bfloat16, device) for _ in range(copies)]
        qo = torch.empty((T, hq, d), dtype=torch.bfloat16, device=device)
        ko = torch.empty((T, hk, d), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda q, k: fn(q, k, cos, sin, pos, qo, ko, **kw), qs, ks)

        def verify() -> list[Check]:
            fg = checks.generator(seed + 7919)
            fq = checks.randn((T, hq, d), fg, torch.bfloat16, device)
            fk = checks.randn((T, hk, d), fg, torch.bfloat16, device)
            checks.poison(qo, ko)
            fn(fq, fk, cos, sin, pos, qo, ko, **kw)
            return [checks.finite("fresh q finite", qo), checks.finite("fresh k finite", ko),
                    checks.reference("fresh q vs fp64", qo, reference(fq, cos, sin, pos)),
                    checks.reference("fresh k vs fp64", ko, reference(fk, cos, sin, pos))]

        return Bench(run=run, verify=verify, bytes_moved=T * (tok_bytes + d * 4 + 4),
                     graph_friendly=not full or T * (hq + hk) * d < (1 << 20))


def _rows_checks(impl, tag, q, k, cos, sin, pos, p, last, full_out, dec_out, backward) -> list[Check]:
    """Pre-gathered rows (cos/sin/positions not passed) must give the table path's bits in every entry point: the
    full and backward passes on the first sequence (p tokens: cheap under the interpreter), decode on every
    sequence's last token."""
    hq, d = q.shape[1:]
    hk, n = k.shape[1], len(last)
    names = ("q (bf16)", "k (bf16)", "q (fp32)", "k (fp32)")
    got = _outputs(p, hq, hk, d, q.device)
    impl.rope_full(q[:p].contiguous(), k[:p].contiguous(), None, None, None, *got, rows=gathered(cos, sin, pos[:p]))
    out = [checks.bitwise(f"full rows == table {nm} {tag}", a, b[:p]) for nm, a, b in zip(names, got, full_out)]
    got = _outputs(n, hq, hk, d, q.device)
    li = last.to(q.device)
    impl.rope_decode(q[li].contiguous(), k[li].contiguous(), None, None, None, *got, rows=gathered(cos, sin, pos[li]))
    out += [checks.bitwise(f"decode rows == table {nm} {tag}", a, b) for nm, a, b in zip(names, got, dec_out)]
    if backward is not None:
        gq, gk, bq, bk = backward
        rq, rk = torch.full_like(gq[:p], float("nan")), torch.full_like(gk[:p], float("nan"))
        impl.rope_backward(gq[:p].contiguous(), gk[:p].contiguous(), None, None, None, rq, rk,
                           rows=gathered(cos, sin, pos[:p]))
        out += [checks.bitwise(f"backward rows == table dq {tag}", rq, bq[:p]),
                checks.bitwise(f"backward rows == table dk {tag}", rk, bk[:p])]
    return out


def _reference_backward(q, k, gq, gk, cos, sin, pos):
    qd = q.double().requires_grad_(True)
    kd = k.double().requires_grad_(True)
    loss = (reference(qd, cos, sin, pos) * gq.double()).sum() + (reference(kd, cos, sin, pos) * gk.double()).sum()
    return torch.autograd.grad(loss, (qd, kd))


def _outputs(T: int, hq: int, hk: int, d: int, device: str):
    outs = (torch.empty((T, hq, d), dtype=torch.bfloat16, device=device),
            torch.empty((T, hk, d), dtype=torch.bfloat16, device=device),
            torch.empty((T, hq, d), dtype=torch.float32, device=device),
            torch.empty((T, hk, d), dtype=torch.float32, device=device))
    checks.poison(*outs)
    return outs
