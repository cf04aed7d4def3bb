"""Causal GQA attention family harness: inputs, consistency checks, benches, knob space and opportunities."""

from __future__ import annotations

import math
import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd

# The pre-cast fp32 output carries bf16 rounding of the probabilities in the PV dot; measured ~2e-3.
FP32_TOL = 8e-3
HEAD_DIMS = (64, 128)
# Page sizes the paged checks draw from (each compiles its own decode kernel on a GPU, so only a few): split blocks,
# page edges inside blocks at no power of two, whole blocks a page.
PAGE_SIZES = (16, 48, 256)
# Items of a case's mixed decode batch decoded again from pages under the interpreter (every item on a GPU).
INTERP_PAGED_ITEMS = 6
# Key positions worth decoding besides the answer positions: tile and chunk edges of every knob value.
EDGE_POSITIONS = (0, 1, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1023, 1024, 2047, 2048, 4095, 4096)
_SHAPE = ("batch", "q_heads", "kv_heads", "head_dim")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """fp64 causal GQA attention of query rows ``rows`` (default all) over keys ``[0, row]``, one batch item at a
    time. q [B, HQ, S, D] (or [B, HQ, R, D] with ``rows`` giving the R positions), k/v [B, HKV, S_kv, D]."""
    B, HQ, R, D = q.shape
    group = HQ // k.shape[1]
    pos = torch.arange(R, device=q.device) if rows is None else rows.to(q.device)
    outs = []
    for b in range(B):
        kk = k[b, :, : int(pos.max()) + 1].double().repeat_interleave(group, 0)
        vv = v[b, :, : int(pos.max()) + 1].double().repeat_interleave(group, 0)
        s = q[b].double() @ kk.transpose(-1, -2) / math.sqrt(D)
        keys = torch.arange(kk.shape[1], device=q.device)
        s = s.masked_fill(keys[None, None, :] > pos[None, :, None], float("-inf"))
        outs.append(s.softmax(-1) @ vv)
    return torch.stack(outs)


# The Gluon prefill knobs are in effect only where FULL_IMPL can pick the Gluon kernel.
GLUON_PREFILL = (("FULL_IMPL", ("gluon_ws", "auto")),)


