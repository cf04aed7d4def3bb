"""MoE router: fp32 softmax over experts, top-k (ties to the lower expert index), optional renormalisation.

Input router logits [tokens, experts] bf16; outputs top-k weights (bf16, and the fp32 values before the cast)
and expert ids (int32), in slot order (largest probability first).

Bitwise agreement between paths holds because both call `_route_tile` with the same contract parameters:
BLOCK_T rows per tile, NUM_WARPS and EXPERT_GROUP fix the tile's shape and layout and so the order of the
softmax row sum; SELECT fixes how the k experts are chosen. Row max, the top-k selection and the slot-order sum
of the selected weights are exact or sequential, independent of layout. The paths differ only in tiles per
program, prefetching, pipelining and whether the chosen keys are staged through memory (an exact round trip).

Selection (SELECT):
- "rounds": k rounds of (max probability, then the lowest expert holding it) over the fp32 probabilities.
- "packed_prob": the same choice with one reduction per round: probabilities are >= 0, so their fp32 bits order
  like integers; (bits << 32) | (BLOCK_E - 1 - expert) is unique per row and its maximum is the "rounds" pick.
  Outputs identical to "rounds".
- "logit_key": the same rounds on an int32 key of the bf16 logit (sign-magnitude bits as a two's-complement
  integer, times BLOCK_E, plus BLOCK_E - 1 - expert; +0 and -0 tie). p = exp(x - m) / s is non-decreasing in
  x and equal logits give equal p, so this is the stable top-k of the logits, which is the stable top-k of the
  probabilities unless two different logits round to the same fp32 probability (then it keeps the exact
  order, like the fp64 reference, where "rounds" ties them to the lower expert). Only the k chosen
  probabilities are computed, with the same operations (exp(x - m) / s) as the other methods, and the row max
  comes from the first round. Each round is one subtraction and one unsigned min per element.
  FULL_/DECODE_TOPK_NET (path knobs) take the k largest keys at once by a bitonic top-k network instead
  (`tl.topk`: sorted runs of K_PAD, then halving by elementwise max and re-merging; slot 0 is the row max). Keys
  are unique, so it picks the same keys in the same order: the same bits. With a row per thread it compiles to
  min/max pairs only, about 10 per element in all, against 2 per element and round (offline sm_90a count:
  `tik-evo bench routing-compile`); with a row spread over threads it needs shuffles and selects. On an
  H200 it ran 7.8-8.0 us at 32K tokens against the rounds' 7.3: a row per thread leaves too few warps to hide
  latency, so fewer instructions did not help; off in the root.
RENORM_FROM (with renormalisation and "logit_key" only): "probs" renormalises the k probabilities exp(x - m) / s;
"logits" renormalises exp(x - m) of the k chosen experts directly, the same value without the row sum s, so
the whole-row exp and sum are skipped (a different rounding: a contract choice).
Tile shape per path (FULL_/DECODE_BLOCK_T, _NUM_WARPS; 0 = the contract's BLOCK_T / NUM_WARPS): only where no
softmax row sum is taken, i.e. "logit_key" with RENORM_FROM "logits" and renormalisation. Every remaining step is
exact (keys, row max, selection) or element-wise or sequential per row (exp(x - m) of the chosen, the slot-order
sum, the division), so the tile cannot change a bit; elsewhere both paths keep the contract tile.
EXPERT_GROUP > 0 loads the tile as [BLOCK_T, BLOCK_E / G, G] (G experts = one 16-byte vector per thread), so
Triton lays whole rows into few threads (32 * NUM_WARPS / BLOCK_T of them when BLOCK_T <= 32 * NUM_WARPS)
and the per-round reductions need few or no shuffles; 0 keeps the flat [BLOCK_T, BLOCK_E] tile (16 threads per
row).
"""

import torch
import triton
import triton.language as tl

try:  # tik-evo's launch path and grid arithmetic; used alone, this file takes Triton's (same kernels, same bits)
    from tik_evo.launch import cdiv, fast, pow2
except ImportError:
    from triton import cdiv
    from triton import next_power_of_2 as pow2

    def fast(kernel):
        return kernel


KNOBS = {
    "BLOCK_T": 4,
    "NUM_WARPS": 1,
    "EXPERT_GROUP": 8,
    "SELECT": "logit_key",
    "RENORM_FROM": "logits",
    "FULL_TILES_PER_PROGRAM": 1,
    "FULL_NUM_STAGES": 1,
    "FULL_PREFETCH": False,
    "FULL_STAGE_KEYS": "off",
    "FULL_TOPK_NET": False,
    "DECODE_TILES_PER_PROGRAM": 1,
    "DECODE_NUM_STAGES": 1,
    "DECODE_PREFETCH": False,
    "DECODE_STAGE_KEYS": "off",
    "DECODE_TOPK_NET": False,
    "FULL_BLOCK_T": 8,
    "FULL_NUM_WARPS": 0,
    "DECODE_BLOCK_T": 0,
    "DECODE_NUM_WARPS": 0,
}


