"""Residual-add + RMSNorm family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Backward, Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import SPREAD, drawn_row_cases, spread_randn

EPS = 1e-6


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The model's new residual stream: the bf16 sum (exactly rounded), as `x + residual` gives in bf16."""
    return (x.float() + residual.float()).to(torch.bfloat16)


def reference(h: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    hd = h.double()
    return hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def reference_backward(h, weight, grad_out, grad_res, eps=EPS):
    hd = h.double().requires_grad_(True)
    wd = weight.double().requires_grad_(True)
    y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * wd
    loss = (y * grad_out.double()).sum() + (hd * grad_res.double()).sum()
    gh, gw = torch.autograd.grad(loss, (hd, wd))
    return gh, gw


class AddRMSNormFamily(Family):
    name = "add_rmsnorm"
    entry_points = ("add_rmsnorm_full", "add_rmsnorm_decode", "add_rmsnorm_backward")
    signatures = (
        EntryPoint("add_rmsnorm_full", ("x", "residual", "weight", "eps", "out", "res_out", "out32"),
                   writes=("out", "res_out", "out32"), optional=("out32",)),
        EntryPoint("add_rmsnorm_decode", ("x", "residual", "weight", "eps", "out", "res_out", "out32"),
                   writes=("out", "res_out", "out32"), optional=("out32",)),
        # (grad_h, grad_weight), new tensors; grad_res may be None (no gradient on the residual output).
        Backward("add_rmsnorm_backward", ("grad_out", "grad_res", "h", "weight", "eps"), returns=True),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "hidden"), "decode": ("batch", "hidden")}
    knobs = (
        Knob("BLOCK_H", (0, 256, 512, 1024, 2048, 4096, 8192), "contract",
             "reduction chunk width (0: the whole row, next power of two of the width); changes the order of "
             "the row sum, so both paths change together"),
        Knob("NUM_WARPS", (1, 2, 4, 8, 16), "contract", "warps reducing one row; changes the row sum's bits"),
        Knob("FULL_ROWS_PER_PROGRAM", (1, 2, 4, 8), "full", "rows handled by one program in the full path"),
        Knob("FULL_NUM_STAGES", (1, 2, 3), "full", "software pipelining depth of the full path"),
        Knob("DECODE_ROWS_PER_PROGRAM", (1, 2, 4), "decode", "rows handled by one program in decode"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3), "decode", "software pipelining depth of decode"),
        Knob("FULL_WEIGHT_LOAD", ("late", "early"), "full",
             "one-chunk rows: load the weight after the h store (late) or with x and residual (early)"),
        Knob("DECODE_WEIGHT_LOAD", ("late", "early"), "decode",
             "one-chunk rows: load the weight after the h store (late) or with x and residual (early)"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("reduction_width", "Match the reduction chunk to the hidden size: one chunk keeps the "
                            "row in registers (one read of x and residual), several chunks re-read the row from "
                            "L2 but use fewer registers (joint: changes both paths' sums)", knobs=("BLOCK_H",)),
            OpportunitySpec("reduction_warps", "More or fewer warps per row to balance parallelism, register "
                            "pressure and occupancy (joint)", knobs=("NUM_WARPS",)),
            OpportunitySpec("joint_tile", "Retune chunk width and warps together (joint)",
                            knobs=("BLOCK_H", "NUM_WARPS")),
            OpportunitySpec("full_schedule", "Give each full-path program several rows to amortise the weight "
                            "load and launch cost over 4K-32K tokens", paths=("full",),
                            knobs=("FULL_ROWS_PER_PROGRAM", "FULL_NUM_STAGES")),
            OpportunitySpec("decode_schedule", "Tune the decode launch (rows per program, pipelining) for "
                            "batches of 1-256", paths=("decode",),
                            knobs=("DECODE_ROWS_PER_PROGRAM", "DECODE_NUM_STAGES")),
            OpportunitySpec("persistent_rows", "A persistent full-path grid (one program per SM walking rows) "
                            "with the same per-row function; cache hints on the streaming loads", paths=("full",)),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 37, "hidden": 320, "seqs": 5}]
        return [
            # Row scales spread over four decades: skipping or mis-scaling the normalisation shows at once.
            {"tokens": 37, "hidden": 320, "seqs": 5, "scale": 1.0, "spread": SPREAD},
            {"tokens": 41, "hidden": 1000, "seqs": 9, "scale": 30.0},
            {"tokens": 19, "hidden": 1536, "seqs": 3, "scale": 0.01},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # The rmsnorm draws: here x and residual are zero in the padding rows (h = 0, whose norm is 0).
        return drawn_row_cases(rng)

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        if device == "cpu":
            interp.install()
        tokens, hidden, seqs = case["tokens"], case["hidden"], case["seqs"]
        scale = case.get("scale", 1.0)
        tag = f"T{tokens}xH{hidden}/seed{seed}"
        g = checks.generator(seed)
        if case.get("spread"):  # x and residual of a row share its scale
            xr = spread_randn((tokens, 2, hidden), g, device, scale, case["spread"])
            x, r = xr[:, 0].contiguous(), xr[:, 1].contiguous()
        else:
            x = checks.randn((tokens, hidden), g, torch.bfloat16, device, scale)
            r = checks.randn((tokens, hidden), g, torch.bfloat16, device, scale)
        for i in case.get("zero_rows", ()):  # padding rows
            x[i], r[i] = 0, 0
        w = checks.randn((hidden,), g, torch.bfloat16, device, 0.5) + 1.0
        h_ref = residual_sum(x, r)
        y_ref = reference(h_ref, w)
        full, h, full32 = _outputs(tokens, hidden, device)
        impl.add_rmsnorm_full(x, r, w, EPS, full, h, full32)
        out = [checks.finite(f"full finite {tag}", full), checks.finite(f"full fp32 finite {tag}", full32),
               checks.bitwise(f"residual out == bf16(x + residual) {tag}", h, h_ref),
               checks.reference(f"full vs fp64 {tag}", full, y_ref),
               checks.reference(f"full fp32 vs fp64 {tag}", full32, y_ref, tol=1e-5)]
        # Last token of each packed sequence, as rollout decodes it: one row per sequence.
        bounds = torch.linspace(0, tokens, seqs + 1).round().long()[1:] - 1
        dec, dh, dec32 = _outputs(seqs, hidden, device)
        impl.add_rmsnorm_decode(x[bounds].contiguous(), r[bounds].contiguous(), w, EPS, dec, dh, dec32)
        out += [checks.bitwise(f"decode == full rows (bf16) {tag}", dec, full[bounds]),
                checks.bitwise(f"decode == full rows (fp32) {tag}", dec32, full32[bounds]),
                checks.bitwise(f"decode residual == full rows {tag}", dh, h[bounds])]
        # A sequence decoded alone equals the same sequence inside the batch.
        one, oh, one32 = _outputs(1, hidden, device)
        impl.add_rmsnorm_decode(x[bounds[-1:]].contiguous(), r[bounds[-1:]].contiguous(), w, EPS, one, oh, one32)
        out += [checks.bitwise(f"decode alone == in batch (bf16) {tag}", one, dec[-1:]),
                checks.bitwise(f"decode alone == in batch (fp32) {tag}", one32, dec32[-1:])]
        # Partition: a prompt-only full pass equals the prompt part of the whole pass.
        p = int(bounds[seqs // 2]) + 1
        pre, ph, pre32 = _outputs(p, hidden, device)
        impl.add_rmsnorm_full(x[:p].contiguous(), r[:p].contiguous(), w, EPS, pre, ph, pre32)
        out += [checks.bitwise(f"prompt-only full == prefix (bf16) {tag}", pre, full[:p]),
                checks.bitwise(f"prompt-only full == prefix (fp32) {tag}", pre32, full32[:p])]
        # Backward (policy update): tolerance against fp64 autograd, not bits.
        if hasattr(impl, "add_rmsnorm_backward"):
            gy = checks.randn((tokens, hidden), g, torch.bfloat16, device)
            gr = checks.randn((tokens, hidden), g, torch.bfloat16, device)
            gh, gw = impl.add_rmsnorm_backward(gy, gr, h, w, EPS)
            rgh, rgw = reference_backward(h_ref, w, gy, gr)
            out += [checks.reference(f"backward grad_h vs fp64 autograd {tag}", gh, rgh),
                    checks.reference(f"backward grad_weight vs fp64 autograd {tag}", gw, rgw)]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        if device == "cpu":
            interp.install()
        rows = workload["tokens"] if workload["phase"] == "full" else workload["batch"]
        hidden = workload["hidden"]
        fn = impl.add_rmsnorm_full if workload["phase"] == "full" else impl.add_rmsnorm_decode
        g = checks.generator(seed)
        row_bytes = hidden * 2 * 4  # x and residual read, y and h written
        copies = checks.input_copies(device, rows * row_bytes)
        xs = [checks.randn((rows, hidden), g, torch.bfloat16, device) for _ in range(copies)]
        rs = [checks.randn((rows, hidden), g, torch.bfloat16, device) for _ in range(copies)]
        w = checks.randn((hidden,), g, torch.bfloat16, device, 0.5) + 1.0
        y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
        h = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda x, r: fn(x, r, w, EPS, y, h), xs, rs)

        def verify() -> list[Check]:
            # Rows over four decades of scale (x and residual of a row alike): a kernel skipping the
            # normalisation fails by far.
            fxr = spread_randn((rows, 2, hidden), checks.generator(seed + 7919), device)
            fx, fr = fxr[:, 0].contiguous(), fxr[:, 1].contiguous()
            checks.poison(y, h)
            fn(fx, fr, w, EPS, y, h)
            h_ref = residual_sum(fx, fr)
            return [checks.finite("fresh inputs finite", y),
                    checks.bitwise("fresh residual out == bf16 sum", h, h_ref),
                    checks.reference("fresh inputs vs fp64", y, reference(h_ref, w))]

        return Bench(run=run, verify=verify, bytes_moved=rows * row_bytes + hidden * 2,
                     graph_friendly=workload["phase"] == "decode" or rows * hidden < (1 << 20))


def _outputs(rows: int, hidden: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
    h = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
    y32 = torch.empty((rows, hidden), dtype=torch.float32, device=device)
    checks.poison(y, h, y32)
    return y, h, y32
