"""Unified causal GQA attention (bf16 in/out, fp32 math): full-sequence `prefill` and one-token `decode`.

Both entry points walk KV blocks of BLOCK_N keys from key 0 upwards through one shared per-block function
(`_attn_block`: QK dot, mask, online-softmax update, PV dot) and normalise with one shared function, so a
query row gets the same bits whichever path computed it. With SPLIT_TOKENS > 0 the keys are cut into fixed
chunks of SPLIT_TOKENS absolute positions; each chunk starts from a fresh softmax state and the chunks are
folded in ascending order by one shared merge function (`_merge`). Decode computes the chunks in parallel
programs (flash-decoding) and folds them in a second launch; prefill reproduces the same chunks and folds
per query tile (one loop per chunk, or one loop that folds at chunk ends: FULL_SPLIT_LOOP). Multiply-adds
whose rounding matters are written as explicit `fma` (probabilities, row sums, merges), so the compiler cannot
contract them differently in masked and unmasked blocks or in the two paths. How a tile reaches the dot
(pointer loads or TMA tensor descriptors) and how the launches are chained (plain, or programmatic dependent
launch for decode's merge) are path-only: they move bytes and launches, not arithmetic.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

KNOBS = {
    "BLOCK_N": 64,
    "ROW_SUM": "reduce",
    "SPLIT_TOKENS": 1024,
    "BLOCK_M": 128,
    "FULL_NUM_WARPS": 8,
    "FULL_NUM_STAGES": 3,
    "FULL_SPLIT_LOOP": "nested",
    "FULL_KV_LOADS": "pointer",
    "DECODE_BLOCK_M": 64,
    "DECODE_PACK_GQA": True,
    "DECODE_NUM_WARPS": 4,
    "DECODE_NUM_STAGES": 3,
    "DECODE_CHUNKS_PER_PROGRAM": 1,
    "DECODE_CHUNK_LOOP": "nested",
    "DECODE_KV_LOADS": "pointer",
    "DECODE_MERGE_LAUNCH": "plain",
    "DECODE_FINISH_SINGLE": False,
    "DECODE_MERGE_ROWS": 16,
    "DECODE_MERGE_LOADS": 4,
    "FULL_PERSISTENT": "off",
}

LOG2E = 1.4426950408889634
# Row sums as a reduction over the dot's accumulator layout ("reduce"), as a dot with a ones vector ("dot") or
# as a fixed pairwise tree ("tree"). The reduction rounds differently in 16-row (mma.sync) and 64-row (wgmma)
# tiles; the dot and the tree are the same in every tile, which lets decode use tiles of fewer than 64 rows
# (one contract value for both paths, read as a global constexpr).
ROW_SUM_DOT = tl.constexpr(KNOBS["ROW_SUM"] == "dot")
ROW_SUM_TREE = tl.constexpr(KNOBS["ROW_SUM"] == "tree")


@triton.jit
def _load_block(k_base, v_base, k_desc, v_desc, desc_row0, start_n, key_limit,
                HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr):
    """K^T [HEAD_D, BLOCK_N] and V [BLOCK_N, HEAD_D] of one block; keys at or past key_limit load as zeros.

    TMA is only used for blocks every row sees in full (MASK=False): those rows are valid keys of this head, so
    the flat [heads * seq, HEAD_D] descriptor never reads past the head and the tiles equal the pointer loads.
    """
    if TMA and not MASK:
        k = k_desc.load([desc_row0 + start_n, 0]).T
        v = v_desc.load([desc_row0 + start_n, 0])
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_D)
        if MASK:
            in_kv = offs_n < key_limit
            k = tl.load(k_base + offs_n[None, :] * HEAD_D + offs_d[:, None], mask=in_kv[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None] * HEAD_D + offs_d[None, :], mask=in_kv[:, None], other=0.0)
        else:
            k = tl.load(k_base + offs_n[None, :] * HEAD_D + offs_d[:, None])
            v = tl.load(v_base + offs_n[:, None] * HEAD_D + offs_d[None, :])
    return k, v


@triton.jit
def _attn_block(acc, m_i, l_i, q, k, v, start_n, row_limit, qk_scale, BLOCK_N: tl.constexpr, MASK: tl.constexpr):
    """One KV block for every row of the tile: the per-row arithmetic both paths share.

    `row_limit[r]` is one past the last key row r may see. MASK=False is only used for blocks every row sees
    in full; there `where` would return the scores unchanged, so skipping it does not change any bit.
    """
    s = tl.dot(q, k)
    if MASK:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        s = tl.where(offs_n[None, :] < row_limit[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: avoid (-inf) - (-inf)
    p = tl.math.exp2(tl.math.fma(s, qk_scale, -(m_use * qk_scale)[:, None]))
    alpha = tl.math.exp2((m_i - m_use) * qk_scale)
    p16 = p.to(tl.bfloat16)
    if ROW_SUM_DOT:
        # Sum of the bf16 probabilities the PV dot uses; every column of the product is that sum, so the max
        # over columns picks it exactly.
        ones = tl.full([BLOCK_N, 16], 1.0, tl.float32).to(tl.bfloat16)  # (the interpreter lacks bf16 full)
        row_sum = tl.max(tl.dot(p16, ones), 1)
    elif ROW_SUM_TREE:
        row_sum = _tree_rows(p, BLOCK_N)
    else:
        row_sum = tl.sum(p, 1)
    l_i = tl.math.fma(l_i, alpha, row_sum)
    acc = acc * alpha[:, None]
    acc = tl.dot(p16, v, acc)
    return acc, m_new, l_i


@triton.jit
def _tree_rows(p, BLOCK_N: tl.constexpr):
    """Row sums of p [R, BLOCK_N] as one fixed tree of pairwise adds, whatever p's layout.

    Every level adds pairs of columns that differ in one bit of the column index (a reduction over an axis of
    two is one commutative add), so the bits depend on the pairing only. The bit order (0, then 3 and up, then
    1 and 2) follows an MMA accumulator, whose threads hold column pairs 2t, 2t + 1 of every 8-column group and
    whose four threads t of a quad share a row: in-thread adds first, then two shuffle levels, as a plain
    reduction over that layout costs (the same instruction count for the prefill tile on sm_90a)."""
    R: tl.constexpr = p.shape[0]
    tl.static_assert(BLOCK_N == 16 or BLOCK_N == 32 or BLOCK_N == 64 or BLOCK_N == 128)
    if BLOCK_N == 16:
        x = tl.sum(tl.sum(tl.reshape(p, (R, 2, 2, 2, 2)), 4), 1)  # c0, c3 -> [R, c2, c1]
    elif BLOCK_N == 32:
        x = tl.sum(tl.sum(tl.sum(tl.reshape(p, (R, 2, 2, 2, 2, 2)), 5), 2), 1)  # c0, c3, c4
    elif BLOCK_N == 64:
        x = tl.sum(tl.sum(tl.sum(tl.sum(tl.reshape(p, (R, 2, 2, 2, 2, 2, 2)), 6), 3), 2), 1)  # c0, c3..c5
    else:
        x = tl.sum(tl.sum(tl.sum(tl.sum(tl.sum(tl.reshape(p, (R, 2, 2, 2, 2, 2, 2, 2)), 7), 4), 3), 2), 1)
    return tl.sum(tl.sum(x, 2), 1)  # c1, then c2


@triton.jit
def _walk(acc, m_i, l_i, q, kv, lo, hi, key_limit, row_limit, qk_scale,
          HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr):
    """Blocks starting at lo, lo + BLOCK_N, ... below hi, in ascending order (lo is a multiple of BLOCK_N).

    `kv` is (k_base, v_base, k_desc, v_desc, desc_row0): pointers to this head's keys and values, and the
    descriptors with this head's first row (the pointers again when TMA is off)."""
    k_base, v_base, k_desc, v_desc, desc_row0 = kv
    for start_n in range(lo, hi, BLOCK_N):
        k, v = _load_block(k_base, v_base, k_desc, v_desc, desc_row0, start_n, key_limit, HEAD_D, BLOCK_N, MASK,
                           TMA)
        acc, m_i, l_i = _attn_block(acc, m_i, l_i, q, k, v, start_n, row_limit, qk_scale, BLOCK_N, MASK)
    return acc, m_i, l_i