@triton.jit
def _bc(v, GROUP: tl.constexpr):
    """A per-row vector [BLOCK_T] broadcastable against the tile."""
    if GROUP > 0:
        return v[:, None, None]
    else:
        return v[:, None]


@triton.jit
def _reduce(t, axis: tl.constexpr, OP: tl.constexpr):
    if OP == "max":
        return tl.max(t, axis)
    elif OP == "min":
        return tl.min(t, axis)
    else:
        return tl.sum(t, axis)


@triton.jit
def _row(t, OP: tl.constexpr, GROUP: tl.constexpr):
    """Each row of the tile (flat [BLOCK_T, BLOCK_E], or grouped [BLOCK_T, BLOCK_E / G, G]) reduced by OP."""
    if GROUP > 0:
        return _reduce(_reduce(t, 2, OP), 1, OP)
    else:
        return _reduce(t, 1, OP)


@triton.jit
def _next_key(keys, prev, GROUP: tl.constexpr):
    """The largest key below `prev` in each row (keys are unique per row): one subtraction and one unsigned min
    per element. Keys lie well within +-2**30 (int32) or 2**62 (int64) of `prev`, so `prev - 1 - key` never
    overflows; keys >= prev give a negative difference, which as unsigned is larger than any key below."""
    d = _bc(prev, GROUP) - 1 - keys
    if keys.dtype == tl.int64:
        r = _row(d.to(tl.uint64, bitcast=True), "min", GROUP).to(tl.int64, bitcast=True)
    else:
        r = _row(d.to(tl.uint32, bitcast=True), "min", GROUP).to(tl.int32, bitcast=True)
    return prev - 1 - r


@triton.jit
def _logit_key(xb, cols, BLOCK_E: tl.constexpr):
    """An int32 key that orders like the bf16 logit, ties (equal values, +0 == -0) to the lower expert."""
    bits = xb.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended
    sgn = bits >> 15  # 0 or -1
    val = ((bits & 0x7FFF) ^ sgn) - sgn  # sign-magnitude -> two's complement
    return val * BLOCK_E + (BLOCK_E - 1 - cols)


@triton.jit
def _key_logit(key, BLOCK_E: tl.constexpr):
    """(fp32 logit, expert) of a `_logit_key` key; exact."""
    inv = key & (BLOCK_E - 1)
    val = (key - inv) // BLOCK_E  # exact division
    mag = tl.where(val < 0, -val, val)
    bits = tl.where(val < 0, mag | 0x8000, mag) << 16
    return bits.to(tl.float32, bitcast=True), (BLOCK_E - 1 - inv).to(tl.int32)


