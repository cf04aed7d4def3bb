"""RMSNorm family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from tik_evo import checks
from tik_evo.family import Bench, Check, Family, Knob, OpportunitySpec

EPS = 1e-6


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


class RMSNormFamily(Family):
    name = "rmsnorm"
    entry_points = ("rmsnorm_full", "rmsnorm_decode")
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
            {"tokens": 13, "hidden": 320, "seqs": 4, "scale": 1.0},
            {"tokens": 11, "hidden": 1000, "seqs": 3, "scale": 30.0},
            {"tokens": 6, "hidden": 2560, "seqs": 2, "scale": 0.01},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        tokens, hidden, seqs = case["tokens"], case["hidden"], case["seqs"]
        tag = f"T{tokens}xH{hidden}/seed{seed}"
        g = checks.generator(seed)
        x = checks.randn((tokens, hidden), g, torch.bfloat16, device, case.get("scale", 1.0))
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
            fresh = checks.randn((rows, hidden), checks.generator(seed + 7919), torch.bfloat16, device)
            checks.poison(y)
            fn(fresh, w, EPS, y)
            return [checks.finite("fresh inputs finite", y),
                    checks.reference("fresh inputs vs fp64", y, reference(fresh, w))]

        return Bench(run=run, verify=verify, bytes_moved=rows * row_bytes + hidden * 2,
                     graph_friendly=workload["phase"] == "decode" or rows * hidden < (1 << 20))


def _outputs(rows: int, hidden: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
    y32 = torch.empty((rows, hidden), dtype=torch.float32, device=device)
    checks.poison(y, y32)
    return y, y32
