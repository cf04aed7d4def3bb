"""RMSNorm family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec

EPS = 1e-6
# Per-row input scales of a spread draw: 10**uniform(-SPREAD, SPREAD). A kernel that skips the normalisation is
# then off by orders of magnitude, where unit-variance rows (rstd ~ 1) would hide it within the bf16 tolerance.
SPREAD = 2.0


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def row_scales(shape: tuple[int, ...], g: torch.Generator, decades: float = SPREAD) -> torch.Tensor:
    """fp32 factors 10**uniform(-decades, decades), one per row (per index of ``shape``), from ``g`` on the CPU."""
    return (10.0 ** ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * decades)).float()


def spread_randn(shape: tuple[int, ...], g: torch.Generator, device: str, scale: float = 1.0,
                 decades: float = SPREAD) -> torch.Tensor:
    """bf16 normal rows (the last dimension) each scaled by its own factor 10**uniform(-decades, decades): the
    norm's input then varies over orders of magnitude from row to row (bench-sized draws stay on the device)."""
    x = checks.randn(shape, g, torch.float32, device, scale)
    return (x * row_scales(shape[:-1], g, decades).to(x.device).unsqueeze(-1)).to(torch.bfloat16)


def draw_scale(rng: random.Random, kind: str) -> float:
    """An input scale for a drawn check case: "tiny" about 1e-3, "large" 30-100, else 1."""
    if kind == "tiny":
        return round(10 ** rng.uniform(-3.2, -2.8), 6)
    if kind == "large":
        return round(rng.uniform(30.0, 100.0), 2)
    return 1.0


def odd(rng: random.Random, lo: int, hi: int) -> int:
    """An odd integer in [lo, hi] (lo <= hi, one of them odd): a multiple of no power-of-two block or tile."""
    return rng.randrange(lo | 1, hi + 1, 2)


def drawn_row_cases(rng: random.Random) -> list[dict[str, Any]]:
    """Drawn check cases of the row-wise norms (rmsnorm, add_rmsnorm): tokens, hidden, seqs, scale and the
    optional zero_rows / spread keys. Under the interpreter a row costs a program run in numpy: tiny there."""
    rows, width = (9, 1200) if interp.interpreting() else (300, 8191)
    t = rng.randint(2, rows)
    u = rng.randint(2, rows)
    return [
        # Odd width, tiny inputs, padding rows (zeros: the norm of a zero row is 0), one of them a decoded row.
        {"tokens": t, "hidden": odd(rng, 3, width), "seqs": rng.randint(1, min(t, 5)),
         "scale": draw_scale(rng, "tiny"), "zero_rows": sorted({rng.randrange(t), t - 1})},
        # One token, large inputs.
        {"tokens": 1, "hidden": odd(rng, 3, width), "seqs": 1, "scale": draw_scale(rng, "large")},
        # Rows spread over four decades.
        {"tokens": u, "hidden": odd(rng, 3, width), "seqs": rng.randint(1, min(u, 5)), "scale": 1.0,
         "spread": SPREAD},
    ]