@triton.jit
def _tile_index(tile, T, E, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, GROUP: tl.constexpr):
    """(rows, row mask, expert columns, column mask) of one tile."""
    rows = tile.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    if GROUP > 0:
        cols = tl.arange(0, BLOCK_E // GROUP)[None, :, None] * GROUP + tl.arange(0, GROUP)[None, None, :]
    else:
        cols = tl.arange(0, BLOCK_E)[None, :]
    return rows, rows < T, cols, cols < E


@triton.jit
def _load_tile(x_ptr, tile, T, E, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, GROUP: tl.constexpr):
    """The tile's bf16 logits; rows past T and padding experts hold -inf."""
    rows, rmask, cols, cmask = _tile_index(tile, T, E, BLOCK_T, BLOCK_E, GROUP)
    return tl.load(x_ptr + _bc(rows, GROUP) * E + cols, mask=_bc(rmask, GROUP) & cmask, other=float("-inf"))


@triton.jit
def _route_tile(xb, w_ptr, w32_ptr, id_ptr, tile, T, E, RENORM: tl.constexpr, WRITE32: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                GROUP: tl.constexpr, SELECT: tl.constexpr, STAGE_KEYS: tl.constexpr, FROM_LOGITS: tl.constexpr,
                TOPK_NET: tl.constexpr):
    """Route the loaded tile `xb` (from `_load_tile`) and store its outputs."""
    rows, rmask, cols, cmask = _tile_index(tile, T, E, BLOCK_T, BLOCK_E, GROUP)
    x = xb.to(tl.float32)
    kcols = tl.arange(0, K_PAD)
    top_w = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    top_i = tl.zeros([BLOCK_T, K_PAD], dtype=tl.int32)
    total = tl.zeros([BLOCK_T], dtype=tl.float32)
    if SELECT == "logit_key":
        keys = _logit_key(xb, cols, BLOCK_E)  # padding experts hold -inf and a smaller tie-break: never first
        if TOPK_NET:
            top_keys = tl.topk(tl.reshape(keys, [BLOCK_T, BLOCK_E]), K_PAD)  # descending: the rounds' keys
            key = tl.max(top_keys, 1)
        else:
            key = _next_key(keys, tl.full([BLOCK_T], 1 << 30, tl.int32), GROUP)
            top_keys = tl.where(kcols[None, :] == 0, key[:, None], 0)
        m, _ = _key_logit(key, BLOCK_E)  # the row max (+0 for a -0 max: x - m is the same)
        m = tl.where(m == float("-inf"), 0.0, m)  # rows past T: keep them finite, they are never stored
        if not (RENORM and FROM_LOGITS):
            e = tl.exp(x - _bc(m, GROUP))
            s = tl.where(rmask, _row(e, "sum", GROUP), 1.0)
        if not TOPK_NET:
            for k in tl.static_range(1, TOP_K):
                key = _next_key(keys, key, GROUP)
                top_keys = tl.where(kcols[None, :] == k, key[:, None], top_keys)
        if STAGE_KEYS:
            # Round-trip the chosen keys through the ids output (exact): the reload takes the store's compact
            # layout, so the epilogue is not repeated by every thread that holds a part of the row.
            smask = rmask[:, None] & (kcols[None, :] < TOP_K)
            soffs = rows[:, None] * TOP_K + kcols[None, :]
            tl.store(id_ptr + soffs, top_keys, mask=smask)
            tl.debug_barrier()
            top_keys = tl.load(id_ptr + soffs, mask=smask, other=0)
        top_x, top_i = _key_logit(top_keys, BLOCK_E)
        if RENORM and FROM_LOGITS:
            # exp(x - m) of the chosen experts only: the renormalisation below divides the row sum out anyway.
            top_w = tl.exp(top_x - m[:, None])
        else:
            top_w = tl.exp(top_x - m[:, None]) / s[:, None]  # the operations of p = e / s in the other methods
        for k in tl.static_range(TOP_K):
            total = total + tl.sum(tl.where(kcols[None, :] == k, top_w, 0.0), 1)  # slot order (adds exact 0s)
    else:
        m = _row(x, "max", GROUP)
        m = tl.where(m == float("-inf"), 0.0, m)  # rows past T: keep them finite, they are never stored
        e = tl.exp(x - _bc(m, GROUP))
        s = tl.where(rmask, _row(e, "sum", GROUP), 1.0)
        p = e / _bc(s, GROUP)
        if SELECT == "packed_prob":
            pkeys = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - cols)
            pkeys = tl.where(cmask, pkeys, -1)  # below every real key (p >= +0)
            key = tl.full([BLOCK_T], 1 << 62, tl.int64)
            for k in tl.static_range(TOP_K):
                key = _next_key(pkeys, key, GROUP)
                v = (key >> 32).to(tl.int32).to(tl.float32, bitcast=True)
                idx = (BLOCK_E - 1 - (key & (BLOCK_E - 1))).to(tl.int32)
                top_w = tl.where(kcols[None, :] == k, v[:, None], top_w)
                top_i = tl.where(kcols[None, :] == k, idx[:, None], top_i)
                total = total + v  # slot order, one add per slot
        else:
            work = tl.where(cmask, p, -1.0)  # probabilities are >= 0: padding is never selected
            for k in tl.static_range(TOP_K):
                v = _row(work, "max", GROUP)
                idx = _row(tl.where(work == _bc(v, GROUP), cols, BLOCK_E), "min", GROUP)  # ties: the lower expert
                top_w = tl.where(kcols[None, :] == k, v[:, None], top_w)
                top_i = tl.where(kcols[None, :] == k, idx[:, None], top_i)
                total = total + v  # slot order, one add per slot
                work = tl.where(cols == _bc(idx, GROUP), -1.0, work)
    if RENORM:
        top_w = top_w / tl.where(rmask, total, 1.0)[:, None]
    omask = rmask[:, None] & (kcols[None, :] < TOP_K)
    offs = rows[:, None] * TOP_K + kcols[None, :]
    tl.store(w_ptr + offs, top_w.to(w_ptr.dtype.element_ty), mask=omask)
    tl.store(id_ptr + offs, top_i, mask=omask)
    if WRITE32:
        tl.store(w32_ptr + offs, top_w, mask=omask)