class AttentionFamily(Family):
    name = "attention"
    entry_points = ("prefill", "decode", "prefill_packed", "decode_paged")
    signatures = (
        EntryPoint("prefill", ("q", "k", "v", "sm_scale", "out", "out32"), writes=("out", "out32"),
                   optional=("out32",)),
        EntryPoint("decode", ("q", "k_cache", "v_cache", "context_lens", "sm_scale", "out", "out32"),
                   writes=("out", "out32"), optional=("out32",)),
        EntryPoint("prefill_packed", ("q", "k", "v", "cu_seqlens", "max_seqlen", "sm_scale", "out", "out32"),
                   writes=("out", "out32"), optional=("out32",)),
        # decode from a paged cache (a serving engine's layout), with decode's bits on the same logical cache
        EntryPoint("decode_paged", ("q", "k_pages", "v_pages", "block_table", "context_lens", "sm_scale", "out",
                                    "out32"), writes=("out", "out32"), optional=("out32",)),
    )
    # train_packed: a trainer's packed batch of sequences of different lengths, one `prefill_packed` launch.
    phases = ("prefill", "train_forward", "train_packed", "decode")
    workload_params = {  # noqa: RUF012 - the base class declares it as a plain dict
        "prefill": (*_SHAPE, "seq"),
        "train_forward": (*_SHAPE, "prompt", "answer"),
        "train_packed": ("q_heads", "kv_heads", "head_dim", "lengths"),
        "decode": (*_SHAPE, "context"),
    }
    knobs = (
        Knob("BLOCK_N", (32, 64, 128), "contract",
             "keys per KV block; blocks are walked from key 0 upwards and the block width changes every row's "
             "online-softmax rounding, so both paths use this one value"),
        Knob("SPLIT_TOKENS", (0, 256, 512, 1024, 2048, 4096), "contract",
             "split-KV chunk in absolute key positions (0: no split); each chunk starts a fresh softmax state "
             "and chunks are merged in ascending order; decode runs chunks in parallel, prefill reproduces them"),
        Knob("ROW_SUM", ("reduce", "dot", "tree"), "contract",
             "softmax row sums as a reduction over the accumulator (rounds by MMA layout, so both paths need tiles "
             "of >= 64 rows on Hopper), as a dot of the bf16 probabilities with a ones vector, or as a fixed tree of "
             "pairwise adds (dot and tree are the same in every tile: decode may then use 16- or 32-row tiles)"),
        Knob("NORMALIZE", ("divide", "reciprocal"), "contract",
             "the output's division by the softmax row sum: each element divided, or multiplied by one reciprocal "
             "per row (one rounding more in fp32, far below bf16; fewer instructions in every tile's epilogue)"),
        Knob("BLOCK_M", (64, 128), "full",
             "prefill query rows per program; >= 64 keeps the wgmma layout family the decode tile uses"),
        Knob("FULL_NUM_WARPS", (4, 8), "full", "warps per prefill program"),
        Knob("FULL_NUM_STAGES", (1, 2, 3, 4), "full", "software pipelining depth of the prefill KV loop"),
        Knob("FULL_SPLIT_LOOP", ("flat", "nested", "flatten"), "full",
             "with split-KV, prefill walks all blocks in one loop folding at chunk ends (flat), one loop per "
             "chunk (nested), or a chunk loop nest the compiler flattens into one pipelined loop (flatten); same "
             "chunks and merge order either way"),
        Knob("FULL_KV_LOADS", ("pointer", "tma", "auto"), "full",
             "how prefill (and the packed prefill) loads K/V tiles of blocks every row sees in full: pointer "
             "loads or TMA tensor descriptors (same tiles, so same bits); auto: TMA from 2048 tokens (the "
             "longest sequence, packed), pointers below"),
        Knob("FULL_PERSISTENT", ("off", "row_blocks", "heads", "snake", "auto"), "full",
             "prefill as one program per SM walking the tiles instead of one program per tile: longest row blocks "
             "first with a row block's heads side by side, or one head's row blocks side by side (K/V shared in "
             "L2), longest first; snake: the row_blocks order dealt forwards and backwards in turn, so every "
             "program gets long and short tiles; auto: snake for launches of at most 8 waves of tiles, else off"),
        Knob("FULL_IMPL", ("triton", "gluon_ws", "auto"), "full",
             "which kernel runs prefill: the Triton one, or (Hopper, head dim 64/128, blocks of 32-128 keys; else "
             "Triton) a warp-specialised Gluon kernel with the same per-row operations: a "
             "TMA loader warp and one partition per 64-row warpgroup, no CTA barrier between them; auto: Gluon at "
             "128-key blocks and for launches of more than 4 waves of tiles, Triton otherwise"),
        Knob("FULL_WS_SCHEDULE", ("serial", "overlap"), "full",
             "Gluon prefill: each warpgroup's MMAs one at a time, or the next block's QK^T issued before this "
             "block's PV so its softmax runs during the PV",
             when=GLUON_PREFILL),
        Knob("FULL_WS_BUFFERS", (2, 3, 4), "full",
             "Gluon prefill: K/V block slots in shared memory (fewer where they would not fit)",
             when=GLUON_PREFILL),
        Knob("FULL_WS_PERSISTENT", ("off", "snake", "auto"), "full",
             "Gluon prefill: one program per tile, or one per SM walking snake-dealt tiles, its loader fetching "
             "the next tile's query and first K/V blocks while the warpgroups finish this one; auto: snake for "
             "launches of at most 32 waves of tiles",
             when=GLUON_PREFILL),
        Knob("FULL_WS_CONSUMERS", (2, 3), "full",
             "Gluon prefill: consumer warpgroups per tile (64 query rows each: 128- or 192-row tiles). Three "
             "keep the merged split-KV accumulator in shared memory (registers allow about 160 a thread) and, at "
             "head dim 128, hold one query tile and two K/V slots: measured slower there",
             when=GLUON_PREFILL),
        Knob("FULL_WS_QUERY_TILES", (2, 1), "full",
             "Gluon prefill: query tiles in shared memory; two let the loader fetch the next tile's query during "
             "this one, one leaves that room to K/V slots (FULL_WS_BUFFERS still caps them; 128-key blocks at "
             "head dim 128 get three instead of two, measured slower)",
             when=GLUON_PREFILL),
        Knob("FULL_WS_BANDS", ("off", 8, 4), "full",
             "Gluon prefill, persistent programs: deal the snake over bands of heads (whole GQA groups; the fewest "
             "whose tiles make this many rounds of programs), the bands' rows alternating ascending and descending, "
             "so the tiles in flight share fewer KV heads' keys in L2; off: all heads row block by row block",
             when=GLUON_PREFILL),
        Knob("FULL_WS_DIAG", ("full", "half"), "full",
             "Gluon prefill, 128-row tiles over 128-key blocks, serial schedule, tree row sum: half runs the lower "
             "64 rows' diagonal block on its first 64 keys only (the rest lie past those rows), the same bits for "
             "half that block's tensor and softmax work",
             when=(*GLUON_PREFILL, ("FULL_WS_CONSUMERS", (2,)), ("BLOCK_N", (128,)), ("ROW_SUM", ("tree",)),
                   ("FULL_WS_SCHEDULE", ("serial",)))),
        Knob("FULL_WS_STORE", ("direct", "tma"), "full",
             "Gluon prefill: each consumer stores its output rows from registers, or writes them into its "
             "finished query slot and issues one TMA store (fewer instructions per tile; the slot returns to the "
             "loader once the store has read it)",
             when=GLUON_PREFILL),
        Knob("FULL_WS_ACC", ("auto", "shared"), "full",
             "Gluon prefill: where the merged split-KV accumulator waits between chunk folds. auto: registers with "
             "two consumers, shared memory with three; shared: shared memory with two as well (64 registers a "
             "thread fewer, room the overlapped schedule needs; at head dim 128 and 128-key blocks it fits beside "
             "one query tile and two K/V slots; measured 11% slower on the H200, 19% with the overlapped schedule)",
             when=GLUON_PREFILL),
        Knob("FULL_WS_LOADER_REGS", ("auto", 24), "full",
             "Gluon prefill: registers a thread of the loader warp keeps (setmaxnreg); the consumers share the "
             "rest of the launch's budget. auto: 40 with two consumers (232 each), 32 with three (160 each); 24 "
             "gives two consumers 240 each, which takes the persistent kernel's spill out of its block loop at 128-key "
             "blocks (H200: tree row sum's prefill 0.892 -> 0.920x cuDNN)",
             when=GLUON_PREFILL),
        Knob("DECODE_IMPL", ("triton", "gluon_ws"), "decode",
             "which kernel computes decode's chunks: the Triton one (whole KV blocks per pipeline stage), or (Hopper, "
             "GQA packed, head dim 64/128, 128-key blocks with ROW_SUM dot or tree; else Triton) a warp-specialised "
             "Gluon kernel: a TMA loader warp streams each block as 64-key sub-blocks and one warpgroup does the "
             "block's step from them (same bits as the whole block); its partials go to the merge launch, or with "
             "the fused merge its last program per row group folds them. H200: decode 1.04-1.11x SDPA at 128-key "
             "blocks (tree row sum, fused merge) against 0.87-0.88 for Triton there"),
        Knob("DECODE_WS_BUFFERS", (2, 3, 4, 6), "decode",
             "Gluon decode: 64-key K/V sub-block slots in shared memory (at head dim 128, 32 KB each: 3 slots let "
             "two programs share an SM; more give one program an SM and a deeper prefetch; H200: 4 best, 0.99-1.00x "
             "SDPA, 3 0.92, 2 0.89)",
             when=(("DECODE_IMPL", ("gluon_ws",)),)),
        Knob("DECODE_WS_SCHEDULE", ("serial", "overlap"), "decode",
             "Gluon decode: each block's MMAs one after another, or the next block's QK^T issued before this "
             "block's PV so its softmax runs during the PV (needs two blocks' slots; H200: no faster, 0.95-0.99x)",
             when=(("DECODE_IMPL", ("gluon_ws",)),)),
        Knob("DECODE_BLOCK_M", (16, 32, 64, 128), "decode",
             "rows of the decode tile (GQA heads packed as rows, the rest wasted); below 64 only takes effect "
             "with a layout-free row sum (ROW_SUM dot or tree), since a reduced row sum must keep the wgmma "
             "layout family of prefill"),
        Knob("DECODE_PACK_GQA", (True, False), "decode",
             "one decode program per KV head with its query heads as rows (True) or one per query head (False)"),
        Knob("DECODE_NUM_WARPS", (4, 8), "decode", "warps per decode program"),
        Knob("DECODE_NUM_STAGES", (1, 2, 3, 4, 5, 6), "decode",
             "software pipelining depth of the decode KV loop: K/V blocks in flight per program, what bounds a "
             "program's bandwidth when few programs run (6 stages: 213 KB of shared memory on Hopper)"),
        Knob("DECODE_CHUNKS_PER_PROGRAM", (1, 2, 4, 0, "waves"), "decode",
             "split-KV chunks computed by one decode program (each still written as its own partial); 0 = as "
             "many as still leaves two programs per SM; waves = the fewest waves of programs (as many an SM as "
             "fit) times chunks a program, then the fewest programs"),
        Knob("DECODE_CHUNK_LOOP", ("nested", "flatten"), "decode",
             "with several chunks per decode program: one loop per chunk (nested) or the whole chunks as one "
             "flattened, pipelined loop nest (flatten)"),
        Knob("DECODE_KV_LOADS", ("pointer", "tma"), "decode",
             "how decode loads K/V tiles of whole blocks below the context length: pointers or TMA descriptors"),
        Knob("DECODE_MERGE_LAUNCH", ("plain", "pdl", "fused", "auto"), "decode",
             "launch decode's merge after the chunk kernel (plain), early with programmatic dependent launch, "
             "waiting on the chunk grid inside the kernel (pdl; GPU only, the interpreter runs plain), or not at "
             "all (fused): the last chunk program of each row group to arrive (an integer arrival counter) folds "
             "the partials in the same ascending order; auto: fused for the Gluon decode and for Triton chunk "
             "grids of at least 3/4 of a wave, pdl below (where one Triton program folding every partial is slower "
             "than a merge launch)"),
        Knob("DECODE_FINISH_SINGLE", (False, True), "decode",
             "when the whole cache fits one split chunk, decode is one launch: each program folds its only chunk "
             "into the empty state and normalises it (the merge's own element-wise steps), no merge launch"),
        Knob("DECODE_MERGE_ROWS", (1, 4, 16), "decode",
             "least rows of the merge launch's tile (a KV head's query heads, padded to a power of two); the merge "
             "is element-wise, so padding only costs registers and masked lanes"),
        Knob("DECODE_MERGE_LOADS", (4, 8), "decode",
             "chunk partials the merge loads at once before folding them one by one in ascending order"),
    )

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("split_kv", "Cut the keys into fixed chunks of absolute positions so decode of long "
                            "contexts spreads over many programs (flash-decoding) and merges them in ascending "
                            "order; prefill reproduces the same chunks per row (joint; costs prefill a merge per "
                            "chunk)", knobs=("SPLIT_TOKENS", "DECODE_CHUNKS_PER_PROGRAM")),
            OpportunitySpec("small_decode_tile", "Sum softmax rows in a layout-free way (a dot with a ones vector, "
                            "or a fixed pairwise tree), so decode can use a 16- or 32-row tile for its few query "
                            "heads instead of 64 rows mostly wasted (registers, exponentials, MMA work); the dot "
                            "costs prefill one narrow dot per block, the tree nothing (joint)",
                            knobs=("ROW_SUM", "DECODE_BLOCK_M")),
            OpportunitySpec("normalize", "Normalise the output by one reciprocal of the row sum per row times "
                            "each element instead of dividing each element (joint; the fp32 division expands to "
                            "several instructions per element in every tile's epilogue)", knobs=("NORMALIZE",)),
            OpportunitySpec("kv_block", "Change the KV block width: wider blocks mean fewer online-softmax "
                            "rescales and larger MMAs, narrower ones less shared memory (joint)",
                            knobs=("BLOCK_N",)),
            OpportunitySpec("prefill_tile", "Retune the prefill query tile, warps and pipelining depth for the "
                            "compute-bound long-sequence cells", paths=("full",),
                            knobs=("BLOCK_M", "FULL_NUM_WARPS", "FULL_NUM_STAGES")),
            OpportunitySpec("decode_schedule", "Tune the memory-bound decode launch: GQA packing, tile rows, warps, "
                            "pipelining and chunks per program", paths=("decode",),
                            knobs=("DECODE_PACK_GQA", "DECODE_BLOCK_M", "DECODE_NUM_WARPS", "DECODE_NUM_STAGES",
                                   "DECODE_CHUNKS_PER_PROGRAM", "DECODE_CHUNK_LOOP")),
            OpportunitySpec("prefill_hopper", "Load K/V tiles with TMA tensor descriptors and let the compiler "
                            "flatten the split-KV chunk loop nest into one software pipeline, make short launches "
                            "persistent, or run long ones through the warp-specialised Gluon kernel (a TMA loader "
                            "warp, one partition per warpgroup, the next QK^T overlapping this PV). Keep the dot "
                            "shapes, block order and per-block arithmetic unchanged so decode still agrees",
                            paths=("full",),
                            knobs=("FULL_KV_LOADS", "FULL_SPLIT_LOOP", "FULL_PERSISTENT", "FULL_IMPL",
                                   "FULL_WS_SCHEDULE", "FULL_WS_BUFFERS", "FULL_WS_PERSISTENT",
                                   "FULL_WS_CONSUMERS", "FULL_WS_QUERY_TILES", "FULL_WS_LOADER_REGS",
                                   "FULL_WS_BANDS", "FULL_WS_DIAG", "FULL_WS_STORE", "FULL_WS_ACC")),
            OpportunitySpec("decode_launch", "Hide decode's second launch: start the merge kernel early with "
                            "programmatic dependent launch (it waits on the chunk grid in-kernel), or load whole "
                            "K/V blocks through TMA descriptors", paths=("decode",),
                            knobs=("DECODE_MERGE_LAUNCH", "DECODE_KV_LOADS", "DECODE_FINISH_SINGLE",
                                   "DECODE_MERGE_ROWS", "DECODE_MERGE_LOADS")),
            OpportunitySpec("streamed_decode", "Wide KV blocks with a decode that streams each block in 64-key "
                            "halves (the Gluon decode): 128-key blocks halve the rescales per key in both paths, "
                            "and the halves keep decode's shared memory small, but only a dot or tree row sum splits "
                            "over halves with the same bits (joint: the row sum changes prefill too)",
                            knobs=("BLOCK_N", "ROW_SUM", "DECODE_IMPL", "DECODE_WS_BUFFERS", "DECODE_WS_SCHEDULE")),
            OpportunitySpec("decode_memory", "Decode is bound by reading K/V once: wider vector loads, fewer "
                            "partials written, the merge folded into the last chunk's program (same fixed order)",
                            paths=("decode",)),
        ]

    def validate_workload(self, workload: dict[str, Any]) -> None:
        super().validate_workload(workload)
        lengths = workload.get("lengths")
        if workload["phase"] == "train_packed" and not (
                isinstance(lengths, list) and lengths
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)):
            raise ValueError(f"key 'lengths': expected a non-empty list of positive token counts, got {lengths!r}")

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        # page_size: the case also decodes from a paged cache (`decode_paged`) of that many keys a page: 16 splits
        # every KV block over pages, 48 puts page edges inside blocks at no power of two, 256 holds whole blocks.
        small = {"batch": 2, "q_heads": 4, "kv_heads": 2, "head_dim": 64, "prompt": 45, "answer": 25, "scale": 1.0,
                 "page_size": 16}
        if level == "small":
            return [small]
        if interp.interpreting():  # the CPU interpreter would take hours on the GPU cases below
            return [small, {"batch": 1, "q_heads": 2, "kv_heads": 2, "head_dim": 128, "prompt": 61, "answer": 20,
                            "scale": 3.0, "page_size": 48}]
        return [
            small,
            {"batch": 1, "q_heads": 8, "kv_heads": 1, "head_dim": 128, "prompt": 300, "answer": 41, "scale": 3.0,
             "page_size": 256},
            {"batch": 3, "q_heads": 4, "kv_heads": 4, "head_dim": 128, "prompt": 1000, "answer": 70, "scale": 0.3,
             "page_size": 48},
            {"batch": 2, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "prompt": 2039, "answer": 37, "scale": 1.0},
            {"batch": 1, "q_heads": 8, "kv_heads": 2, "head_dim": 64, "prompt": 4090, "answer": 23, "scale": 2.0},
            # Whole 64-key blocks, but not whole 128-row tiles, and more than 8 waves of tiles on an H200: the
            # lengths and launch sizes where the Gluon prefill (FULL_IMPL) runs.
            {"batch": 3, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "prompt": 1984, "answer": 64, "scale": 1.0},
            {"batch": 2, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "prompt": 960, "answer": 128, "scale": 0.3},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        """Odd prompt and answer lengths (a multiple of no tile, block or split), GQA groups that are not powers of
        two, a one-token prompt, and extreme q/k scales: tiny (near-uniform softmax) and large (near one-hot)."""
        if interp.interpreting():  # a few seconds a case: one small case
            hq = rng.randint(1, 3)
            return [{"batch": 1, "q_heads": hq, "kv_heads": 1, "head_dim": 64, "prompt": odd(rng, 1, 9),
                     "answer": odd(rng, 1, 3), "scale": draw_scale(rng, rng.choice(("tiny", "large"))),
                     "page_size": rng.choice(PAGE_SIZES)}]

        def heads() -> dict[str, Any]:
            kv = rng.randint(1, 8)
            return {"q_heads": kv * rng.randint(1, 32 // kv), "kv_heads": kv, "head_dim": rng.choice(HEAD_DIMS)}

        return [
            {"batch": rng.randint(1, 3), **heads(), "prompt": odd(rng, 3, 1499), "answer": odd(rng, 1, 71),
             "scale": draw_scale(rng, "tiny"), "page_size": rng.choice(PAGE_SIZES)},
            # A one-token prompt, its answer decoded token by token; large scores.
            {"batch": rng.randint(1, 3), **heads(), "prompt": 1, "answer": odd(rng, 1, 71),
             "scale": draw_scale(rng, "large")},
            # Across the split chunk of the root (1024 keys) and other SPLIT_TOKENS values.
            {"batch": rng.randint(1, 2), **heads(), "prompt": odd(rng, 1025, 1499), "answer": odd(rng, 1, 71),
             "scale": round(10 ** rng.uniform(-0.5, 0.5), 3)},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        B, HQ, HKV, D = (case[k] for k in _SHAPE)
        P, A = case["prompt"], case["answer"]
        S = P + A
        tag = f"B{B}xHQ{HQ}xHKV{HKV}xD{D}xP{P}+A{A}/seed{seed}"
        sm_scale = 1.0 / math.sqrt(D)
        g = checks.generator(seed)
        scale = case.get("scale", 1.0)
        q = checks.randn((B, HQ, S, D), g, torch.bfloat16, device, scale)
        k = checks.randn((B, HKV, S, D), g, torch.bfloat16, device, scale)
        v = checks.randn((B, HKV, S, D), g, torch.bfloat16, device)

        full, full32 = _outputs((B, HQ, S, D), device)
        impl.prefill(q, k, v, sm_scale, full, full32)
        out = [checks.finite(f"prefill finite {tag}", full), checks.finite(f"prefill fp32 finite {tag}", full32)]
        ref = reference(q, k, v)
        out += [checks.reference(f"prefill vs fp64 {tag}", full, ref),
                checks.reference(f"prefill fp32 vs fp64 {tag}", full32, ref, tol=FP32_TOL)]

        # Prompt-only prefill == the prompt part of the prompt+answer pass.
        pre, pre32 = _outputs((B, HQ, P, D), device)
        impl.prefill(q[:, :, :P].contiguous(), k[:, :, :P].contiguous(), v[:, :, :P].contiguous(), sm_scale,
                     pre, pre32)
        out += [checks.bitwise(f"prompt prefill == prompt part (bf16) {tag}", pre, full[:, :, :P]),
                checks.bitwise(f"prompt prefill == prompt part (fp32) {tag}", pre32, full32[:, :, :P])]
        if hasattr(impl, "prefill_packed"):
            out += _packed_checks(impl, q, k, v, P, sm_scale, (full, full32), (pre, pre32), tag)

        # Decode, one mixed-length batch: every answer position (and edge positions in the prompt) decoded over a
        # cache holding the sequence's keys up to the context and NaN beyond it (a kernel reading past the
        # context shows up as non-finite output).
        answer_pos = list(range(P, S))
        edge_pos = sorted({t for t in EDGE_POSITIONS if t < P} | {P - 1})
        pos = answer_pos + edge_pos
        items = [(b, t) for t in pos for b in range(B)] if B * len(pos) <= 256 else \
            [(i % B, t) for i, t in enumerate(pos)]
        n = len(items)
        bs = torch.tensor([b for b, _ in items], device=device)
        ts = torch.tensor([t for _, t in items], device=device)
        cap = S + 5
        kc = torch.full((n, HKV, cap, D), float("nan"), dtype=torch.bfloat16, device=device)
        vc = torch.full_like(kc, float("nan"))
        for i, (b, t) in enumerate(items):
            kc[i, :, : t + 1] = k[b, :, : t + 1]
            vc[i, :, : t + 1] = v[b, :, : t + 1]
        ctx = (ts + 1).to(torch.int32)
        qd = q[bs, :, ts].unsqueeze(2).contiguous()
        dec, dec32 = _outputs((n, HQ, 1, D), device)
        impl.decode(qd, kc, vc, ctx, sm_scale, dec, dec32)
        out += [checks.finite(f"decode finite {tag}", dec32)]
        want, want32 = full[bs, :, ts].unsqueeze(2), full32[bs, :, ts].unsqueeze(2)
        is_answer = ts >= P
        for label, sel in (("answer positions", is_answer), ("prompt edge positions", ~is_answer)):
            if not bool(sel.any()):
                continue
            for dt, a, b_ in (("bf16", dec, want), ("fp32", dec32, want32)):
                bad = sorted({int(t) for t in ts[sel][(checks.bits(a[sel]) != checks.bits(b_[sel]))
                                                       .flatten(1).any(1)]})
                out.append(checks.bitwise(f"decode == prefill row at {label} ({dt}) {tag}", a[sel], b_[sel],
                                          positions_mismatched=bad[:20]))

        if case.get("page_size") and hasattr(impl, "decode_paged"):  # (files from before it existed: no check)
            out += _paged_checks(impl, qd, kc, vc, ctx, sm_scale, dec, dec32, case["page_size"], seed, tag)

        # The last prefill row vs decode at full context, decoded alone with a cache of exactly that length; and a
        # sequence decoded alone vs inside the mixed batch (shortest, longest, a middle one).
        order = sorted(range(n), key=lambda i: (items[i][1], items[i][0]))
        for i in sorted({order[0], order[n // 2], order[-1]}):
            b, t = items[i]
            one, one32 = _outputs((1, HQ, 1, D), device)
            impl.decode(qd[i:i + 1], kc[i:i + 1, :, : t + 1].contiguous(), vc[i:i + 1, :, : t + 1].contiguous(),
                        ctx[i:i + 1], sm_scale, one, one32)
            where = f"b{b} ctx{t + 1}"
            out += [checks.bitwise(f"decode alone == in mixed batch (bf16) {where} {tag}", one, dec[i:i + 1]),
                    checks.bitwise(f"decode alone == in mixed batch (fp32) {where} {tag}", one32, dec32[i:i + 1])]
            if t == S - 1:
                out += [checks.bitwise(f"decode at full context == last prefill row (bf16) {tag}", one,
                                       full[b:b + 1, :, t:t + 1]),
                        checks.bitwise(f"decode at full context == last prefill row (fp32) {tag}", one32,
                                       full32[b:b + 1, :, t:t + 1])]
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        phase = workload["phase"]
        if phase == "train_packed":
            return _packed_bench(impl, workload, seed, device)
        B, HQ, HKV, D = (workload[k] for k in _SHAPE)
        sm_scale = 1.0 / math.sqrt(D)
        g = checks.generator(seed)
        if phase == "decode":
            ctx_len = workload["context"]
            set_bytes = 2 * B * HKV * ctx_len * D * 2
            copies = checks.input_copies(device, set_bytes)
            sets = [_decode_inputs(B, HQ, HKV, D, ctx_len, g, device) for _ in range(copies)]
            y = torch.empty((B, HQ, 1, D), dtype=torch.bfloat16, device=device)
            run = checks.rotate(lambda inputs: impl.decode(*inputs, sm_scale, y), sets)

            def verify() -> list[Check]:
                qd, kc, vc, ctx = _decode_inputs(B, HQ, HKV, D, ctx_len, checks.generator(seed + 7919), device)
                checks.poison(y)
                impl.decode(qd, kc, vc, ctx, sm_scale, y)
                ref = reference(qd, kc, vc, rows=torch.tensor([ctx_len - 1]))
                return [checks.finite("fresh inputs finite", y), checks.reference("fresh inputs vs fp64", y, ref)]

            return Bench(run=run, verify=verify, bytes_moved=set_bytes + 2 * B * HQ * D * 2,
                         flops=4 * B * HQ * D * ctx_len, graph_friendly=True)

        S = workload["seq"] if phase == "prefill" else workload["prompt"] + workload["answer"]
        set_bytes = 2 * B * (HQ + HKV) * S * D * 2
        copies = checks.input_copies(device, set_bytes, most=4)
        sets = [_prefill_inputs(B, HQ, HKV, D, S, g, device) for _ in range(copies)]
        y = torch.empty((B, HQ, S, D), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda inputs: impl.prefill(*inputs, sm_scale, y), sets)

        def verify() -> list[Check]:
            q, k, v = _prefill_inputs(B, HQ, HKV, D, S, checks.generator(seed + 7919), device)
            checks.poison(y)
            impl.prefill(q, k, v, sm_scale, y)
            # Reference on sampled rows (first, last, random ones; other rows for each batch item) of every batch
            # item and every query head, so every KV head's group is checked.
            got, ref = [], []
            for b in range(B):
                rows = _sampled_rows(S, seed + b, B)
                r = rows.to(device)
                ref.append(reference(q[b:b + 1, :, r], k[b:b + 1], v[b:b + 1], rows=rows).flatten())
                got.append(y[b:b + 1, :, r].flatten())
            return [checks.finite("fresh inputs finite", y),
                    checks.reference("fresh inputs vs fp64 (sampled rows, every batch item and head)",
                                     torch.cat(got), torch.cat(ref))]

        return Bench(run=run, verify=verify, bytes_moved=set_bytes,
                     flops=4 * B * HQ * D * S * (S + 1) // 2, graph_friendly=False)


def _sampled_rows(n: int, seed: int, sequences: int = 1) -> torch.Tensor:
    """Rows of an n-token sequence a bench's verify checks against fp64: the first, the last, random ones; fewer
    when the verify checks ``sequences`` sequences (the fp64 reference costs heads x rows x n per sequence)."""
    first, last, drawn = (16, 64, 64) if sequences == 1 else (8, 16, max(8, 64 // sequences))
    return torch.unique(torch.cat([torch.arange(min(n, first)), torch.arange(max(0, n - last), n),
                                   torch.randint(0, n, (drawn,), generator=checks.generator(seed))]))


def _packed_bench(impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
    """One `prefill_packed` launch over sequences of the workload's lengths, packed back to back (a training
    batch as a trainer feeds it); verified on sampled rows of every sequence (most start mid-tile), all heads."""
    HQ, HKV, D, lengths = (workload[k] for k in ("q_heads", "kv_heads", "head_dim", "lengths"))
    T, longest = sum(lengths), max(lengths)
    sm_scale = 1.0 / math.sqrt(D)
    cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
    set_bytes = 2 * T * (HQ + HKV) * D * 2

    def inputs(g: torch.Generator):
        return _randn((T, HQ, D), g, device), _randn((T, HKV, D), g, device), _randn((T, HKV, D), g, device)

    g = checks.generator(seed)
    sets = [inputs(g) for _ in range(checks.input_copies(device, set_bytes, most=4))]
    y = torch.empty((T, HQ, D), dtype=torch.bfloat16, device=device)
    run = checks.rotate(lambda qkv: impl.prefill_packed(*qkv, cu, longest, sm_scale, y), sets)

    def verify() -> list[Check]:
        q, k, v = inputs(checks.generator(seed + 7919))
        checks.poison(y)
        impl.prefill_packed(q, k, v, cu, longest, sm_scale, y)
        got, ref = [], []
        for i, n in enumerate(lengths):
            lo = sum(lengths[:i])
            rows = _sampled_rows(n, seed + i, len(lengths))
            r = rows.to(device)
            sq, sk, sv, sy = (t[lo:lo + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v, y))  # [1, heads, n, D]
            ref.append(reference(sq[:, :, r], sk, sv, rows=rows).flatten())
            got.append(sy[:, :, r].flatten())
        return [checks.finite("fresh inputs finite", y),
                checks.reference("fresh inputs vs fp64 (sampled rows of every sequence, every head)",
                                 torch.cat(got), torch.cat(ref))]

    return Bench(run=run, verify=verify, bytes_moved=set_bytes,
                 flops=sum(4 * HQ * D * n * (n + 1) // 2 for n in lengths), graph_friendly=False)


def _packed_checks(impl: ModuleType, q, k, v, P: int, sm_scale: float, full, pre, tag: str) -> list[Check]:
    """The packed entry point: every whole sequence and every prompt alone, interleaved in one packed batch
    (lengths S and P, so sequences start at rows that are not multiples of a tile), must give each token
    `prefill`'s bits. (A file from before the entry point existed skips this check.)"""
    B, HQ, S, D = q.shape
    seqs = [(b, n) for b in range(B) for n in (S, P)]
    cu = torch.tensor([0] + [n for _, n in seqs], dtype=torch.int32).cumsum(0).to(torch.int32).to(q.device)

    def pack(t):  # [B, H, S, D] -> [sum of lengths, H, D]
        return torch.cat([t[b, :, :n].transpose(0, 1) for b, n in seqs]).contiguous()

    got, got32 = _outputs((int(cu[-1]), HQ, D), str(q.device))
    impl.prefill_packed(pack(q), pack(k), pack(v), cu, S, sm_scale, got, got32)
    want = [torch.cat([(f if n == S else p)[b, :, :n].transpose(0, 1) for b, n in seqs])
            for f, p in zip(full, pre)]
    return [checks.bitwise(f"packed prefill == prefill per sequence (bf16) {tag}", got, want[0]),
            checks.bitwise(f"packed prefill == prefill per sequence (fp32) {tag}", got32, want[1])]


def paged_cache(kc: torch.Tensor, vc: torch.Tensor, ctx: torch.Tensor, page: int, g: torch.Generator,
                wider: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contiguous caches kc/vc [n, HKV, cap, D] (item i valid up to ctx[i]) as pages [pages, page, HKV, D] dealt
    in a shuffled order, and the block table (int32 [n, cdiv(cap, page) + wider], a column slice of a wider tensor as
    an engine's may be). Rows past an item's context, the table entries past its last page, and a spare page are
    NaN poison (a valid page index, so reading one shows as a non-finite output instead of a fault)."""
    n, HKV, cap, D = kc.shape
    lens = ctx.tolist()
    need = [-(-c // page) for c in lens]
    total = sum(need) + 2  # + the poison page and an unused one
    perm = torch.randperm(total, generator=g).to(torch.int32)
    width = -(-cap // page) + wider
    table = torch.full((n, width + 3), int(perm[-1]), dtype=torch.int32)[:, :width]
    at = 0
    for i, k in enumerate(need):
        table[i, :k] = perm[at:at + k]
        at += k
    table = table.to(kc.device)
    kp = torch.full((total, page, HKV, D), float("nan"), dtype=kc.dtype, device=kc.device)
    vp = torch.full_like(kp, float("nan"))
    item, pos = (torch.arange(cap, device=kc.device)[None, :] < ctx[:, None].to(kc.device)).nonzero(as_tuple=True)
    pages = table[item, pos // page].long()
    kp[pages, pos % page] = kc[item, :, pos]
    vp[pages, pos % page] = vc[item, :, pos]
    return kp, vp, table


def _paged_checks(impl: ModuleType, qd, kc, vc, ctx, sm_scale: float, dec, dec32, page: int, seed: int,
                  tag: str) -> list[Check]:
    """`decode_paged` over the mixed decode batch's caches dealt into shuffled pages must give every item `decode`'s
    bits (bf16 and fp32): sequences of different lengths, contexts that are no multiple of the page, a block table
    wider than the longest sequence needs (rows a slice of a wider tensor). Under the interpreter a spread of the
    items (shortest to longest context), every item on a GPU."""
    n = qd.shape[0]
    sel = torch.arange(n)
    if interp.interpreting() and n > INTERP_PAGED_ITEMS:
        order = torch.argsort(ctx.cpu(), stable=True)
        sel = order[torch.linspace(0, n - 1, INTERP_PAGED_ITEMS).round().long()]
    sel = sel.to(qd.device)
    kp, vp, table = paged_cache(kc[sel], vc[sel], ctx[sel], page, checks.generator(seed + 104729))
    got, got32 = _outputs(tuple(dec[sel].shape), str(qd.device))
    impl.decode_paged(qd[sel].contiguous(), kp, vp, table, ctx[sel].contiguous(), sm_scale, got, got32)
    where = f"page{page} {len(sel)} items"
    return [checks.finite(f"paged decode finite {where} {tag}", got32),
            checks.bitwise(f"paged decode == decode (bf16) {where} {tag}", got, dec[sel]),
            checks.bitwise(f"paged decode == decode (fp32) {where} {tag}", got32, dec32[sel])]


def _outputs(shape: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty(shape, dtype=torch.bfloat16, device=device)
    y32 = torch.empty(shape, dtype=torch.float32, device=device)
    checks.poison(y, y32)
    return y, y32


def _randn(shape: tuple[int, ...], g: torch.Generator, device: str) -> torch.Tensor:
    """Bench inputs (up to GBs): drawn on the device from a generator seeded by ``g``, never zeros."""
    if device == "cpu":
        return checks.randn(shape, g, torch.bfloat16, device)
    dg = torch.Generator(device=device)
    dg.manual_seed(int(torch.randint(0, 2**62, (1,), generator=g)))
    return torch.randn(shape, generator=dg, dtype=torch.bfloat16, device=device)


def _prefill_inputs(B: int, HQ: int, HKV: int, D: int, S: int, g: torch.Generator, device: str):
    return _randn((B, HQ, S, D), g, device), _randn((B, HKV, S, D), g, device), _randn((B, HKV, S, D), g, device)


def _decode_inputs(B: int, HQ: int, HKV: int, D: int, ctx_len: int, g: torch.Generator, device: str):
    q = _randn((B, HQ, 1, D), g, device)
    kc = _randn((B, HKV, ctx_len, D), g, device)
    vc = _randn((B, HKV, ctx_len, D), g, device)
    ctx = torch.full((B,), ctx_len, dtype=torch.int32, device=device)
    return q, kc, vc, ctx
