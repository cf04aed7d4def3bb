"""SwiGLU (silu(gate) * up) family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Backward, Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.double()
    return g * torch.sigmoid(g) * up.double()


def reference_backward(gate, up, grad_out):
    g = gate.double().requires_grad_(True)
    u = up.double().requires_grad_(True)
    loss = (g * torch.sigmoid(g) * u * grad_out.double()).sum()
    return torch.autograd.grad(loss, (g, u))


class SiluMulFamily(Family):
    name = "silu_mul"
    entry_points = ("silu_mul_full", "silu_mul_decode", "silu_mul_backward")
    signatures = (
        EntryPoint("silu_mul_full", ("gate", "up", "out", "out32"), writes=("out", "out32"), optional=("out32",)),
        EntryPoint("silu_mul_decode", ("gate", "up", "out", "out32"), writes=("out", "out32"), optional=("out32",)),
        Backward("silu_mul_backward", ("gate", "up", "grad_out"), returns=True),  # (grad_gate, grad_up)
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "intermediate"), "decode": ("batch", "intermediate")}
    knobs = (
        Knob("SILU_FORM", ("div", "exp2", "mul_sigmoid"), "contract",
             "the silu formula: x/(1+exp(-x)) (torch), with exp2, or x*sigmoid(x); changes bits in both paths"),
        Knob("ROUND_SILU", (True, False), "contract",
             "round silu(gate) to bf16 before the multiply (the model's eager bf16 order) or keep fp32"),
        Knob("FULL_BLOCK_I", (256, 512, 1024, 2048, 4096), "full", "columns per program (full path)"),
        Knob("FULL_ROWS_PER_PROGRAM", (1, 2, 4, 8), "full", "rows per program (full path)"),
        Knob("FULL_NUM_WARPS", (1, 2, 4, 8, 16), "full", "warps per program (full path)"),
        Knob("FULL_COLS_FASTEST", (False, True), "full",
             "grid order: neighbouring programs take neighbouring column blocks of a row (contiguous memory)"),
        Knob("FULL_STREAMING", (False, True), "full", "evict-first cache hint on every load and store"),
        Knob("DECODE_BLOCK_I", (256, 512, 1024, 2048, 4096), "decode", "columns per program (decode)"),
        Knob("DECODE_ROWS_PER_PROGRAM", (1, 2, 4), "decode", "rows per program (decode)"),
        Knob("DECODE_NUM_WARPS", (1, 2, 4, 8, 16), "decode", "warps per program (decode)"),
        Knob("DECODE_COLS_FASTEST", (False, True), "decode", "as FULL_COLS_FASTEST, for decode"),
        Knob("DECODE_STREAMING", (False, True), "decode", "as FULL_STREAMING, for decode"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("full_tile", "Wider column blocks and several rows per program so each thread "
                            "moves 16-byte vectors and the grid is not dominated by tail programs",
                            paths=("full",), knobs=("FULL_BLOCK_I", "FULL_ROWS_PER_PROGRAM", "FULL_NUM_WARPS")),
            OpportunitySpec("full_memory_order", "At 32K tokens both this kernel and Liger's run near the copy "
                            "ceiling (98%); Liger's one-row-per-program order was ~4% faster. Walk a row's column "
                            "blocks in neighbouring programs and mark the streamed bytes evict-first",
                            paths=("full",), knobs=("FULL_COLS_FASTEST", "FULL_STREAMING")),
            OpportunitySpec("decode_tile", "Decode at batch 1-256 is launch-bound: fewer, wider programs or "
                            "more programs per row to fill the SMs (root at B256: 0.74x Liger's one-row-per-program "
                            "kernel on an H200)", paths=("decode",),
                            knobs=("DECODE_BLOCK_I", "DECODE_ROWS_PER_PROGRAM", "DECODE_NUM_WARPS")),
            OpportunitySpec("silu_formula", "A cheaper silu formula (exp2, sigmoid) applied jointly; must stay "
                            "within tolerance of the fp64 reference", knobs=("SILU_FORM",)),
            OpportunitySpec("cast_order", "Keep silu in fp32 through the multiply (one rounding instead of two) "
                            "jointly, if the trainer accepts a departure from the eager bf16 order",
                            knobs=("ROUND_SILU",)),
            OpportunitySpec("fuse_down_proj_prologue", "Fuse the activation into the down projection's A-tile "
                            "load (needs the linear family's invariant GEMM)"),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 23, "intermediate": 1100, "seqs": 4}]
        return [
            {"tokens": 23, "intermediate": 1100, "seqs": 4, "scale": 1.0},
            {"tokens": 41, "intermediate": 768, "seqs": 7, "scale": 8.0, "fused": True},
            {"tokens": 9, "intermediate": 2500, "seqs": 3, "scale": 0.05},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd widths: a multiple of no BLOCK_I, so every row ends in a masked tail block.
        rows, width = (9, 1500) if interp.interpreting() else (300, 8191)
        t, u = rng.randint(2, rows), rng.randint(2, rows)
        return [
            # Tiny gates, padding rows (zeros: silu(0) * 0 = 0), one of them a decoded row.
            {"tokens": t, "intermediate": odd(rng, 3, width), "seqs": rng.randint(1, min(t, 5)),
             "scale": draw_scale(rng, "tiny"), "zero_rows": sorted({rng.randrange(t), t - 1}),
             "fused": rng.random() < 0.5},
            # One token, large gates (exp(-gate) overflows fp32 for the negative ones).
            {"tokens": 1, "intermediate": odd(rng, 3, width), "seqs": 1, "scale": draw_scale(rng, "large"),
             "fused": rng.random() < 0.5},
            {"tokens": u, "intermediate": odd(rng, 3, width), "seqs": rng.randint(1, min(u, 5)),
             "scale": round(10 ** rng.uniform(-1, 1), 3), "fused": True},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        T, inter, seqs = case["tokens"], case["intermediate"], case["seqs"]
        scale = case.get("scale", 1.0)
        tag = f"T{T}xI{inter}{'(fused)' if case.get('fused') else ''}/seed{seed}"
        g = checks.generator(seed)
        if case.get("fused"):  # halves of one gate_up projection output: strided views
            gu = checks.randn((T, 2 * inter), g, torch.bfloat16, device, scale)
            gate, up = gu[:, :inter], gu[:, inter:]
        else:
            gate = checks.randn((T, inter), g, torch.bfloat16, device, scale)
            up = checks.randn((T, inter), g, torch.bfloat16, device)
        for i in case.get("zero_rows", ()):  # padding rows
            gate[i], up[i] = 0, 0
        ref = reference(gate, up)
        tol32 = 8e-3 if getattr(impl, "KNOBS", {}).get("ROUND_SILU") else 1e-5
        full, full32 = _outputs(T, inter, device)
        impl.silu_mul_full(gate, up, full, full32)
        out = [checks.finite(f"full finite {tag}", full), checks.finite(f"full fp32 finite {tag}", full32),
               checks.reference(f"full vs fp64 {tag}", full, ref),
               checks.reference(f"full fp32 vs fp64 {tag}", full32, ref, tol=tol32)]
        bounds = torch.linspace(0, T, seqs + 1).round().long()[1:] - 1
        dec, dec32 = _outputs(seqs, inter, device)
        impl.silu_mul_decode(gate[bounds].contiguous(), up[bounds].contiguous(), dec, dec32)
        out += [checks.bitwise(f"decode == full rows (bf16) {tag}", dec, full[bounds]),
                checks.bitwise(f"decode == full rows (fp32) {tag}", dec32, full32[bounds])]
        one, one32 = _outputs(1, inter, device)
        impl.silu_mul_decode(gate[bounds[-1:]], up[bounds[-1:]], one, one32)
        out += [checks.bitwise(f"decode alone == in batch (bf16) {tag}", one, dec[-1:]),
                checks.bitwise(f"decode alone == in batch (fp32) {tag}", one32, dec32[-1:])]
        p = int(bounds[seqs // 2]) + 1
        pre, pre32 = _outputs(p, inter, device)
        impl.silu_mul_full(gate[:p], up[:p], pre, pre32)
        out += [checks.bitwise(f"prompt-only full == prefix (bf16) {tag}", pre, full[:p]),
                checks.bitwise(f"prompt-only full == prefix (fp32) {tag}", pre32, full32[:p])]
        if hasattr(impl, "silu_mul_backward"):
            gy = checks.randn((T, inter), g, torch.bfloat16, device)
            gg, gu_ = impl.silu_mul_backward(gate, up, gy)
            rg, ru = reference_backward(gate, up, gy)
            out += [checks.reference(f"backward grad_gate vs fp64 autograd {tag}", gg, rg),
                    checks.reference(f"backward grad_up vs fp64 autograd {tag}", gu_, ru)]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        full = workload["phase"] == "full"
        T = workload["tokens"] if full else workload["batch"]
        inter = workload["intermediate"]
        fn = impl.silu_mul_full if full else impl.silu_mul_decode
        g = checks.generator(seed)
        row_bytes = inter * 2 * 3
        copies = checks.input_copies(device, T * row_bytes)
        gus = [checks.randn((T, 2 * inter), g, torch.bfloat16, device) for _ in range(copies)]
        y = torch.empty((T, inter), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda gu: fn(gu[:, :inter], gu[:, inter:], y), gus)

        def verify() -> list[Check]:
            gu = checks.randn((T, 2 * inter), checks.generator(seed + 7919), torch.bfloat16, device)
            checks.poison(y)
            fn(gu[:, :inter], gu[:, inter:], y)
            return [checks.finite("fresh inputs finite", y),
                    checks.reference("fresh inputs vs fp64", y, reference(gu[:, :inter], gu[:, inter:]))]

        return Bench(run=run, verify=verify, bytes_moved=T * row_bytes,
                     graph_friendly=not full or T * inter < (1 << 20))


def _outputs(rows: int, inter: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty((rows, inter), dtype=torch.bfloat16, device=device)
    y32 = torch.empty((rows, inter), dtype=torch.float32, device=device)
    checks.poison(y, y32)
    return y, y32
