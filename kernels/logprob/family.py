"""Log-prob + entropy family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Backward, Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd

FP32_TOL = 1e-5  # fp32 online softmax over ~1e5 columns against fp64
GRAD_TOL = 1.6e-2  # gradients are written in bf16


def reference(logits: torch.Tensor, target: torch.Tensor, temperature: float):
    """fp64 log-prob of the target, entropy and log-sum-exp of logits / temperature."""
    z = logits.double() / temperature
    lse = torch.logsumexp(z, -1)
    lp = z.gather(-1, target.long()[:, None])[:, 0] - lse
    p = torch.softmax(z, -1)
    return lp, lse - (p * z).sum(-1), lse


class LogprobFamily(Family):
    name = "logprob"
    entry_points = ("logprob_full", "logprob_decode")
    signatures = (
        *(EntryPoint(name, ("logits", "target", "temperature", "logprob", "entropy", "lse"),
                     writes=("logprob", "entropy", "lse"), optional=("lse",))
          for name in entry_points),
        Backward("logprob_backward", ("logits", "target", "temperature", "grad_logprob", "grad_entropy",
                                        "grad_logits"), writes=("grad_logits",), required=False),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "vocab"), "decode": ("batch", "vocab")}
    knobs = (
        Knob("VOCAB_CHUNK", (512, 1024, 2048, 4096, 8192), "contract",
             "columns per online-softmax step; fixes the per-lane sums and the final tl.sum order (joint)"),
        Knob("NUM_WARPS", (2, 4, 8, 16), "contract", "warps reducing one row; changes the tl.sum order (joint)"),
        Knob("VOCAB_SPLIT", (0, 8192, 16384, 32768, 65536), "contract",
             "fixed vocabulary split (0: none), a multiple of VOCAB_CHUNK; splits folded in ascending order"),
        Knob("SOFTMAX_FORM", ("exp", "exp2"), "contract",
             "exp: p = exp(z - m), per-lane sums rescaled every chunk (6+3 fp32 ops per element on sm_90); exp2: "
             "p = exp2(z*log2e - m*log2e) (one FFMA + MUFU.EX2, flushes p < 2^-126), s += p, t = fma(p, z, t), "
             "rescaled only when a chunk raises the max, mask only on the tail chunk (joint)"),
        Knob("FULL_NUM_STAGES", (1, 2, 3, 4), "full", "software pipelining depth of the full path"),
        Knob("FULL_SPLIT_PARALLEL", (False, True), "full",
             "compute vocabulary splits in parallel programs plus a fold launch in the full path"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3, 4), "decode", "software pipelining depth of decode"),
        Knob("DECODE_SPLIT_PARALLEL", (False, True), "decode",
             "compute vocabulary splits in parallel programs plus a fold launch in decode"),
        Knob("FULL_PREFETCH", (False, True), "full",
             "issue the next chunk's load before the current chunk's reductions (two chunks in flight; exp2 form)"),
        Knob("DECODE_PREFETCH", (False, True), "decode",
             "issue the next chunk's load before the current chunk's reductions (two chunks in flight; exp2 form)"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("vocab_split", "Decode at small batch streams one 300 KB row per SM: cut the vocabulary "
                            "into fixed splits folded in ascending order, computed in parallel in decode and "
                            "in-program in the full path (joint)",
                            knobs=("VOCAB_SPLIT", "DECODE_SPLIT_PARALLEL")),
            OpportunitySpec("chunk_width", "Wider or narrower vocabulary chunks and warps per row to balance "
                            "load width, registers and the per-chunk max/rescale (joint)",
                            knobs=("VOCAB_CHUNK", "NUM_WARPS")),
            OpportunitySpec("chunk_prefetch", "The full path reached 62% of copy bandwidth (H200): each program "
                            "loads a chunk and waits on it before reducing. Issue the next chunk's load before "
                            "reducing the current one (register double-buffering); numerics unchanged",
                            paths=("full", "decode"), knobs=("FULL_PREFETCH", "DECODE_PREFETCH")),
            OpportunitySpec("inner_loop_ops", "The chunk loop was ~13 instructions per element with tl.exp (range "
                            "check + two predicated multiplies around MUFU.EX2, a rescale multiply per lane sum, a "
                            "mask select); SOFTMAX_FORM exp2 is ~6. Further: fewer cross-warp max reductions per row "
                            "(each chunk's tl.max is a shared-memory round trip with barriers) (joint)",
                            knobs=("SOFTMAX_FORM", "VOCAB_CHUNK")),
            OpportunitySpec("full_pipelining", "Keep more chunk loads in flight per row in the full path",
                            paths=("full",), knobs=("FULL_NUM_STAGES",)),
            OpportunitySpec("decode_pipelining", "Keep more chunk loads in flight per row in decode",
                            paths=("decode",), knobs=("DECODE_NUM_STAGES", "DECODE_SPLIT_PARALLEL")),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 13, "vocab": 1000, "seqs": 4, "temperature": 1.0}]
        return [
            {"tokens": 13, "vocab": 1000, "seqs": 4, "temperature": 1.0, "scale": 1.0},
            {"tokens": 21, "vocab": 4099, "seqs": 5, "temperature": 0.7, "scale": 8.0},
            {"tokens": 7, "vocab": 10007, "seqs": 3, "temperature": 1.3, "scale": 3.0},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd vocabularies: a multiple of no VOCAB_CHUNK or VOCAB_SPLIT (on the GPU up to past several splits).
        rows, vocab = (7, 3000) if interp.interpreting() else (200, 160_000)
        t = rng.randint(2, rows)

        def temperature() -> float:
            return rng.choice((1.0, round(rng.uniform(0.3, 2.0), 3)))

        return [
            # Tiny logits (near uniform) and padding rows (zeros: exactly uniform), one of them a decoded row.
            {"tokens": t, "vocab": odd(rng, 3, vocab), "seqs": rng.randint(1, min(t, 5)),
             "temperature": temperature(), "scale": draw_scale(rng, "tiny"),
             "zero_rows": sorted({rng.randrange(t), t - 1})},
            # One token, large logits. Not larger: entropy = lse - t / s of a peaked softmax nears 0 with an fp32
            # error of lse's size, which no kernel keeps within 1e-5 of it (the relative tolerance).
            {"tokens": 1, "vocab": odd(rng, 3, vocab), "seqs": 1, "temperature": 1.0,
             "scale": round(rng.uniform(3.0, 5.0), 2)},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        tokens, vocab, seqs, temp = case["tokens"], case["vocab"], case["seqs"], case.get("temperature", 1.0)
        tag = f"T{tokens}xV{vocab}/temp{temp}/seed{seed}"
        g = checks.generator(seed)
        x = checks.randn((tokens, vocab), g, torch.bfloat16, device, case.get("scale", 1.0))
        tgt = torch.randint(0, vocab, (tokens,), generator=g).to(device)
        tgt[0], tgt[-1] = vocab - 1, 0  # the vocabulary's edges
        for i in case.get("zero_rows", ()):  # padding rows
            x[i] = 0
        ref_lp, ref_ent, ref_lse = reference(x, tgt, temp)
        lp, ent, lse = _outputs(tokens, device)
        impl.logprob_full(x, tgt, temp, lp, ent, lse)
        out = [checks.finite(f"full finite {tag}", torch.stack([lp, ent, lse])),
               checks.reference(f"full logprob vs fp64 {tag}", lp, ref_lp, tol=FP32_TOL),
               checks.reference(f"full entropy vs fp64 {tag}", ent, ref_ent, tol=FP32_TOL),
               checks.reference(f"full lse vs fp64 {tag}", lse, ref_lse, tol=FP32_TOL)]
        bounds = torch.linspace(0, tokens, seqs + 1).round().long()[1:] - 1
        d = _outputs(seqs, device)
        impl.logprob_decode(x[bounds].contiguous(), tgt[bounds].contiguous(), temp, *d)
        for name, a, b in zip(("logprob", "entropy", "lse"), d, (lp, ent, lse)):
            out.append(checks.bitwise(f"decode == full rows ({name}) {tag}", a, b[bounds]))
        one = _outputs(1, device)
        impl.logprob_decode(x[bounds[-1:]].contiguous(), tgt[bounds[-1:]].contiguous(), temp, *one)
        for name, a, b in zip(("logprob", "entropy", "lse"), one, d):
            out.append(checks.bitwise(f"decode alone == in batch ({name}) {tag}", a, b[-1:]))
        p = int(bounds[0]) + 1
        part = _outputs(p, device)
        impl.logprob_full(x[:p].contiguous(), tgt[:p].contiguous(), temp, *part)
        for name, a, b in zip(("logprob", "entropy", "lse"), part, (lp, ent, lse)):
            out.append(checks.bitwise(f"full prefix == full rows ({name}) {tag}", a, b[:p]))
        if hasattr(impl, "logprob_backward"):
            out += _backward_checks(impl, x, tgt, temp, g, tag, device)
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        decode = workload["phase"] == "decode"
        rows = workload["batch"] if decode else workload["tokens"]
        vocab = workload["vocab"]
        temp = float(workload.get("temperature", 1.0))
        fn = impl.logprob_decode if decode else impl.logprob_full
        set_bytes = rows * vocab * 2
        copies = checks.input_copies(device, set_bytes)
        xs = [_randn_dev((rows, vocab), seed * 31 + i, device, 4.0) for i in range(copies)]
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        tgts = [torch.randint(0, vocab, (rows,), generator=gen, device=device) for _ in range(copies)]
        lp, ent, _ = _outputs(rows, device)
        run = checks.rotate(lambda x, t: fn(x, t, temp, lp, ent), xs, tgts)

        def verify() -> list[Check]:
            n = min(rows, 64)  # the fp64 reference of a 32K x 152K batch would need 40 GB
            fresh = _randn_dev((n, vocab), seed + 7919, device, 4.0)
            tgt = tgts[0][:n].contiguous()
            flp, fent, _ = _outputs(n, device)
            fn(fresh, tgt, temp, flp, fent)
            checks.poison(lp, ent)
            fn(xs[0], tgts[0], temp, lp, ent)
            ref_lp, ref_ent, _ = reference(fresh, tgt, temp)
            return [checks.finite("outputs written", torch.stack([lp, ent])),
                    checks.reference("fresh inputs logprob vs fp64", flp, ref_lp, tol=FP32_TOL),
                    checks.reference("fresh inputs entropy vs fp64", fent, ref_ent, tol=FP32_TOL)]

        return Bench(run=run, verify=verify, bytes_moved=set_bytes + rows * (8 + 4 + 4),
                     graph_friendly=decode or set_bytes < (32 << 20))


def _backward_checks(impl: ModuleType, x: torch.Tensor, tgt: torch.Tensor, temp: float, g: torch.Generator,
                     tag: str, device: str) -> list[Check]:
    glp = checks.randn((x.shape[0],), g, torch.float32, device)
    gent = checks.randn((x.shape[0],), g, torch.float32, device)
    xd = x.double().requires_grad_()
    z = xd / temp
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(-1, tgt.long()[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    (lp * glp.double() + ent * gent.double()).sum().backward()
    gx = torch.empty_like(x)
    impl.logprob_backward(x, tgt, temp, glp, gent, gx)
    return [checks.reference(f"backward dlogits vs autograd fp64 {tag}", gx, xd.grad, tol=GRAD_TOL)]


def _randn_dev(shape: tuple[int, ...], seed: int, device: str, scale: float = 1.0) -> torch.Tensor:
    # Generated on the device in bf16: a 32K x 152K batch is 10 GB and would take minutes on the CPU.
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)
    return t.mul_(scale) if scale != 1.0 else t


def _outputs(rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = [torch.empty(rows, dtype=torch.float32, device=device) for _ in range(3)]
    checks.poison(*t)
    return t[0], t[1], t[2]
