"""Linear (batch-invariant matmul) family harness: inputs, checks, benches, knob space and opportunities."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import torch

from tik_evo import checks, interp
from tik_evo.family import Backward, Bench, Check, EntryPoint, Family, Knob, OpportunitySpec
from tik_evo_kernels.rmsnorm.family import draw_scale, odd

FP32_TOL = 1e-5  # fp32 accumulation of exact bf16 products against fp64
GRAD_TOL = 1.6e-2  # backward outputs are bf16


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ weight.double().t()
    return y + bias.double() if bias is not None else y


def _grouped_checks(impl, x, w, full32, g, tag, device) -> list[Check]:
    """The grouped launch (one launch for several weights, an MoE layer's experts): the case's weight as expert 1
    of 3, the rows split over the experts (expert 0 empty); expert 1's rows must equal the full pass's bits in both
    paths."""
    tokens, n = full32.shape[0], full32.shape[1]
    other = checks.randn((2, n, x.shape[1]), g, torch.bfloat16, device, x.shape[1] ** -0.5)
    weights = torch.stack([other[0], w, other[1]])
    cut = tokens // 2
    starts = torch.tensor([0, 0, cut, tokens], dtype=torch.int32, device=device)
    out = []
    for path in ("full", "decode"):
        y, y32 = _outputs(tokens, n, device)
        getattr(impl, f"linear_grouped_{path}")(x, weights, starts, y, y32)
        out.append(checks.bitwise(f"grouped {path} == full rows (fp32) {tag}", y32[:cut], full32[:cut]))
    if hasattr(impl, "linear_grouped_backward"):
        gy = checks.randn((tokens, n), g, torch.bfloat16, device)
        xd, wd = x.double().requires_grad_(), weights.double().requires_grad_()
        yd = torch.cat([xd[:cut] @ wd[1].t(), xd[cut:] @ wd[2].t()])
        yd.backward(gy.double())
        gx, gw = torch.empty_like(x), torch.full_like(weights, float("nan"))
        impl.linear_grouped_backward(x, weights, starts, gy, gx, gw)
        out += [checks.reference(f"grouped backward dX vs autograd fp64 {tag}", gx, xd.grad, tol=GRAD_TOL),
                checks.reference(f"grouped backward dW vs autograd fp64 {tag}", gw, wd.grad, tol=GRAD_TOL),
                Check(f"grouped backward dW of an expert without rows is zero {tag}", bool((gw[0] == 0).all()),
                      "reference", {"nonzero": int((gw[0] != 0).sum())})]
    return out


class LinearFamily(Family):
    name = "linear"
    entry_points = ("linear_full", "linear_decode")
    signatures = (
        *(EntryPoint(name, ("x", "weight", "bias", "out", "out32"), writes=("out", "out32"), optional=("out32",))
          for name in ("linear_full", "linear_decode")),
        # An MoE layer's experts in one launch, and the gradients (a file may lack them: checked where present).
        *(EntryPoint(name, ("x", "weights", "starts", "out", "out32"), writes=("out", "out32"), optional=("out32",),
                     required=False) for name in ("linear_grouped_full", "linear_grouped_decode")),
        Backward("linear_backward", ("x", "weight", "grad_out", "grad_x", "grad_weight", "grad_bias"),
                   writes=("grad_x", "grad_weight", "grad_bias"), optional=("grad_bias",), required=False),
        Backward("linear_grouped_backward", ("x", "weights", "starts", "grad_out", "grad_x", "grad_weights"),
                   writes=("grad_x", "grad_weights"), required=False),
    )
    phases = ("full", "decode")
    workload_params = {"full": ("tokens", "n", "k"), "decode": ("batch", "n", "k")}
    knobs = (
        Knob("BLOCK_K", (32, 64, 128), "contract",
             "K step of every tl.dot; the accumulation order over K, so both paths change together"),
        Knob("K_CHUNK", (0, 512, 1024, 2048, 4096), "contract",
             "fixed K split (0: none): chunks from zero accumulators merged in ascending order in every path; "
             "a multiple of BLOCK_K"),
        Knob("K_CHUNK_MIN_K", (0, 1024, 4096, 8192), "contract",
             "split K only for weights with at least this many input columns (a weight property, never M)"),
        Knob("K_CHUNK_SHORT", (0, 1024, 2048), "contract",
             "chunk width for weights of K_CHUNK_MIN_K <= K <= K_CHUNK, which K_CHUNK leaves whole (0: keep them "
             "whole): decode of a short-K, narrow-N weight gets parallel programs; a weight property, never M"),
        Knob("K_CHUNK_EQUAL", (False, True), "contract",
             "split a weight's K into equal chunks of whole BLOCK_K steps (the fewest, up to twice as many, no "
             "wider than K_CHUNK / K_CHUNK_SHORT) instead of K_CHUNK-wide chunks and a remainder: K 9728 in four "
             "of 2432, which the full path's persistent (tile, chunk) items can take; a weight property, never M"),
        Knob("FULL_BLOCK_M", (64, 128, 256), "full", "output rows per tile in the full path"),
        Knob("FULL_BLOCK_N", (64, 128, 256), "full", "output columns per tile in the full path"),
        Knob("FULL_GROUP_M", (1, 4, 8, 16), "full", "row-tile grouping for L2 reuse of W in the full path"),
        Knob("FULL_NUM_WARPS", (4, 8), "full", "warps per tile in the full path"),
        Knob("FULL_NUM_STAGES", (2, 3, 4, 5), "full", "software pipelining depth of the full path"),
        Knob("FULL_SHORT_K", (0, 2048, 4096, 8192), "full",
             "full-path launches with K below this take FULL_SHORT_K_NUM_STAGES (0: none)"),
        Knob("FULL_SHORT_K_NUM_STAGES", (2, 3, 4), "full", "pipelining depth of short-K full-path launches"),
        Knob("FULL_SPLIT_PARALLEL", (False, True), "full",
             "run K chunks as parallel programs plus a merge launch (else in-program) in the full path"),
        Knob("FULL_USE_TMA", (False, True), "full", "load tiles with TMA descriptors in the full path"),
        Knob("FULL_PERSISTENT", ("off", "long_k", "all"), "full",
             "full-path launches of one K chunk with TMA as persistent programs (as many as fit on the SMs at "
             "once) whose tile loop is one software pipeline, so the next tile loads during this one's epilogue: "
             "never, only for the deep-pipeline launches (K >= FULL_SHORT_K), or all"),
        Knob("FULL_PERSISTENT_MAX_CHUNKS", (1, 2, 4), "full",
             "persistent full-path launches may hold up to this many in-program K chunks per tile, walked as "
             "(tile, chunk) items of one pipelined loop (1: only unsplit launches are persistent)"),
        Knob("FULL_UNSPLIT_TILE", ("same", "128x256", "256x128"), "full",
             "full-path launches of one K chunk take this tile with 8 warps, as persistent programs (one per SM, "
             "with TMA): fewer bytes from L2 per output than 128x128; \"same\" keeps FULL_BLOCK_M x FULL_BLOCK_N"),
        Knob("FULL_UNSPLIT_NUM_STAGES", (3, 4), "full", "pipelining depth with FULL_UNSPLIT_TILE"),
        Knob("FULL_CHUNKED_WIDE", ("off", "on", "auto"), "full",
             "persistent full-path launches of several K chunks (FULL_PERSISTENT_MAX_CHUNKS) take FULL_UNSPLIT_TILE "
             "too, the chunk total in registers beside the accumulator (a small spill at 128x256); auto: only "
             "where the wide tiles take no more rounds of equal work over the SMs than the narrow ones"),
        Knob("FULL_GROUPED_BLOCK_M", (0, 64, 128), "full",
             "row tile of full-path grouped launches (linear_grouped_full; 0 = FULL_BLOCK_M): an expert's rows "
             "round up to it"),
        Knob("FULL_GROUPED_BLOCK_N", (0, 64, 128, 256), "full",
             "column tile of full-path grouped launches (0 = FULL_BLOCK_N)"),
        Knob("FULL_GROUPED_NUM_STAGES", (2, 3, 4, 5), "full", "pipelining depth of full-path grouped launches"),
        Knob("DECODE_BLOCK_M", (16, 32, 64, 128), "decode", "output rows per tile in decode"),
        Knob("DECODE_BLOCK_N", (0, 16, 32, 64, 128, 256), "decode",
             "output columns per tile in decode (narrow: more programs streaming W); 0 = per launch, the width of "
             "32/64/128 (and K chunks in parallel or in-program, where the split knobs allow both) whose waves "
             "of programs over the SMs move the fewest bytes per SM"),
        Knob("DECODE_GROUPED_BLOCK_M", (0, 16, 32, 64), "decode",
             "row tile of decode grouped launches (0 = DECODE_BLOCK_M): a decode batch gives each expert a few "
             "rows, and every expert's rows round up to it"),
        Knob("DECODE_GROUPED_BLOCK_N", (0, 32, 64, 128), "decode",
             "column tile of decode grouped launches (0 = DECODE_BLOCK_N, or 64 where that is automatic)"),
        Knob("DECODE_GROUPED_NUM_STAGES", (2, 3, 4, 5), "decode", "pipelining depth of decode grouped launches"),
        Knob("DECODE_GROUP_M", (1, 4, 8), "decode", "row-tile grouping in decode"),
        Knob("DECODE_NUM_WARPS", (2, 4, 8), "decode", "warps per tile in decode"),
        Knob("DECODE_NUM_STAGES", (0, 2, 3, 4, 5, 6), "decode",
             "software pipelining depth of decode; 0 = per launch, the deepest (up to 6) whose programs fit on "
             "the SMs' shared memory in the fewest waves"),
        Knob("DECODE_SPLIT_PARALLEL", (False, True), "decode",
             "run K chunks as parallel programs plus a merge launch (else in-program) in decode"),
        Knob("DECODE_USE_TMA", (False, True), "decode", "load tiles with TMA descriptors in decode"),
        Knob("DECODE_K_UNROLL", (1, 2, 4, 8), "decode",
             "BLOCK_K tiles loaded per K-loop iteration in decode, their dots applied in ascending k (the dot "
             "sequence is unchanged; more bytes in flight per program)"),
        Knob("DECODE_SMALL_M", (0, 8, 16, 32), "decode",
             "decode launches of at most this many rows (0: none) use tiles of max(16, next power of 2 of M) rows "
             "and the DECODE_SMALL_* schedule below"),
        Knob("DECODE_SMALL_BLOCK_N", (8, 16, 32, 64, 128), "decode",
             "output columns per tile in small decode launches"),
        Knob("DECODE_SMALL_K_UNROLL", (1, 2, 4, 8), "decode", "BLOCK_K tiles per K-loop iteration in small decode "
             "launches"),
        Knob("DECODE_SMALL_NUM_WARPS", (1, 2, 4), "decode", "warps per tile in small decode launches"),
        Knob("DECODE_SMALL_NUM_STAGES", (2, 3, 4, 5, 6), "decode", "pipelining depth of small decode launches"),
        Knob("DECODE_FULL_TILES_M", (0, 64, 128, 256), "decode",
             "decode launches of at least this many rows use the full path's tiles, warps and stages (0: never); "
             "their K chunks still follow the decode knobs"),
        Knob("DECODE_SPLIT_MAX_TILES", (0, 64, 96, 128), "decode",
             "run K chunks as parallel programs only when the launch has at most this many tiles (0: any); "
             "larger launches fill the GPU already and fold in-program"),
        Knob("DECODE_FULL_TILES_MIN_PROGRAMS", (0, 64, 96, 132), "decode",
             "take the full path's tiles (DECODE_FULL_TILES_M) only if they make this many programs, parallel "
             "K chunks included (else the regular decode tiles)"),
        Knob("FULL_CHUNK_LOOP", ("unrolled", "flat"), "full",
             "in-program K chunks as one loop copy per chunk, or one loop folding at chunk boundaries"),
        Knob("DECODE_CHUNK_LOOP", ("unrolled", "flat"), "decode",
             "in-program K chunks in decode: one loop copy per chunk, or one folding loop (no K unroll)"),
        Knob("DECODE_SPLIT_MAX_M", (0, 16, 64, 128), "decode",
             "run K chunks as parallel programs only for decode launches of at most this many rows (0: any); "
             "larger ones fold in-program"),
    )

    def validate_workload(self, workload: dict[str, Any]) -> None:
        super().validate_workload(workload)
        if "experts" in workload or "top_k" in workload:  # an MoE layer's experts, in grouped launches
            experts, top_k = workload.get("experts"), workload.get("top_k", 1)
            if not isinstance(experts, int) or experts < 1:
                raise ValueError(f"experts {experts!r} must be a positive integer (the grouped launch's weights)")
            if not isinstance(top_k, int) or not 0 < top_k <= experts:
                raise ValueError(f"top_k {top_k!r} must be an integer in 1..experts ({experts})")
            if workload.get("bias"):
                raise ValueError("bias: the grouped expert launches take no bias")

    def opportunities(self) -> list[OpportunitySpec]:
        return [
            OpportunitySpec("fixed_k_split", "Decode-sized down-projections (small N, large K) launch too few tiles "
                            "to stream W at full bandwidth: cut K into fixed chunks (same absolute boundaries for "
                            "every M), run them as parallel programs in decode and merge in ascending order; the "
                            "full path reproduces the chunks in-program (joint)",
                            knobs=("K_CHUNK", "K_CHUNK_MIN_K", "K_CHUNK_SHORT", "K_CHUNK_EQUAL",
                                   "DECODE_SPLIT_PARALLEL", "DECODE_SPLIT_MAX_M", "DECODE_SPLIT_MAX_TILES",
                                   "FULL_CHUNK_LOOP")),
            OpportunitySpec("decode_row_mask", "Pointer-path decode wraps rows past M onto valid rows; at M = 1 every "
                            "row of the A tile is the same address, which ran 2x slower than the zero-filling TMA path "
                            "(H200). Mask the A rows (other=0) instead: valid rows keep their bits", paths=("decode",)),
            OpportunitySpec("chunked_full_pipeline", "With K_CHUNK > 0 the full path paid 25-35% (runtime outer "
                            "loop), and unrolled chunk loops exhaust the registers at 4 chunks (255, spills, "
                            "serialised wgmma; 3.2x cuBLAS on llama down): fold the chunks in one flat loop "
                            "(joint only if the fold order changes)", paths=("full",),
                            knobs=("K_CHUNK", "FULL_CHUNK_LOOP", "FULL_NUM_STAGES")),
            OpportunitySpec("k_step", "Retune the K step of every dot (joint: changes the accumulation order)",
                            knobs=("BLOCK_K",)),
            OpportunitySpec("full_tile", "Larger wgmma tiles and deeper pipelining for compute-bound prefill "
                            "GEMMs", paths=("full",),
                            knobs=("FULL_BLOCK_M", "FULL_BLOCK_N", "FULL_NUM_WARPS", "FULL_NUM_STAGES",
                                   "FULL_USE_TMA", "FULL_PERSISTENT", "FULL_PERSISTENT_MAX_CHUNKS")),
            OpportunitySpec("full_stages_by_k", "128x128 tiles with 3 stages fit two per SM; 4-5 stages one. "
                            "Long K (9728, 14336) ran 1.03-1.07x cuBLAS with 4-5 stages against 1.11-1.19x with "
                            "3, short K (2560) the reverse (H200): pick the depth by K", paths=("full",),
                            knobs=("FULL_NUM_STAGES", "FULL_SHORT_K", "FULL_SHORT_K_NUM_STAGES")),
            OpportunitySpec("full_unsplit_tile", "Unsplit full-path GEMMs (qkv, gate_up: K 2560) in 128x128 tiles "
                            "are bound by L2-to-SM bandwidth (qkv at M 16384: 8.05 GB from L2 against cuBLAS's 5.41 "
                            "GB with 192x192 tiles, H200): a 128x256 or 256x128 tile as a persistent program reads a "
                            "quarter fewer bytes per output", paths=("full",),
                            knobs=("FULL_UNSPLIT_TILE", "FULL_UNSPLIT_NUM_STAGES", "FULL_CHUNKED_WIDE",
                                   "FULL_GROUP_M")),
            OpportunitySpec("full_l2_grouping", "Group row tiles so W tiles are reused from L2", paths=("full",),
                            knobs=("FULL_GROUP_M",)),
            OpportunitySpec("decode_tile", "Decode is memory-bound on W: narrow tiles to put more programs on the "
                            "SMs, deep pipelining to keep loads in flight", paths=("decode",),
                            knobs=("DECODE_BLOCK_M", "DECODE_BLOCK_N", "DECODE_NUM_WARPS", "DECODE_NUM_STAGES")),
            OpportunitySpec("decode_bytes_in_flight", "Decode at M <= 256 streams W like a GEMV: 64x64 tiles give "
                            "few programs (40 at N = 2560) with few bytes in flight, 1.5-2.7x cuBLAS (H200). "
                            "Narrow BLOCK_N for more programs and load several BLOCK_K tiles per iteration "
                            "(dots still applied one by one in ascending k), within shared memory; GEMV-like "
                            "launches (M <= 16) may take narrower tiles than M = 64..256, where every extra "
                            "column tile re-reads x", paths=("decode",),
                            knobs=("DECODE_BLOCK_N", "DECODE_K_UNROLL", "DECODE_NUM_STAGES", "DECODE_FULL_TILES_M",
                                   "DECODE_FULL_TILES_MIN_PROGRAMS")),
            OpportunitySpec("grouped_tiles", "An MoE layer's experts in one launch (workloads with `experts`): tile "
                            "and pipelining of the grouped launches. Each expert's rows round up to the row tile, so "
                            "decode batches (a few rows per expert) may want a short one; the full path reads each "
                            "expert's weight once per row tile (H200, Qwen3-30B-A3B experts: 128x256 with 4 stages "
                            "0.85-0.91x torch._grouped_mm at 8192 tokens, 128x128 1.3-1.45x)",
                            knobs=("FULL_GROUPED_BLOCK_M", "FULL_GROUPED_BLOCK_N", "FULL_GROUPED_NUM_STAGES",
                                   "DECODE_GROUPED_BLOCK_M", "DECODE_GROUPED_BLOCK_N", "DECODE_GROUPED_NUM_STAGES")),
            # Its own opportunity: the knob operator turns every knob of one at once, and these five only act
            # together (the small schedule exists only when DECODE_SMALL_M > 0).
            OpportunitySpec("small_decode_schedule", "GEMV-like decode launches (M <= DECODE_SMALL_M) with their "
                            "own narrow tiles, K unrolling, warps and pipelining", paths=("decode",),
                            knobs=("DECODE_SMALL_M", "DECODE_SMALL_BLOCK_N", "DECODE_SMALL_K_UNROLL",
                                   "DECODE_SMALL_NUM_WARPS", "DECODE_SMALL_NUM_STAGES")),
        ]

    def check_cases(self, level: str) -> list[dict[str, Any]]:
        if level == "small":
            return [{"tokens": 37, "n": 96, "k": 160, "seqs": 5, "bias": False}]
        return [
            {"tokens": 37, "n": 96, "k": 160, "seqs": 5, "bias": False, "scale": 1.0},
            {"tokens": 70, "n": 136, "k": 200, "seqs": 9, "bias": True, "scale": 4.0},
            {"tokens": 67, "n": 80, "k": 1088, "seqs": 3, "bias": False, "scale": 0.05},
        ]

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        # Odd N and K: a multiple of no tile, BLOCK_K or K chunk (rows then miss TMA's 16-byte alignment, and
        # both paths load through pointers). On the GPU, K up to past K_CHUNK_MIN_K and K_CHUNK (4096) and row
        # counts across the small-decode and full-tile thresholds (16, 128).
        rows, n, k = (9, 80, 400) if interp.interpreting() else (300, 3000, 5000)
        t, u = rng.randint(2, rows), rng.randint(2, rows)
        return [
            # Tiny inputs, padding rows (zeros: the output is the bias), one of them a decoded row.
            {"tokens": t, "n": odd(rng, 3, n), "k": odd(rng, 3, k), "seqs": rng.randint(1, min(t, 5)),
             "bias": rng.random() < 0.5, "scale": draw_scale(rng, "tiny"),
             "zero_rows": sorted({rng.randrange(t), t - 1})},
            # One token, large inputs.
            {"tokens": 1, "n": odd(rng, 3, n), "k": odd(rng, 3, k), "seqs": 1, "bias": rng.random() < 0.5,
             "scale": draw_scale(rng, "large")},
            # N and K odd multiples of 8: 16-byte rows (TMA's loads where a path takes them) ending in a partial
            # K step; no bias, so the grouped launches are checked too.
            {"tokens": u, "n": 8 * odd(rng, 1, n // 8), "k": 8 * odd(rng, 1, k // 8),
             "seqs": rng.randint(1, min(u, 5)), "bias": False, "scale": 1.0},
        ]

    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        tokens, n, k, seqs = case["tokens"], case["n"], case["k"], case["seqs"]
        tag = f"T{tokens}xN{n}xK{k}/seed{seed}"
        g = checks.generator(seed)
        x = checks.randn((tokens, k), g, torch.bfloat16, device, case.get("scale", 1.0))
        for i in case.get("zero_rows", ()):  # padding rows
            x[i] = 0
        w = checks.randn((n, k), g, torch.bfloat16, device, k ** -0.5)
        b = checks.randn((n,), g, torch.bfloat16, device) if case.get("bias") else None
        ref = reference(x, w, b)
        full, full32 = _outputs(tokens, n, device)
        impl.linear_full(x, w, b, full, full32)
        out = [checks.finite(f"full finite {tag}", full), checks.finite(f"full fp32 finite {tag}", full32),
               checks.reference(f"full vs fp64 {tag}", full, ref),
               checks.reference(f"full fp32 vs fp64 {tag}", full32, ref, tol=FP32_TOL)]
        # Last token of each packed sequence, one row per sequence, as rollout decodes it.
        bounds = torch.linspace(0, tokens, seqs + 1).round().long()[1:] - 1
        dec, dec32 = _outputs(seqs, n, device)
        impl.linear_decode(x[bounds].contiguous(), w, b, dec, dec32)
        out += [checks.bitwise(f"decode == full rows (bf16) {tag}", dec, full[bounds]),
                checks.bitwise(f"decode == full rows (fp32) {tag}", dec32, full32[bounds])]
        one, one32 = _outputs(1, n, device)
        impl.linear_decode(x[bounds[-1:]].contiguous(), w, b, one, one32)
        out += [checks.bitwise(f"decode alone == in batch (bf16) {tag}", one, dec[-1:]),
                checks.bitwise(f"decode alone == in batch (fp32) {tag}", one32, dec32[-1:])]
        # Partition: a prompt-only prefill equals the prompt part of the whole pass.
        p = int(bounds[0]) + 1
        part, part32 = _outputs(p, n, device)
        impl.linear_full(x[:p].contiguous(), w, b, part, part32)
        out += [checks.bitwise(f"full prefix == full rows (bf16) {tag}", part, full[:p]),
                checks.bitwise(f"full prefix == full rows (fp32) {tag}", part32, full32[:p])]
        if hasattr(impl, "linear_grouped_full") and b is None:
            out += _grouped_checks(impl, x, w, full32, g, tag, device)
        if hasattr(impl, "linear_backward"):
            out += _backward_checks(impl, x, w, b, g, tag, device)
        return out

    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        if workload.get("experts"):
            return _grouped_bench(impl, workload, seed, device)
        decode = workload["phase"] == "decode"
        m = workload["batch"] if decode else workload["tokens"]
        n, k = workload["n"], workload["k"]
        fn = impl.linear_decode if decode else impl.linear_full
        g = checks.generator(seed)
        set_bytes = (m * k + n * k) * 2
        xs, ws = _input_sets((m, k), (n, k), seed, device, set_bytes)
        b = checks.randn((n,), g, torch.bfloat16, device) if workload.get("bias") else None
        y = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        run = checks.rotate(lambda x, w: fn(x, w, b, y), xs, ws)

        def verify() -> list[Check]:
            fresh = _randn_dev((m, k), seed + 7919, device)
            checks.poison(y)
            fn(fresh, ws[0], b, y)
            return [checks.finite("fresh inputs finite", y),
                    checks.reference("fresh inputs vs fp64", y, reference(fresh, ws[0], b))]

        return Bench(run=run, verify=verify, bytes_moved=set_bytes + m * n * 2, flops=2 * m * n * k,
                     graph_friendly=decode or m * n * k < (1 << 28))


def _input_sets(x_shape: tuple[int, ...], w_shape: tuple[int, ...], seed: int, device: str,
                set_bytes: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Whole (x, W) sets for a bench to rotate through: a real model's next layer has other weights, so L2 must
    not hold W."""
    copies = checks.input_copies(device, set_bytes)
    xs = [_randn_dev(x_shape, seed * 31 + i, device) for i in range(copies)]
    ws = [_randn_dev(w_shape, seed * 31 + 100 + i, device, w_shape[-1] ** -0.5) for i in range(copies)]
    return xs, ws


def routed_starts(tokens: int, experts: int, top_k: int, seed: int, device: str) -> torch.Tensor:
    """[experts + 1] row offsets of tokens x top_k (token, slot) rows sorted by expert, from the top-k of random
    router logits (as an MoE layer would route them)."""
    logits = torch.randn(tokens, experts, generator=checks.generator(seed))
    counts = torch.bincount(torch.topk(logits, top_k, dim=-1).indices.flatten(), minlength=experts)
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(device, torch.int32)


def _grouped_bench(impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
    """An MoE layer's expert projection (workload keys `experts`, `top_k`): tokens (or batch) x top_k routed rows
    through linear_grouped_full / _decode, one weight per expert."""
    decode = workload["phase"] == "decode"
    tokens = workload["batch"] if decode else workload["tokens"]
    n, k, experts, top_k = workload["n"], workload["k"], workload["experts"], workload.get("top_k", 1)
    if not 0 < top_k <= experts:
        raise ValueError(f"workload {workload.get('name', '?')}: top_k {top_k} must be in 1..experts ({experts})")
    fn = impl.linear_grouped_decode if decode else impl.linear_grouped_full
    starts = routed_starts(tokens, experts, top_k, seed, device)
    rows = tokens * top_k
    active = int((starts[1:] > starts[:-1]).sum())
    set_bytes = (rows * k + experts * n * k) * 2
    xs, ws = _input_sets((rows, k), (experts, n, k), seed, device, set_bytes)
    y = torch.empty((rows, n), dtype=torch.bfloat16, device=device)
    run = checks.rotate(lambda x, w: fn(x, w, starts, y), xs, ws)

    def verify() -> list[Check]:
        fresh = _randn_dev((rows, k), seed + 7919, device)
        checks.poison(y)
        fn(fresh, ws[0], starts, y)
        bounds = starts.tolist()
        ref = torch.cat([reference(fresh[bounds[e]:bounds[e + 1]], ws[0][e], None) for e in range(experts)])
        return [checks.finite("fresh inputs finite", y), checks.reference("fresh inputs vs fp64", y, ref)]

    return Bench(run=run, verify=verify, bytes_moved=(rows * k + active * n * k + rows * n) * 2,
                 flops=2 * rows * n * k, graph_friendly=decode or rows * n * k < (1 << 28))


def _backward_checks(impl: ModuleType, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                     g: torch.Generator, tag: str, device: str) -> list[Check]:
    gy = checks.randn((x.shape[0], w.shape[0]), g, torch.bfloat16, device)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    y = xd @ wd.t() + (bd if bd is not None else 0.0)
    y.backward(gy.double())
    gx = torch.empty_like(x)
    gw = torch.empty_like(w)
    gb = torch.empty(w.shape[0], dtype=torch.float32, device=device) if b is not None else None
    impl.linear_backward(x, w, gy, gx, gw, gb)
    out = [checks.reference(f"backward dX vs autograd fp64 {tag}", gx, xd.grad, tol=GRAD_TOL),
           checks.reference(f"backward dW vs autograd fp64 {tag}", gw, wd.grad, tol=GRAD_TOL)]
    if gb is not None:
        out.append(checks.reference(f"backward db vs autograd fp64 {tag}", gb, bd.grad, tol=1e-4))
    return out


def _randn_dev(shape: tuple[int, ...], seed: int, device: str, scale: float = 1.0) -> torch.Tensor:
    # Generated on the device: model-sized inputs would take seconds on the CPU.
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(torch.bfloat16)


def _outputs(rows: int, cols: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty((rows, cols), dtype=torch.bfloat16, device=device)
    y32 = torch.empty((rows, cols), dtype=torch.float32, device=device)
    checks.poison(y, y32)
    return y, y32