class RMSNormFamily(Family):
    name = "rmsnorm"
    entry_points = ("rmsnorm_full", "rmsnorm_decode")
    signatures = (
        EntryPoint("rmsnorm_full", ("x", "weight", "eps", "out", "out32"), writes=("out", "out32"),
                   optional=("out32",)),
        EntryPoint("rmsnorm_decode", ("x", "weight", "eps", "out", "out32"), writes=("out", "out32"),
                   optional=("out32",)),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "hidden"), "decode": ("batch", "hidden")}
    knobs = (
        Knob("BLOCK_H", (0, 128, 256, 512, 1024, 2048, 4096), "contract",
             "reduction chunk width (0: the whole row, next power of two of the width); changes the order of "
             "the row sum, so both paths change together"),
        Knob("NUM_WARPS", (1, 2, 4, 8, 16), "contract", "warps reducing one row; changes the row sum's bits"),
        Knob("FULL_ROWS_PER_PROGRAM", (1, 2, 4, 8), "full", "rows handled by one program in the full path"),
        Knob("FULL_NUM_STAGES", (1, 2, 3), "full", "software pipelining depth of the full path"),
        Knob("DECODE_ROWS_PER_PROGRAM", (1, 2, 4), "decode", "rows handled by one program in decode"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3), "decode", "software pipelining depth of decode"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("reduction_width", "Match the reduction chunk to the hidden size so a row is read in "
                            "fewer, wider vector loads (joint: changes both paths' sums)", knobs=("BLOCK_H",)),
            OpportunitySpec("reduction_warps", "Use more or fewer warps per row to balance parallelism and "
                            "occupancy (joint)", knobs=("NUM_WARPS",)),
            OpportunitySpec("joint_tile", "Retune chunk width and warps together (joint)",
                            knobs=("BLOCK_H", "NUM_WARPS")),
            OpportunitySpec("full_schedule", "Give each full-path program several rows to amortise the weight "
                            "load and launch cost", paths=("full",),
                            knobs=("FULL_ROWS_PER_PROGRAM", "FULL_NUM_STAGES")),
            OpportunitySpec("decode_schedule", "Tune the decode launch (rows per program, pipelining) for "
                            "small batches", paths=("decode",),
                            knobs=("DECODE_ROWS_PER_PROGRAM", "DECODE_NUM_STAGES")),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        # Hidden sizes that are not multiples of any BLOCK_H; scales from tiny to large.
        if level == "small":
            return [{"tokens": 7, "hidden": 320, "seqs": 3}]
        return [
            # Row scales spread over four decades: skipping or mis-scaling the normalisation shows at once.
            {"tokens": 13, "hidden": 320, "seqs": 4, "scale": 1.0, "spread": SPREAD},
            {"tokens": 11, "hidden": 1000, "seqs": 3, "scale": 30.0},
            {"tokens": 6, "hidden": 2560, "seqs": 2, "scale": 0.01},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        return drawn_row_cases(rng)

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        tokens, hidden, seqs = case["tokens"], case["hidden"], case["seqs"]
        tag = f"T{tokens}xH{hidden}/seed{seed}"
        g = checks.generator(seed)
        x = _input((tokens, hidden), g, device, case)
        w = checks.randn((hidden,), g, torch.bfloat16, device, 0.5) + 1.0
        full, full32 = _outputs(tokens, hidden, device)
        impl.rmsnorm_full(x, w, EPS, full, full32)
        out = [checks.finite(f"full finite {tag}", full), checks.finite(f"full fp32 finite {tag}", full32),
               checks.reference(f"full vs fp64 {tag}", full, reference(x, w)),
               checks.reference(f"full fp32 vs fp64 {tag}", full32, reference(x, w), tol=1e-5)]
        # Last token of each packed sequence, as rollout decodes it: one row per sequence.
        bounds = torch.linspace(0, tokens, seqs + 1).round().long()[1:] - 1
        dec, dec32 = _outputs(seqs, hidden, device)
        impl.rmsnorm_decode(x[bounds].contiguous(), w, EPS, dec, dec32)
        out += [checks.bitwise(f"decode == full rows (bf16) {tag}", dec, full[bounds]),
                checks.bitwise(f"decode == full rows (fp32) {tag}", dec32, full32[bounds])]
        # A sequence decoded alone equals the same sequence inside the batch.
        one, one32 = _outputs(1, hidden, device)
        impl.rmsnorm_decode(x[bounds[-1:]].contiguous(), w, EPS, one, one32)
        out += [checks.bitwise(f"decode alone == in batch (bf16) {tag}", one, dec[-1:]),
                checks.bitwise(f"decode alone == in batch (fp32) {tag}", one32, dec32[-1:])]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        rows = workload["tokens"] if workload["phase"] == "full" else workload["batch"]
        hidden = workload["hidden"]
        fn = impl.rmsnorm_full if workload["phase"] == "full" else impl.rmsnorm_decode
        g = checks.generator(seed)
        row_bytes = hidden * 2 * 2
        copies = checks.input_copies(device, rows * row_bytes)
        xs = [checks.randn((rows, hidden), g, torch.bfloat16, device) for _ in range(copies)]
        w = checks.randn((hidden,), g, torch.bfloat16, device, 0.5) + 1.0
        y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda x: fn(x, w, EPS, y), xs)

        def verify() -> list[Check]:
            # Rows over four decades of scale: a kernel skipping the normalisation fails by far.
            fresh = spread_randn((rows, hidden), checks.generator(seed + 7919), device)
            checks.poison(y)
            fn(fresh, w, EPS, y)
            return [checks.finite("fresh inputs finite", y),
                    checks.reference("fresh inputs vs fp64", y, reference(fresh, w))]

        return Bench(run=run, verify=verify, bytes_moved=rows * row_bytes + hidden * 2,
                     graph_friendly=workload["phase"] == "decode" or rows * hidden < (1 << 20))


def _input(shape: tuple[int, ...], g: torch.Generator, device: str, case: dict[str, Any]) -> torch.Tensor:
    """A case's input rows: scaled by ``scale``, each row by its own factor with ``spread`` (decades), and the
    rows ``zero_rows`` (padding) all zeros."""
    scale = case.get("scale", 1.0)
    if case.get("spread"):
        x = spread_randn(shape, g, device, scale, case["spread"])
    else:
        x = checks.randn(shape, g, torch.bfloat16, device, scale)
    for i in case.get("zero_rows", ()):
        x[i] = 0
    return x


def _outputs(rows: int, hidden: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
    y32 = torch.empty((rows, hidden), dtype=torch.float32, device=device)
    checks.poison(y, y32)
    return y, y32