@triton.jit
def _route_kernel(x_ptr, w_ptr, w32_ptr, id_ptr, T, E, RENORM: tl.constexpr, WRITE32: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                  GROUP: tl.constexpr, SELECT: tl.constexpr, STAGE_KEYS: tl.constexpr, FROM_LOGITS: tl.constexpr,
                  TILES_PER_PROGRAM: tl.constexpr, PREFETCH: tl.constexpr, TOPK_NET: tl.constexpr):
    first = tl.program_id(0) * TILES_PER_PROGRAM
    if PREFETCH:
        # The next tile's load is issued before this tile's selection rounds, so a program's memory wait
        # overlaps its own arithmetic (Triton does not software-pipeline loads that feed no dot).
        xb = _load_tile(x_ptr, first, T, E, BLOCK_T, BLOCK_E, GROUP)
        for i in range(TILES_PER_PROGRAM):
            nxt = tl.where(i + 1 < TILES_PER_PROGRAM, first + i + 1, tl.cdiv(T, BLOCK_T))  # past T: no load
            xb_next = _load_tile(x_ptr, nxt, T, E, BLOCK_T, BLOCK_E, GROUP)
            _route_tile(xb, w_ptr, w32_ptr, id_ptr, first + i, T, E, RENORM, WRITE32, BLOCK_T, BLOCK_E, TOP_K,
                        K_PAD, GROUP, SELECT, STAGE_KEYS, FROM_LOGITS, TOPK_NET)
            xb = xb_next
    else:
        for i in range(TILES_PER_PROGRAM):
            xb = _load_tile(x_ptr, first + i, T, E, BLOCK_T, BLOCK_E, GROUP)
            _route_tile(xb, w_ptr, w32_ptr, id_ptr, first + i, T, E, RENORM, WRITE32, BLOCK_T, BLOCK_E, TOP_K,
                        K_PAD, GROUP, SELECT, STAGE_KEYS, FROM_LOGITS, TOPK_NET)


def _contract(E: int) -> dict:
    """The compile-time parameters both paths share (they depend on the number of experts only)."""
    block_e = pow2(E)
    group = min(KNOBS["EXPERT_GROUP"], block_e)
    return {"BLOCK_T": KNOBS["BLOCK_T"], "BLOCK_E": block_e, "GROUP": group, "SELECT": KNOBS["SELECT"],
            "FROM_LOGITS": KNOBS["SELECT"] == "logit_key" and KNOBS["RENORM_FROM"] == "logits"}


def _stage_keys(block_e: int, group: int, path: str, block_t: int, warps: int) -> bool:
    """Whether the chosen keys round-trip through the ids output (path-only: the round trip is exact).
    Threads holding parts of one row: the flat tile spreads a row over up to 16 threads, a grouped one over
    32 * warps / block_t; "auto" stages when that is more than 2."""
    lanes = min(16, block_e // 8) if group == 0 else max(1, 32 * warps // block_t)
    return KNOBS[path + "_STAGE_KEYS"] == "auto" and KNOBS["SELECT"] == "logit_key" and lanes > 2


def _tile(path: str, renormalize: bool) -> tuple[int, int]:
    """(tokens per tile, warps) of a launch: the path's own where no row sum is taken (the tile then changes no
    bit), else the contract's."""
    free = KNOBS["SELECT"] == "logit_key" and KNOBS["RENORM_FROM"] == "logits" and renormalize
    block_t = (free and KNOBS[path + "_BLOCK_T"]) or KNOBS["BLOCK_T"]
    return block_t, (free and KNOBS[path + "_NUM_WARPS"]) or KNOBS["NUM_WARPS"]


def _launch(logits, weights, ids, weights32, renormalize, path):
    T, E = logits.shape
    top_k = weights.shape[1]
    tiles_pp = KNOBS[path + "_TILES_PER_PROGRAM"]
    if T == 0:
        return
    block_t, warps = _tile(path, bool(renormalize))
    grid = (cdiv(cdiv(T, block_t), tiles_pp),)
    contract = {**_contract(E), "BLOCK_T": block_t}
    fast(_route_kernel)[grid](
        logits, weights, weights32 if weights32 is not None else weights, ids, T, E,
        RENORM=bool(renormalize), WRITE32=weights32 is not None, TOP_K=top_k,
        K_PAD=pow2(top_k), TILES_PER_PROGRAM=tiles_pp, PREFETCH=KNOBS[path + "_PREFETCH"],
        TOPK_NET=KNOBS[path + "_TOPK_NET"],
        STAGE_KEYS=_stage_keys(contract["BLOCK_E"], contract["GROUP"], path, block_t, warps), **contract,
        num_warps=warps, num_stages=KNOBS[path + "_NUM_STAGES"])


def moe_routing_full(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     weights32: torch.Tensor | None = None, renormalize: bool = True) -> None:
    """Every token of a packed batch: logits [tokens, experts] -> weights [tokens, k] (bf16), ids [tokens, k]
    (int32), optionally weights32 (fp32 before the cast); k = weights.shape[1]."""
    _launch(logits, weights, ids, weights32, renormalize, "FULL")


def moe_routing_decode(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                       weights32: torch.Tensor | None = None, renormalize: bool = True) -> None:
    """One token per sequence: logits [batch, experts]; same per-token numerics as moe_routing_full."""
    _launch(logits, weights, ids, weights32, renormalize, "DECODE")
