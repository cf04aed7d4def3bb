"""Token-embedding gather family harness: inputs, exact checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import odd


class EmbeddingFamily(Family):
    name = "embedding"
    entry_points = ("embedding_full", "embedding_decode")
    signatures = tuple(EntryPoint(name, ("ids", "weight", "out"), writes=("out",)) for name in entry_points)
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "vocab", "hidden"), "decode": ("batch", "vocab", "hidden")}
    knobs = (
        Knob("FULL_BLOCK_H", (256, 512, 1024, 2048, 4096), "full", "columns copied per step (full path)"),
        Knob("FULL_ROWS_PER_PROGRAM", (1, 2, 4, 8), "full", "tokens per program (full path)"),
        Knob("FULL_NUM_WARPS", (1, 2, 4, 8), "full", "warps per program (full path)"),
        Knob("FULL_SPLIT_ROW", (False, True), "full",
             "one program per (token, column block) instead of a program walking its row block by block"),
        Knob("DECODE_BLOCK_H", (256, 512, 1024, 2048, 4096), "decode", "columns copied per step (decode)"),
        Knob("DECODE_ROWS_PER_PROGRAM", (1, 2, 4), "decode", "tokens per program (decode)"),
        Knob("DECODE_NUM_WARPS", (1, 2, 4, 8), "decode", "warps per program (decode)"),
        Knob("DECODE_SPLIT_ROW", (False, True), "decode", "as FULL_SPLIT_ROW, for decode"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("full_schedule", "Whole-row blocks and several tokens per program so the gather "
                            "streams at copy bandwidth", paths=("full",),
                            knobs=("FULL_BLOCK_H", "FULL_ROWS_PER_PROGRAM", "FULL_NUM_WARPS", "FULL_SPLIT_ROW")),
            OpportunitySpec("decode_schedule", "Decode (1-256 rows) is launch-bound: split a row across programs "
                            "or pack rows", paths=("decode",),
                            knobs=("DECODE_BLOCK_H", "DECODE_ROWS_PER_PROGRAM", "DECODE_NUM_WARPS",
                                   "DECODE_SPLIT_ROW")),
            OpportunitySpec("fuse_first_norm", "Fuse the gather into the first layer's RMSNorm (the norm's "
                            "reduction contract then applies to both paths)"),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 21, "vocab": 1000, "hidden": 320, "seqs": 4}]
        return [
            {"tokens": 21, "vocab": 1000, "hidden": 320, "seqs": 4},
            {"tokens": 50, "vocab": 5003, "hidden": 1536, "seqs": 7, "int64": True},
            {"tokens": 9, "vocab": 77, "hidden": 2500, "seqs": 3},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd widths: a multiple of no BLOCK_H, so every row ends in a masked tail block.
        # On the GPU: a wide table, and a long one (a model's vocabulary; its last row's offset near 2**30).
        rows, width, vocab, long = (9, 1500, 3000, 3000) if interp.interpreting() else (300, 8191, 20_000, 160_000)
        t = rng.randint(2, rows)
        return [
            # Padding tokens (id 0, repeated), one of them a decoded token.
            {"tokens": t, "vocab": odd(rng, 3, vocab), "hidden": odd(rng, 3, width),
             "seqs": rng.randint(1, min(t, 5)), "int64": rng.random() < 0.5,
             "pad_rows": sorted({rng.randrange(t), t - 1})},
            {"tokens": 1, "vocab": odd(rng, long // 2, long), "hidden": odd(rng, 3, width), "seqs": 1,
             "int64": rng.random() < 0.5},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        T, V, H, seqs = case["tokens"], case["vocab"], case["hidden"], case["seqs"]
        tag = f"T{T}xV{V}xH{H}/seed{seed}"
        g = checks.generator(seed)
        w = checks.randn((V, H), g, torch.bfloat16, device)
        ids = torch.randint(0, V, (T,), generator=g)
        ids[0], ids[-1] = 0, V - 1  # vocabulary edges
        for i in case.get("pad_rows", ()):  # padding tokens: id 0, repeated
            ids[i] = 0
        ids = ids.to(torch.int64 if case.get("int64") else torch.int32).to(device)
        full = _output(T, H, device)
        impl.embedding_full(ids, w, full)
        ref = w[ids.long()]
        out = [checks.finite(f"full finite {tag}", full), checks.bitwise(f"full == weight[ids] {tag}", full, ref)]
        bounds = torch.linspace(0, T, seqs + 1).round().long()[1:] - 1
        dec = _output(seqs, H, device)
        impl.embedding_decode(ids[bounds.to(device)].contiguous(), w, dec)
        out.append(checks.bitwise(f"decode == full rows {tag}", dec, full[bounds]))
        one = _output(1, H, device)
        impl.embedding_decode(ids[-1:].contiguous(), w, one)
        out.append(checks.bitwise(f"decode alone == full row {tag}", one, full[-1:]))
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        full = workload["phase"] == "full"
        T = workload["tokens"] if full else workload["batch"]
        V, H = workload["vocab"], workload["hidden"]
        fn = impl.embedding_full if full else impl.embedding_decode
        g = checks.generator(seed)
        w = checks.randn((V, H), g, torch.bfloat16, device)
        copies = 1 if device == "cpu" else 8
        idss = [torch.randint(0, V, (T,), generator=g, dtype=torch.int64).to(device) for _ in range(copies)]
        y = torch.empty((T, H), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda ids: fn(ids, w, y), idss)

        def verify() -> list[Check]:
            ids = torch.randint(0, V, (T,), generator=checks.generator(seed + 7919), dtype=torch.int64).to(device)
            checks.poison(y)
            fn(ids, w, y)
            return [checks.finite("fresh inputs finite", y), checks.bitwise("fresh == weight[ids]", y, w[ids])]

        return Bench(run=run, verify=verify, bytes_moved=T * H * 2 * 2 + T * 8,
                     graph_friendly=not full or T * H < (1 << 20))


def _output(rows: int, hidden: int, device: str) -> torch.Tensor:
    y = torch.empty((rows, hidden), dtype=torch.bfloat16, device=device)
    checks.poison(y)
    return y