@triton.jit
def _fresh(BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr):
    """The empty softmax state (an exact identity of `_merge`)."""
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    return acc, m_i, l_i


@triton.jit
def _chunk(q, kv, lo, hi, unmasked_hi, key_limit, row_limit, qk_scale,
           BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """Keys [lo, hi) from a fresh softmax state: whole blocks below unmasked_hi unmasked, the rest masked."""
    acc, m_i, l_i = _fresh(BLOCK_M, HEAD_D)
    mid = tl.maximum(tl.minimum(hi, unmasked_hi), lo)
    acc, m_i, l_i = _walk(acc, m_i, l_i, q, kv, lo, mid, key_limit, row_limit, qk_scale, HEAD_D, BLOCK_N, False,
                          TMA)
    acc, m_i, l_i = _walk(acc, m_i, l_i, q, kv, mid, hi, key_limit, row_limit, qk_scale, HEAD_D, BLOCK_N, True,
                          TMA)
    return acc, m_i, l_i


@triton.jit
def _merge(m_a, l_a, acc_a, m_b, l_b, acc_b, qk_scale):
    """Fold chunk b into the running state a (always in ascending chunk order)."""
    m = tl.maximum(m_a, m_b)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    alpha = tl.math.exp2((m_a - m_use) * qk_scale)
    beta = tl.math.exp2((m_b - m_use) * qk_scale)
    l = tl.math.fma(l_a, alpha, l_b * beta)
    acc = tl.math.fma(acc_a, alpha[:, None], acc_b * beta[:, None])
    return m, l, acc


@triton.jit
def _walk_folding(acc, m_i, l_i, c_acc, c_m, c_l, q, kv, lo, hi, key_limit, row_limit, qk_scale,
                  BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                  MASK: tl.constexpr, TMA: tl.constexpr):
    """Like `_walk` for the chunk state (c_*), folding it into the running state at every chunk end."""
    k_base, v_base, k_desc, v_desc, desc_row0 = kv
    for start_n in range(lo, hi, BLOCK_N):
        k, v = _load_block(k_base, v_base, k_desc, v_desc, desc_row0, start_n, key_limit, HEAD_D, BLOCK_N, MASK,
                           TMA)
        c_acc, c_m, c_l = _attn_block(c_acc, c_m, c_l, q, k, v, start_n, row_limit, qk_scale, BLOCK_N, MASK)
        if (start_n + BLOCK_N) % SPLIT == 0:
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale)
            c_acc, c_m, c_l = _fresh(BLOCK_M, HEAD_D)
    return acc, m_i, l_i, c_acc, c_m, c_l


