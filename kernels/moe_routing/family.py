"""MoE routing (softmax + top-k + renormalisation) family harness."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd

FP32_TOL = 1e-5


def reference(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 softmax; a stable descending sort puts equal probabilities in ascending expert order."""
    p = torch.softmax(logits.double(), -1)
    vals, idx = torch.sort(p, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :top_k], idx[:, :top_k]
    if renormalize:
        vals = vals / vals.sum(-1, keepdim=True)
    return vals, idx.to(torch.int32)


def equal_ids(name: str, a: torch.Tensor, b: torch.Tensor, kind: str = "consistency") -> Check:
    if a.shape != b.shape:
        return Check(name, False, kind, {"error": f"shape {tuple(a.shape)} vs {tuple(b.shape)}"})
    diff = a.to(torch.int64) != b.to(torch.int64)
    info: dict[str, Any] = {"elements": a.numel(), "mismatches": int(diff.sum())}
    if info["mismatches"]:
        info["first_mismatch"] = diff.nonzero()[0].tolist()
    return Check(name, info["mismatches"] == 0, kind, info)


class MoERoutingFamily(Family):
    name = "moe_routing"
    entry_points = ("moe_routing_full", "moe_routing_decode")
    signatures = tuple(
        EntryPoint(name, ("logits", "weights", "ids", "weights32", "renormalize"),
                   writes=("weights", "ids", "weights32"), optional=("weights32",))
        for name in entry_points)
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "experts", "top_k"), "decode": ("batch", "experts", "top_k")}
    knobs = (
        Knob("BLOCK_T", (1, 2, 4, 8, 16, 32, 64), "contract",
             "tokens per tile; with NUM_WARPS and EXPERT_GROUP it fixes the tile layout and so the softmax "
             "row-sum order (joint)"),
        Knob("NUM_WARPS", (1, 2, 4, 8), "contract", "warps per tile; changes the row-sum order (joint)"),
        Knob("EXPERT_GROUP", (0, 8), "contract",
             "0: flat [BLOCK_T, experts] tile (16 threads per row); 8: [BLOCK_T, experts/8, 8] tile, whole rows "
             "in 32*NUM_WARPS/BLOCK_T threads, few or no shuffles per round; changes the row-sum order (joint)"),
        Knob("RENORM_FROM", ("probs", "logits"), "contract",
             "renormalised weights from the k probabilities, or (logit_key) from exp(x - m) of the k chosen "
             "experts alone, skipping the whole-row exp and sum"),
        Knob("SELECT", ("rounds", "packed_prob", "logit_key"), "contract",
             "top-k method: max+argmin rounds on fp32 probabilities; one min per round on packed (prob bits, "
             "inverted expert) int64 keys (identical outputs); one min per round on int32 (bf16 logit, inverted "
             "expert) keys, dividing only the k chosen (identical unless two logits round to one fp32 "
             "probability)"),
        Knob("FULL_TILES_PER_PROGRAM", (1, 2, 4, 8), "full", "tiles looped over by one program in the full path"),
        Knob("FULL_NUM_STAGES", (1, 2, 3), "full", "software pipelining depth of the full path"),
        Knob("FULL_PREFETCH", (False, True), "full",
             "load the program's next tile before routing this one (register double buffer; with several tiles "
             "per program the memory wait overlaps the selection rounds)"),
        Knob("FULL_STAGE_KEYS", ("auto", "off"), "full",
             "round-trip the chosen keys through the ids output so the epilogue runs once per row ('auto': when "
             "more than 2 threads share a row) or let every thread of the row repeat it ('off', no memory round "
             "trip)"),
        Knob("FULL_TOPK_NET", (False, True), "full",
             "with logit keys: the k largest keys at once from a bitonic top-k network (tl.topk) instead of k "
             "rounds, the same keys in the same order; min/max pairs only with a row per thread (FULL_BLOCK_T "
             "32 per warp: 73 warp instructions per token against 87 for the rounds, offline count)"),
        Knob("FULL_BLOCK_T", (0, 4, 8, 16, 32, 64, 128), "full",
             "tokens per tile of the full path where no softmax row sum is taken (logit keys, weights "
             "renormalised from the logits): the tile then changes no bit; 0 = BLOCK_T. H200: 8 tokens on one warp "
             "fastest; 32 per warp (a whole row per thread, fewer instructions) slower, too few warps to hide "
             "latency"),
        Knob("FULL_NUM_WARPS", (0, 1, 2, 4), "full", "warps per full-path tile under the same rule; 0 = NUM_WARPS"),
        Knob("DECODE_BLOCK_T", (0, 1, 2, 4, 8, 16, 32), "decode", "as FULL_BLOCK_T, for decode"),
        Knob("DECODE_NUM_WARPS", (0, 1, 2, 4), "decode", "as FULL_NUM_WARPS, for decode"),
        Knob("DECODE_TILES_PER_PROGRAM", (1, 2, 4), "decode", "tiles looped over by one program in decode"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3), "decode", "software pipelining depth of decode"),
        Knob("DECODE_PREFETCH", (False, True), "decode", "as FULL_PREFETCH, for decode"),
        Knob("DECODE_STAGE_KEYS", ("auto", "off"), "decode", "as FULL_STAGE_KEYS, for decode"),
        Knob("DECODE_TOPK_NET", (False, True), "decode", "as FULL_TOPK_NET, for decode"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("tile_shape", "More tokens per tile and fewer warps amortise the per-program cost of "
                            "the selection rounds over the expert axis; with EXPERT_GROUP 8 a row lives in "
                            "32*NUM_WARPS/BLOCK_T threads, so rounds need fewer shuffles (joint: changes the "
                            "row-sum layout)", knobs=("BLOCK_T", "NUM_WARPS", "EXPERT_GROUP")),
            OpportunitySpec("selection_method", "Each round of the old selection does a max and a min-index "
                            "reduction over fp32 probabilities after 128 divisions per token. Unique int keys "
                            "(value bits, inverted expert) need one min per round (`prev - 1 - key` as unsigned, "
                            "fused to one VIADDMNMX per element on Hopper); keys from the bf16 logits also skip "
                            "the per-element division (joint)", knobs=("SELECT",)),
            OpportunitySpec("skip_row_sum", "With renormalisation the softmax row sum cancels: renormalise "
                            "exp(x - m) of the k chosen experts and skip the per-element exp and sum (joint)",
                            knobs=("RENORM_FROM",)),
            OpportunitySpec("cheaper_exp", "tl.exp lowers to 6 instructions per element on sm_90 (range check, "
                            "two predicated multiplies around MUFU.EX2); an ex2.approx.ftz on a pre-scaled input "
                            "is 1-2 (joint: flushes probabilities below 2^-126, changes the row sum)"),
            OpportunitySpec("full_persistent", "Loop several tiles per program so large batches launch fewer "
                            "programs and prefetch the next tile (measured on an H200: 2 tiles per program with "
                            "prefetch 7.8 us vs 8.1 at 32K tokens, more tiles slower; one-warp programs need the "
                            "occupancy more than the overlap)", paths=("full",),
                            knobs=("FULL_TILES_PER_PROGRAM", "FULL_NUM_STAGES", "FULL_PREFETCH")),
            OpportunitySpec("decode_schedule", "Tune the decode launch for 1-256 tokens", paths=("decode",),
                            knobs=("DECODE_TILES_PER_PROGRAM", "DECODE_NUM_STAGES", "DECODE_PREFETCH",
                                   "DECODE_BLOCK_T", "DECODE_NUM_WARPS", "DECODE_TOPK_NET")),
            OpportunitySpec("full_path_tile", "Without a row sum the tile is free per path, so the full path "
                            "may take larger tiles than decode (H200: 8 tokens per tile 7.3 us at 32K tokens vs "
                            "7.8 at 4; 32 per warp, a whole row per thread, 8.4: latency-bound despite 87 instead "
                            "of 140 warp instructions per token)",
                            paths=("full",), knobs=("FULL_BLOCK_T", "FULL_NUM_WARPS")),
            OpportunitySpec("topk_network", "Take the k largest logit keys at once from a bitonic top-k network "
                            "instead of k rounds (the same keys, so the same bits). With a row per thread "
                            "(FULL_BLOCK_T = 32 x FULL_NUM_WARPS) it is min/max pairs in registers: 73 warp "
                            "instructions per token and 68 registers, against 87 and 163 for the rounds at that "
                            "tile (offline sm_90a count); a row spread over threads needs shuffles and is worse. "
                            "Measured on an H200: 7.8-8.0 us at 32K tokens against the root's 7.3 (a row per "
                            "thread leaves ~8 warps per SM, too few to hide latency)",
                            paths=("full",), knobs=("FULL_TOPK_NET", "FULL_BLOCK_T", "FULL_NUM_WARPS"),
                            values=(("FULL_TOPK_NET", True),)),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 37, "experts": 128, "top_k": 8, "seqs": 5}]
        return [
            {"tokens": 37, "experts": 128, "top_k": 8, "seqs": 5, "scale": 1.0},
            {"tokens": 70, "experts": 128, "top_k": 8, "seqs": 9, "scale": 0.05},  # many bf16 ties
            {"tokens": 19, "experts": 60, "top_k": 4, "seqs": 3, "scale": 4.0},
            {"tokens": 23, "experts": 64, "top_k": 6, "seqs": 4, "scale": 2.0, "renormalize": False},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd expert counts (a padded tile, a multiple of no EXPERT_GROUP) and token counts no BLOCK_T divides.
        rows = 9 if interp.interpreting() else 300

        def experts() -> dict[str, Any]:
            e = odd(rng, 3, 257)
            return {"experts": e, "top_k": rng.randint(1, min(8, e)), "renormalize": rng.random() < 0.75}

        t = rng.randint(2, rows)
        return [
            # Tiny logits (bf16 neighbours a few ulps apart) and padding rows (zeros: every expert ties, so the
            # first top_k experts in order), one of them a decoded row.
            {"tokens": t, **experts(), "seqs": rng.randint(1, min(t, 5)), "scale": draw_scale(rng, "tiny"),
             "zero_rows": sorted({rng.randrange(t), t - 1})},
            # One token, large logits; not beyond 30: the chosen experts' exp(x - max) must stay normal fp32
            # numbers, or the probabilities of the top-k method on them ("rounds") would tie at zero.
            {"tokens": 1, **experts(), "seqs": 1, "scale": round(rng.uniform(15.0, 30.0), 2)},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        tokens, experts, top_k, seqs = case["tokens"], case["experts"], case["top_k"], case["seqs"]
        renorm = case.get("renormalize", True)
        tag = f"T{tokens}xE{experts}/top{top_k}/seed{seed}"
        g = checks.generator(seed)
        x = checks.randn((tokens, experts), g, torch.bfloat16, device, case.get("scale", 1.0))
        x[0, : experts // 2] = x[0, experts // 2]  # an exact tie spanning the top-k
        for i in case.get("zero_rows", ()):  # padding rows
            x[i] = 0
        ref_w, ref_i = reference(x, top_k, renorm)
        w, w32, ids = _outputs(tokens, top_k, device)
        impl.moe_routing_full(x, w, ids, w32, renorm)
        out = [checks.finite(f"full finite {tag}", w32),
               checks.reference(f"full weights vs fp64 {tag}", w, ref_w),
               checks.reference(f"full fp32 weights vs fp64 {tag}", w32, ref_w, tol=FP32_TOL),
               equal_ids(f"full expert ids == fp64 stable top-k {tag}", ids, ref_i, kind="reference")]
        bounds = torch.linspace(0, tokens, seqs + 1).round().long()[1:] - 1
        dw, dw32, di = _outputs(seqs, top_k, device)
        impl.moe_routing_decode(x[bounds].contiguous(), dw, di, dw32, renorm)
        out += [checks.bitwise(f"decode == full rows (bf16) {tag}", dw, w[bounds]),
                checks.bitwise(f"decode == full rows (fp32) {tag}", dw32, w32[bounds]),
                equal_ids(f"decode == full rows (ids) {tag}", di, ids[bounds])]
        ow, ow32, oi = _outputs(1, top_k, device)
        impl.moe_routing_decode(x[bounds[-1:]].contiguous(), ow, oi, ow32, renorm)
        out += [checks.bitwise(f"decode alone == in batch (bf16) {tag}", ow, dw[-1:]),
                checks.bitwise(f"decode alone == in batch (fp32) {tag}", ow32, dw32[-1:]),
                equal_ids(f"decode alone == in batch (ids) {tag}", oi, di[-1:])]
        p = int(bounds[0]) + 1
        pw, pw32, pi = _outputs(p, top_k, device)
        impl.moe_routing_full(x[:p].contiguous(), pw, pi, pw32, renorm)
        out += [checks.bitwise(f"full prefix == full rows (fp32) {tag}", pw32, w32[:p]),
                equal_ids(f"full prefix == full rows (ids) {tag}", pi, ids[:p])]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        decode = workload["phase"] == "decode"
        rows = workload["batch"] if decode else workload["tokens"]
        experts, top_k = workload["experts"], workload["top_k"]
        fn = impl.moe_routing_decode if decode else impl.moe_routing_full
        set_bytes = rows * experts * 2
        copies = checks.input_copies(device, set_bytes, most=16)
        g = checks.generator(seed)
        xs = [checks.randn((rows, experts), g, torch.bfloat16, device) for _ in range(copies)]
        w, w32, ids = _outputs(rows, top_k, device)
        run = checks.rotate(lambda x: fn(x, w, ids, w32), xs)

        def verify() -> list[Check]:
            fresh = checks.randn((rows, experts), checks.generator(seed + 7919), torch.bfloat16, device)
            checks.poison(w, w32)
            ids.fill_(-1)
            fn(fresh, w, ids, w32)
            ref_w, ref_i = reference(fresh, top_k)
            return [checks.finite("fresh inputs finite", w32),
                    checks.reference("fresh inputs vs fp64", w32, ref_w, tol=FP32_TOL),
                    equal_ids("fresh inputs ids == fp64 stable top-k", ids, ref_i, kind="reference")]

        return Bench(run=run, verify=verify, bytes_moved=set_bytes + rows * top_k * (2 + 4 + 4),
                     graph_friendly=True)


def _outputs(rows: int, top_k: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    w = torch.empty((rows, top_k), dtype=torch.bfloat16, device=device)
    w32 = torch.empty((rows, top_k), dtype=torch.float32, device=device)
    ids = torch.full((rows, top_k), -1, dtype=torch.int32, device=device)
    checks.poison(w, w32)
    return w, w32, ids