@triton.jit
def _finish(acc, l_i):
    return acc / l_i[:, None]


@triton.jit
def _kv_source(K, V, head, S, TOTAL_ROWS, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """(k_base, v_base, k_desc, v_desc, desc_row0) for KV head `head` (flat index) of [TOTAL_ROWS / S, S, HEAD_D]
    tensors; without TMA the descriptor slots hold the pointers again (unused)."""
    kv = head.to(tl.int64) * S * HEAD_D
    if TMA:
        k_desc = tl.make_tensor_descriptor(K, shape=[TOTAL_ROWS, HEAD_D], strides=[HEAD_D, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
        v_desc = tl.make_tensor_descriptor(V, shape=[TOTAL_ROWS, HEAD_D], strides=[HEAD_D, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
    else:
        k_desc = K + kv
        v_desc = V + kv
    return K + kv, V + kv, k_desc, v_desc, head * S


@triton.jit
def _prefill_kernel(Q, K, V, O, O32, S, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP, BH,
                    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                    SPLIT_LOOP: tl.constexpr, TMA: tl.constexpr, PERSISTENT: tl.constexpr, WRITE32: tl.constexpr):
    if PERSISTENT == "snake":
        # The row_blocks order dealt like cards: program p takes the p-th tile of even rounds and the p-th from
        # the end of odd ones, so long and short tiles pair up.
        n_m = tl.cdiv(S, BLOCK_M)
        n_tiles = n_m * BH
        n_prog = tl.num_programs(0)
        for j in range(0, tl.cdiv(n_tiles, n_prog)):
            t = j * n_prog + tl.where(j % 2 == 0, tl.program_id(0), n_prog - 1 - tl.program_id(0))
            if t < n_tiles:
                pid_m, bh = _tile_at(t, n_m, BH, False)
                _prefill_tile(Q, K, V, O, O32, S, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP, pid_m, bh,
                              HEAD_D, BLOCK_M, BLOCK_N, SPLIT, SPLIT_LOOP, TMA, WRITE32)
    elif PERSISTENT != "off":
        # Programs walk the tiles a grid apart (the compiler does not pipeline across this loop's nest).
        n_m = tl.cdiv(S, BLOCK_M)
        for t in tl.range(tl.program_id(0), n_m * BH, tl.num_programs(0)):
            pid_m, bh = _tile_at(t, n_m, BH, PERSISTENT == "heads")
            _prefill_tile(Q, K, V, O, O32, S, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP, pid_m, bh,
                          HEAD_D, BLOCK_M, BLOCK_N, SPLIT, SPLIT_LOOP, TMA, WRITE32)
    else:
        _prefill_tile(Q, K, V, O, O32, S, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP,
                      tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1),  # longest causal rows first
                      HEAD_D, BLOCK_M, BLOCK_N, SPLIT, SPLIT_LOOP, TMA, WRITE32)


@triton.jit
def _tile_at(t, n_m, BH, HEADS_FIRST: tl.constexpr):
    """(row block, batch * head) of persistent tile t, longest causal rows first. "row_blocks" order: a row
    block's BH heads side by side (equal work for neighbours); HEADS_FIRST: a head's n_m row blocks side by
    side (neighbours share K/V in L2)."""
    if HEADS_FIRST:
        return n_m - 1 - t % n_m, t // n_m
    return n_m - 1 - t // BH, t % BH


@triton.jit
def _prefill_tile(Q, K, V, O, O32, S, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP, pid_m, bh,
                  HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                  SPLIT_LOOP: tl.constexpr, TMA: tl.constexpr, WRITE32: tl.constexpr):
    """Query rows [pid_m * BLOCK_M, +BLOCK_M) of (batch, query head) bh over their causal keys."""
    b = bh // HQ
    h = bh % HQ
    kv = _kv_source(K, V, b * HKV + h // GROUP, S, TOTAL_ROWS, HEAD_D, BLOCK_N, TMA)
    row0 = bh.to(tl.int64) * S * HEAD_D
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    io = offs_m[:, None] * HEAD_D + offs_d[None, :]
    row_ok = offs_m[:, None] < S
    q = tl.load(Q + row0 + io, mask=row_ok, other=0.0)
    row_limit = offs_m + 1
    tile_start = pid_m * BLOCK_M
    hi = tl.minimum(tile_start + BLOCK_M, S)
    unmasked_hi = (tile_start // BLOCK_N) * BLOCK_N  # blocks ending at or before the tile's first row
    if SPLIT == 0:
        acc, m_i, l_i = _chunk(q, kv, 0, hi, unmasked_hi, S, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, TMA)
    else:
        acc, m_i, l_i = _fresh(BLOCK_M, HEAD_D)
        if SPLIT_LOOP == "flat":
            # One block loop (one software pipeline) that folds and restarts the state at every chunk end.
            c_acc, c_m, c_l = _fresh(BLOCK_M, HEAD_D)
            acc, m_i, l_i, c_acc, c_m, c_l = _walk_folding(acc, m_i, l_i, c_acc, c_m, c_l, q, kv, 0, unmasked_hi,
                                                           S, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, SPLIT,
                                                           False, TMA)
            acc, m_i, l_i, c_acc, c_m, c_l = _walk_folding(acc, m_i, l_i, c_acc, c_m, c_l, q, kv, unmasked_hi, hi,
                                                           S, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, SPLIT,
                                                           True, TMA)
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale)  # open chunk (identity if empty)
            c_lo = hi
        elif SPLIT_LOOP == "flatten":
            # Chunks wholly below the diagonal: a loop nest the compiler flattens into one pipelined loop.
            n_whole = unmasked_hi // SPLIT
            for c in tl.range(0, n_whole, flatten=True):
                c_acc, c_m, c_l = _fresh(BLOCK_M, HEAD_D)
                c_acc, c_m, c_l = _walk(c_acc, c_m, c_l, q, kv, c * SPLIT, c * SPLIT + SPLIT, S, row_limit,
                                        qk_scale, HEAD_D, BLOCK_N, False, TMA)
                m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale)
            c_lo = n_whole * SPLIT
        else:
            c_lo = 0
        for lo in range(c_lo, hi, SPLIT):  # "nested": every chunk; otherwise the chunks left (none for "flat")
            c_acc, c_m, c_l = _chunk(q, kv, lo, tl.minimum(lo + SPLIT, hi), unmasked_hi, S, row_limit, qk_scale,
                                     BLOCK_M, HEAD_D, BLOCK_N, TMA)
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale)
    o = _finish(acc, l_i)
    tl.store(O + row0 + io, o.to(tl.bfloat16), mask=row_ok)
    if WRITE32:
        tl.store(O32 + row0 + io, o, mask=row_ok)


@triton.jit
def _decode_kernel(Q, K, V, CTX, O, O32, M_WS, L_WS, ACC_WS, S_CAP, TOTAL_ROWS, N_CHUNKS, qk_scale, HQ, HKV, GROUP,
                   HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   PACK_GQA: tl.constexpr, CHUNKS_PER_PROGRAM: tl.constexpr, CHUNK_LOOP: tl.constexpr,
                   TMA: tl.constexpr, PDL: tl.constexpr, FINISH_SINGLE: tl.constexpr, WRITE32: tl.constexpr):
    """One program: one KV head's GQA group (PACK_GQA) or one query head, as rows of an M-row tile."""
    if PDL:
        gdc_launch_dependents()  # the merge launch may start now; it waits for this grid before reading
    g = tl.program_id(0)
    pid = tl.program_id(1)
    if PACK_GQA:
        b = pid // HKV
        hk = pid % HKV
        h0 = hk * GROUP
        n_rows = GROUP
    else:
        b = pid // HQ
        h0 = pid % HQ
        hk = h0 // GROUP
        n_rows = 1
    n = tl.load(CTX + b)
    kv = _kv_source(K, V, b * HKV + hk, S_CAP, TOTAL_ROWS, HEAD_D, BLOCK_N, TMA)
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    qrow = b * HQ + h0 + rows  # query heads of this program (q is [B, HQ, 1, D])
    row_ok = rows < n_rows
    q = tl.load(Q + qrow[:, None] * HEAD_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    row_limit = tl.zeros([BLOCK_M], dtype=tl.int32) + n
    n_full = (n // BLOCK_N) * BLOCK_N  # blocks below hold valid keys only; the cache past n may hold anything
    if SPLIT == 0:
        acc, m_i, l_i = _chunk(q, kv, 0, n, n_full, n, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, TMA)
        _store_out(O, O32, qrow, offs_d, row_ok, _finish(acc, l_i), HEAD_D, WRITE32)
    elif FINISH_SINGLE:
        # The whole cache fits one chunk, so every sequence has exactly one: fold it into the empty state and
        # normalise here, the merge launch's own element-wise steps (no merge is launched).
        acc, m_i, l_i = _chunk(q, kv, 0, n, n_full, n, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, TMA)
        f_acc, f_m, f_l = _fresh(BLOCK_M, HEAD_D)
        f_m, f_l, f_acc = _merge(f_m, f_l, f_acc, m_i, l_i, acc, qk_scale)
        _store_out(O, O32, qrow, offs_d, row_ok, _finish(f_acc, f_l), HEAD_D, WRITE32)
    else:
        _chunks_to_partials(q, kv, n, n_full, row_limit, qk_scale, g, qrow, offs_d, row_ok, M_WS, L_WS, ACC_WS,
                            N_CHUNKS, HEAD_D, BLOCK_M, BLOCK_N, SPLIT, CHUNKS_PER_PROGRAM, CHUNK_LOOP, TMA)


@triton.jit
def _chunks_to_partials(q, kv, n, n_full, row_limit, qk_scale, g, qrow, offs_d, row_ok, M_WS, L_WS, ACC_WS, N_CHUNKS,
                        HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                        CHUNKS_PER_PROGRAM: tl.constexpr, CHUNK_LOOP: tl.constexpr, TMA: tl.constexpr):
    """Decode program g's chunks of one sequence, each written as a partial for the merge launch."""
    c_lo = g * CHUNKS_PER_PROGRAM
    c_hi = tl.minimum(c_lo + CHUNKS_PER_PROGRAM, tl.cdiv(n, SPLIT))
    ws_row = qrow.to(tl.int64) * N_CHUNKS
    if CHUNK_LOOP == "flatten":
        # This program's whole chunks (every key valid) as one loop nest the compiler flattens into one
        # software pipeline; the partial last chunk of the sequence, if it is ours, goes below.
        c_whole = tl.maximum(tl.minimum(c_hi, n_full // SPLIT), c_lo)
        for c in tl.range(c_lo, c_whole, flatten=True):
            acc, m_i, l_i = _fresh(BLOCK_M, HEAD_D)
            acc, m_i, l_i = _walk(acc, m_i, l_i, q, kv, c * SPLIT, c * SPLIT + SPLIT, n, row_limit, qk_scale,
                                  HEAD_D, BLOCK_N, False, TMA)
            _store_partial(M_WS, L_WS, ACC_WS, ws_row + c, offs_d, row_ok, m_i, l_i, acc, HEAD_D)
        c_lo = c_whole
    for c in range(c_lo, c_hi):
        lo = c * SPLIT
        acc, m_i, l_i = _chunk(q, kv, lo, tl.minimum(lo + SPLIT, n), n_full, n, row_limit, qk_scale,
                               BLOCK_M, HEAD_D, BLOCK_N, TMA)
        _store_partial(M_WS, L_WS, ACC_WS, ws_row + c, offs_d, row_ok, m_i, l_i, acc, HEAD_D)


@triton.jit
def _store_out(O, O32, qrow, offs_d, ok, o, HEAD_D: tl.constexpr, WRITE32: tl.constexpr):
    io = qrow[:, None] * HEAD_D + offs_d[None, :]
    tl.store(O + io, o.to(tl.bfloat16), mask=ok[:, None])
    if WRITE32:
        tl.store(O32 + io, o, mask=ok[:, None])


@triton.jit
def _store_partial(M_WS, L_WS, ACC_WS, ws, offs_d, ok, m_i, l_i, acc, HEAD_D: tl.constexpr):
    tl.store(M_WS + ws, m_i, mask=ok)
    tl.store(L_WS + ws, l_i, mask=ok)
    tl.store(ACC_WS + ws[:, None] * HEAD_D + offs_d[None, :], acc, mask=ok[:, None])


@triton.jit
def _load_partial(M_WS, L_WS, ACC_WS, ws, offs_d, ok, HEAD_D: tl.constexpr):
    m = tl.load(M_WS + ws, mask=ok, other=float("-inf"))
    l = tl.load(L_WS + ws, mask=ok, other=0.0)
    acc = tl.load(ACC_WS + ws[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0)
    return m, l, acc


@triton.jit
def _load4(M_WS, L_WS, ACC_WS, ws, c, n_chunks, offs_d, ok, HEAD_D: tl.constexpr):
    """Partials c .. c + 3 (the empty state past n_chunks) as one tuple."""
    return (_load_partial(M_WS, L_WS, ACC_WS, ws + c, offs_d, ok & (c < n_chunks), HEAD_D),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 1, offs_d, ok & (c + 1 < n_chunks), HEAD_D),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 2, offs_d, ok & (c + 2 < n_chunks), HEAD_D),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 3, offs_d, ok & (c + 3 < n_chunks), HEAD_D))


@triton.jit
def _fold4(m_i, l_i, acc, parts, qk_scale):
    for j in tl.static_range(4):
        m_i, l_i, acc = _merge(m_i, l_i, acc, parts[j][0], parts[j][1], parts[j][2], qk_scale)
    return m_i, l_i, acc


@triton.jit
def _decode_merge_kernel(CTX, O, O32, M_WS, L_WS, ACC_WS, N_CHUNKS, qk_scale, HQ, HKV, GROUP,
                         HEAD_D: tl.constexpr, ROWS: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
                         LOADS: tl.constexpr, WRITE32: tl.constexpr):
    """Fold the chunk partials of one KV head's query heads in ascending chunk order."""
    pid = tl.program_id(0)
    b = pid // HKV
    hk = pid % HKV
    n = tl.load(CTX + b)
    if PDL:
        gdc_wait()  # launched early (programmatic dependent launch): wait until every partial is written
    rows = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_D)
    qrow = b * HQ + hk * GROUP + rows
    n_chunks = tl.cdiv(n, SPLIT)
    row_ok = rows < GROUP
    acc, m_i, l_i = _fresh(ROWS, HEAD_D)
    ws = qrow.to(tl.int64) * N_CHUNKS
    for c in range(0, n_chunks, LOADS):
        # LOADS (4 or 8) independent partial loads in flight, folded one by one in ascending chunk order;
        # chunks past the end load as the empty state (an exact identity of the merge).
        p0 = _load4(M_WS, L_WS, ACC_WS, ws, c, n_chunks, offs_d, row_ok, HEAD_D)
        if LOADS == 8:
            p1 = _load4(M_WS, L_WS, ACC_WS, ws, c + 4, n_chunks, offs_d, row_ok, HEAD_D)
        m_i, l_i, acc = _fold4(m_i, l_i, acc, p0, qk_scale)
        if LOADS == 8:
            m_i, l_i, acc = _fold4(m_i, l_i, acc, p1, qk_scale)
    _store_out(O, O32, qrow, offs_d, row_ok, _finish(acc, l_i), HEAD_D, WRITE32)


TMA_MIN_SEQ = 2048
PERSISTENT_MAX_WAVES = 8


def _qk_scale(sm_scale: float) -> float:
    return float(sm_scale) * LOG2E


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: CPU tests then reach several chunks per program
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tma_alloc(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _use_tma(knob: str, *tensors: torch.Tensor, seq: int = 0) -> bool:
    """TMA tensor descriptors need 16-byte aligned bases (rows are HEAD_D * 2 bytes, always aligned). "auto"
    (prefill): TMA from TMA_MIN_SEQ tokens, where its longer loops repay building descriptors in every program."""
    mode = KNOBS[knob]
    use = mode == "tma" or (mode == "auto" and seq >= TMA_MIN_SEQ)
    ok = use and all(t.data_ptr() % 16 == 0 for t in tensors)
    if ok and tensors[0].is_cuda:
        triton.set_allocator(_tma_alloc)  # scratch for the in-kernel descriptors
    return ok


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, out: torch.Tensor,
            out32: torch.Tensor | None = None) -> None:
    """Causal attention over whole sequences: q [B, HQ, S, D], k/v [B, HKV, S, D] -> out [B, HQ, S, D]."""
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    block_m = KNOBS["BLOCK_M"]
    n_m = triton.cdiv(S, block_m)
    tiles = n_m * B * HQ
    sms = _sm_count(q.device)
    persistent = KNOBS["FULL_PERSISTENT"]
    if persistent == "auto":  # few tiles: the causal tail dominates, and dealing them balances it
        persistent = "snake" if tiles <= PERSISTENT_MAX_WAVES * sms else "off"
    grid = (min(tiles, sms),) if persistent != "off" else (n_m, B * HQ)
    _prefill_kernel[grid](
        q, k, v, out, out32 if out32 is not None else out, S, B * HKV * S, _qk_scale(sm_scale), HQ, HKV,
        HQ // HKV, B * HQ, HEAD_D=D, PERSISTENT=persistent, BLOCK_M=block_m, BLOCK_N=KNOBS["BLOCK_N"],
        SPLIT=KNOBS["SPLIT_TOKENS"],
        SPLIT_LOOP=KNOBS["FULL_SPLIT_LOOP"], TMA=_use_tma("FULL_KV_LOADS", k, v, seq=S), WRITE32=out32 is not None,
        num_warps=KNOBS["FULL_NUM_WARPS"], num_stages=KNOBS["FULL_NUM_STAGES"],
    )


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,
           sm_scale: float, out: torch.Tensor, out32: torch.Tensor | None = None) -> None:
    """One new token per sequence: q [B, HQ, 1, D] attends keys [0, context_lens[b]) of k/v_cache
    [B, HKV, S_cap, D] (the token's own key included); context_lens is int32 [B], 1 <= len <= S_cap."""
    B, HQ, _, D = q.shape
    HKV, s_cap = k_cache.shape[1], k_cache.shape[2]
    group = HQ // HKV
    split = KNOBS["SPLIT_TOKENS"]
    pack = KNOBS["DECODE_PACK_GQA"]
    layout_free = KNOBS["ROW_SUM"] != "reduce"  # a reduced row sum must keep prefill's wgmma layout family
    block_m = KNOBS["DECODE_BLOCK_M"] if layout_free else max(KNOBS["DECODE_BLOCK_M"], 64)
    block_m = max(block_m, triton.next_power_of_2(group)) if pack else block_m
    cpp = KNOBS["DECODE_CHUNKS_PER_PROGRAM"]
    o32 = out32 if out32 is not None else out
    qk_scale = _qk_scale(sm_scale)
    # A cache of at most one chunk: one launch (a shape choice; the bits are the merge's either way).
    finish_single = bool(split) and KNOBS["DECODE_FINISH_SINGLE"] and s_cap <= split
    merge = bool(split) and not finish_single
    # Programmatic dependent launch exists on the GPU only (Hopper and later); the interpreter runs plain.
    pdl = merge and KNOBS["DECODE_MERGE_LAUNCH"] == "pdl" and q.is_cuda
    if split:
        n_chunks = triton.cdiv(s_cap, split)
        if cpp == 0:  # "auto": the fewest programs that still give every SM two (which program computes a
            # chunk does not change its bits: each chunk starts fresh and is written as its own partial)
            programs = B * (HKV if pack else HQ)
            cpp = 1
            while cpp < n_chunks and triton.cdiv(n_chunks, 2 * cpp) * programs >= 2 * _sm_count(q.device):
                cpp *= 2
    else:
        n_chunks, cpp = 1, 1
    if merge:
        m_ws = torch.empty((B * HQ * n_chunks,), dtype=torch.float32, device=q.device)
        l_ws = torch.empty_like(m_ws)
        acc_ws = torch.empty((B * HQ * n_chunks * D,), dtype=torch.float32, device=q.device)
    else:  # no partials: the slots are never read or written
        m_ws = l_ws = acc_ws = o32
    grid = (triton.cdiv(n_chunks, cpp), B * (HKV if pack else HQ))
    _decode_kernel[grid](
        q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, s_cap, B * HKV * s_cap, n_chunks, qk_scale,
        HQ, HKV, group, HEAD_D=D, BLOCK_M=block_m, BLOCK_N=KNOBS["BLOCK_N"], SPLIT=split, PACK_GQA=pack,
        CHUNKS_PER_PROGRAM=cpp, CHUNK_LOOP=KNOBS["DECODE_CHUNK_LOOP"], TMA=_use_tma("DECODE_KV_LOADS", k_cache, v_cache), PDL=pdl,
        FINISH_SINGLE=finish_single, WRITE32=out32 is not None,
        num_warps=KNOBS["DECODE_NUM_WARPS"], num_stages=KNOBS["DECODE_NUM_STAGES"],
    )
    if merge:
        _decode_merge_kernel[(B * HKV,)](
            context_lens, out, o32, m_ws, l_ws, acc_ws, n_chunks, qk_scale, HQ, HKV, group,
            HEAD_D=D, ROWS=max(KNOBS["DECODE_MERGE_ROWS"], triton.next_power_of_2(group)), SPLIT=split, PDL=pdl,
            LOADS=KNOBS["DECODE_MERGE_LOADS"], WRITE32=out32 is not None, num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )
