"""Unified causal GQA attention (bf16 in/out, fp32 math): full-sequence `prefill` and one-token `decode`.

Both entry points walk KV blocks of BLOCK_N keys from key 0 upwards through one shared per-block function
(`_attn_block`: QK dot, mask, online-softmax update, PV dot) and normalise with one shared function, so a
query row gets the same bits whichever path computed it. With SPLIT_TOKENS > 0 the keys are cut into fixed
chunks of SPLIT_TOKENS absolute positions; each chunk starts from a fresh softmax state and the chunks are
folded in ascending order by one shared merge function (`_merge`). Decode computes the chunks in parallel
programs (flash-decoding) and folds them in a second launch, or in the last chunk program of each row group to
finish (DECODE_MERGE_LAUNCH="fused"; an arrival counter picks the program, never the order); prefill reproduces the
same chunks and folds per query tile (one loop per chunk, or one loop that folds at chunk ends: FULL_SPLIT_LOOP).
Multiply-adds whose rounding matters are written as explicit `fma` (probabilities, row sums, merges), so the
compiler cannot contract them differently in masked and unmasked blocks or in the two paths. How a tile reaches the
dot (pointer loads or TMA tensor descriptors) and how the launches are chained (plain, or programmatic dependent
launch for decode's merge) are path-only: they move bytes and launches, not arithmetic. So is which kernel runs
prefill on Hopper (FULL_IMPL): this Triton one, or a warp-specialised Gluon kernel doing the same per-row operations
(`_ws_prefill_kernel`, bit for bit the same on the GPU), and which computes decode's chunks (DECODE_IMPL): the
Triton one, or a Gluon kernel that streams each 128-key block as two 64-key sub-blocks with the same operations per
row (`_dec_kernel`; needs a dot or tree row sum, which split over sub-blocks bit for bit).
"""

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.language.nvidia.hopper import tma as gtma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

try:  # tik-evo's launch path and grid arithmetic; used alone, this file takes Triton's (same kernels, same bits)
    import tik_evo.launch as launch
    from tik_evo.launch import cdiv as _cdiv
    from tik_evo.launch import pow2 as _pow2
except ImportError:
    from triton import cdiv as _cdiv
    from triton import next_power_of_2 as _pow2

    launch = None

KNOBS = {
    "BLOCK_N": 64,
    "ROW_SUM": "reduce",
    "NORMALIZE": "divide",
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
    "FULL_IMPL": "triton",
    "FULL_WS_SCHEDULE": "overlap",
    "FULL_WS_BUFFERS": 4,
    "FULL_WS_PERSISTENT": "off",
    "FULL_WS_CONSUMERS": 2,
    "FULL_WS_QUERY_TILES": 2,
    "FULL_WS_LOADER_REGS": "auto",
    "FULL_WS_BANDS": "off",
    "FULL_WS_DIAG": "full",
    "FULL_WS_STORE": "direct",
    "FULL_WS_ACC": "auto",
    "DECODE_IMPL": "triton",
    "DECODE_WS_BUFFERS": 3,
    "DECODE_WS_SCHEDULE": "serial",
}

LOG2E = 1.4426950408889634
# Row sums as a reduction over the dot's accumulator layout ("reduce"), as a dot with a ones vector ("dot") or
# as a fixed pairwise tree ("tree"). The reduction rounds differently in 16-row (mma.sync) and 64-row (wgmma)
# tiles; the dot and the tree are the same in every tile, which lets decode use tiles of fewer than 64 rows
# (one contract value for both paths, read as a global constexpr).
ROW_SUM_DOT = tl.constexpr(KNOBS["ROW_SUM"] == "dot")
ROW_SUM_TREE = tl.constexpr(KNOBS["ROW_SUM"] == "tree")
# The output's division by the row sum: per element, or one reciprocal per row times each element (one rounding
# more, fewer instructions per tile: the fp32 division expands to a multiply and two range fix-ups per element).
NORMALIZE_RECIPROCAL = tl.constexpr(KNOBS["NORMALIZE"] == "reciprocal")


@triton.jit
def _load_block(k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table, start_n, key_limit,
                HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr,
                PAGE: tl.constexpr):
    """K^T [HEAD_D, BLOCK_N] and V [BLOCK_N, HEAD_D] of one block, key rows `kv_row` elements apart (HEAD_D, or
    heads * HEAD_D in a packed batch or a paged cache); keys at or past key_limit load as zeros.

    PAGE > 0: a paged cache, key j in row j % PAGE of page table[j // PAGE] (rows of every page counted from page
    0's). Only the addresses change: the tiles hold the same values, so the block's bits are the contiguous ones.
    TMA is only used for blocks every row sees in full (MASK=False): those rows are valid keys of this head, so
    the flat [heads * seq, HEAD_D] descriptor never reads past the head and the tiles equal the pointer loads (a
    paged cache: only where a page holds whole blocks, as the host decides).
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if PAGE == 0:
        rows = offs_n
        desc_row = desc_row0 + start_n
    elif PAGE % BLOCK_N == 0:  # blocks start at multiples of BLOCK_N, so this one lies in one page
        first = tl.load(table + start_n // PAGE).to(tl.int64) * PAGE + start_n % PAGE
        rows = first + tl.arange(0, BLOCK_N)
        desc_row = first.to(tl.int32)
    else:  # the block spans pages: each key's own (the table past the context is not read)
        tl.static_assert(not TMA, "TMA needs pages of whole blocks")
        if MASK:
            page = tl.load(table + offs_n // PAGE, mask=offs_n < key_limit, other=0)
        else:
            page = tl.load(table + offs_n // PAGE)
        rows = page.to(tl.int64) * PAGE + offs_n % PAGE
        desc_row = desc_row0  # (no TMA here)
    if TMA and not MASK:
        k = k_desc.load([desc_row, 0]).T
        v = v_desc.load([desc_row, 0])
    else:
        offs_d = tl.arange(0, HEAD_D)
        if MASK:
            in_kv = offs_n < key_limit
            k = tl.load(k_base + rows[None, :] * kv_row + offs_d[:, None], mask=in_kv[None, :], other=0.0)
            v = tl.load(v_base + rows[:, None] * kv_row + offs_d[None, :], mask=in_kv[:, None], other=0.0)
        else:
            k = tl.load(k_base + rows[None, :] * kv_row + offs_d[:, None])
            v = tl.load(v_base + rows[:, None] * kv_row + offs_d[None, :])
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
          HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, TMA: tl.constexpr, PAGE: tl.constexpr = 0):
    """Blocks starting at lo, lo + BLOCK_N, ... below hi, in ascending order (lo is a multiple of BLOCK_N).

    `kv` is (k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table): pointers to this head's keys and values,
    the descriptors with this head's first row (the pointers again when TMA is off), the key row stride, and with
    PAGE > 0 the sequence's block-table row (unused otherwise)."""
    k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table = kv
    for start_n in range(lo, hi, BLOCK_N):
        k, v = _load_block(k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table, start_n, key_limit, HEAD_D,
                           BLOCK_N, MASK, TMA, PAGE)
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
           BLOCK_M: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
           PAGE: tl.constexpr = 0):
    """Keys [lo, hi) from a fresh softmax state: whole blocks below unmasked_hi unmasked, the rest masked."""
    acc, m_i, l_i = _fresh(BLOCK_M, HEAD_D)
    mid = tl.maximum(tl.minimum(hi, unmasked_hi), lo)
    acc, m_i, l_i = _walk(acc, m_i, l_i, q, kv, lo, mid, key_limit, row_limit, qk_scale, HEAD_D, BLOCK_N, False,
                          TMA, PAGE)
    acc, m_i, l_i = _walk(acc, m_i, l_i, q, kv, mid, hi, key_limit, row_limit, qk_scale, HEAD_D, BLOCK_N, True,
                          TMA, PAGE)
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
    k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table = kv
    for start_n in range(lo, hi, BLOCK_N):
        k, v = _load_block(k_base, v_base, k_desc, v_desc, desc_row0, kv_row, table, start_n, key_limit, HEAD_D,
                           BLOCK_N, MASK, TMA, 0)
        c_acc, c_m, c_l = _attn_block(c_acc, c_m, c_l, q, k, v, start_n, row_limit, qk_scale, BLOCK_N, MASK)
        if (start_n + BLOCK_N) % SPLIT == 0:
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale)
            c_acc, c_m, c_l = _fresh(BLOCK_M, HEAD_D)
    return acc, m_i, l_i, c_acc, c_m, c_l


@triton.jit
def _finish(acc, l_i):
    if NORMALIZE_RECIPROCAL:
        return acc * (1.0 / l_i)[:, None]
    else:
        return acc / l_i[:, None]


@triton.jit
def _kv_source(K, V, head, S, TOTAL_ROWS, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """`_walk`'s kv for KV head `head` (flat index) of [TOTAL_ROWS / S, S, HEAD_D] tensors; without TMA the
    descriptor slots hold the pointers again (unused), and the block-table slot K (unused)."""
    kv = head.to(tl.int64) * S * HEAD_D
    if TMA:
        k_desc = tl.make_tensor_descriptor(K, shape=[TOTAL_ROWS, HEAD_D], strides=[HEAD_D, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
        v_desc = tl.make_tensor_descriptor(V, shape=[TOTAL_ROWS, HEAD_D], strides=[HEAD_D, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
    else:
        k_desc = K + kv
        v_desc = V + kv
    return K + kv, V + kv, k_desc, v_desc, head * S, HEAD_D, K


@triton.jit
def _kv_pages(K, V, table, hk, TOTAL_ROWS, KV_ROW: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr,
              TMA: tl.constexpr):
    """`_walk`'s kv for KV head hk of a paged cache [pages, PAGE, HKV, HEAD_D] (TOTAL_ROWS = pages * PAGE rows of
    KV_ROW = HKV * HEAD_D elements): this head's column of page 0, and `table`, the sequence's block-table row. The
    descriptors view that column of every page as [TOTAL_ROWS, HEAD_D] (TMA only where pages hold whole blocks)."""
    col = hk.to(tl.int64) * HEAD_D
    if TMA:
        k_desc = tl.make_tensor_descriptor(K + col, shape=[TOTAL_ROWS, HEAD_D], strides=[KV_ROW, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
        v_desc = tl.make_tensor_descriptor(V + col, shape=[TOTAL_ROWS, HEAD_D], strides=[KV_ROW, 1],
                                           block_shape=[BLOCK_N, HEAD_D])
    else:
        k_desc = K + col
        v_desc = V + col
    return K + col, V + col, k_desc, v_desc, 0, KV_ROW, table


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
    _prefill_rows(Q + row0, O + row0, O32 + row0, HEAD_D, kv, S, qk_scale, pid_m,
                  HEAD_D, BLOCK_M, BLOCK_N, SPLIT, SPLIT_LOOP, TMA, WRITE32)


@triton.jit
def _prefill_packed_kernel(Q, K, V, O, O32, CU, TOTAL_ROWS, qk_scale, HQ, HKV, GROUP,
                           Q_ROW: tl.constexpr, KV_ROW: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, SPLIT_LOOP: tl.constexpr, TMA: tl.constexpr,
                           WRITE32: tl.constexpr):
    """`_prefill_tile` for sequence b of a packed batch (rows CU[b]..CU[b + 1] of [tokens, heads, HEAD_D]
    tensors): the same tile over the sequence's own rows, row 0 at its first token, so the same bits.

    With TMA, the descriptors view one KV head's column of the packed tensors ([tokens, HEAD_D], rows KV_ROW
    apart) and a block of the sequence is the descriptor rows from its first token: TMA is only used for blocks
    every row sees in full, which lie inside the sequence."""
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # longest causal rows first
    bh = tl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    start = tl.load(CU + b)
    S = tl.load(CU + b + 1) - start
    if pid_m * BLOCK_M < S:
        q0 = (start.to(tl.int64) * HQ + h) * HEAD_D
        k0 = (start.to(tl.int64) * HKV + h // GROUP) * HEAD_D
        if TMA:
            col = (h // GROUP) * HEAD_D
            k_desc = tl.make_tensor_descriptor(K + col, shape=[TOTAL_ROWS, HEAD_D], strides=[KV_ROW, 1],
                                               block_shape=[BLOCK_N, HEAD_D])
            v_desc = tl.make_tensor_descriptor(V + col, shape=[TOTAL_ROWS, HEAD_D], strides=[KV_ROW, 1],
                                               block_shape=[BLOCK_N, HEAD_D])
            kv = (K + k0, V + k0, k_desc, v_desc, start, KV_ROW, K)
        else:
            kv = (K + k0, V + k0, K + k0, V + k0, 0, KV_ROW, K)
        _prefill_rows(Q + q0, O + q0, O32 + q0, Q_ROW, kv, S, qk_scale, pid_m,
                      HEAD_D, BLOCK_M, BLOCK_N, SPLIT, SPLIT_LOOP, TMA, WRITE32)


@triton.jit
def _prefill_rows(Q, O, O32, q_row, kv, S, qk_scale, pid_m,
                  HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                  SPLIT_LOOP: tl.constexpr, TMA: tl.constexpr, WRITE32: tl.constexpr):
    """Query rows [pid_m * BLOCK_M, +BLOCK_M) of one sequence and head (rows `q_row` elements apart from Q, O,
    O32) over their causal keys `kv` (see `_walk`)."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    io = offs_m[:, None] * q_row + offs_d[None, :]
    row_ok = offs_m[:, None] < S
    q = tl.load(Q + io, mask=row_ok, other=0.0)
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
    tl.store(O + io, o.to(tl.bfloat16), mask=row_ok)
    if WRITE32:
        tl.store(O32 + io, o, mask=row_ok)


@triton.jit
def _decode_kernel(Q, K, V, CTX, O, O32, M_WS, L_WS, ACC_WS, ARRIVALS, S_CAP, TOTAL_ROWS, N_CHUNKS, qk_scale, HQ,
                   HKV, GROUP, BT, BT_STRIDE, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLIT: tl.constexpr, PACK_GQA: tl.constexpr, CHUNKS_PER_PROGRAM: tl.constexpr,
                   CHUNK_LOOP: tl.constexpr, TMA: tl.constexpr, PDL: tl.constexpr, FINISH_SINGLE: tl.constexpr,
                   FUSED_MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_LOADS: tl.constexpr,
                   WRITE32: tl.constexpr, PAGE: tl.constexpr = 0, KV_ROW: tl.constexpr = 0):
    """One program: one KV head's GQA group (PACK_GQA) or one query head, as rows of an M-row tile.

    PAGE > 0 (`decode_paged`): K and V are pages [pages, PAGE, HKV, HEAD_D] (TOTAL_ROWS = pages * PAGE, KV_ROW =
    HKV * HEAD_D) and sequence b's key j lives in page BT[b * BT_STRIDE + j // PAGE]; everything else is the
    contiguous decode (S_CAP is then the block table's capacity in keys), so the bits are too."""
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
    if PAGE == 0:
        kv = _kv_source(K, V, b * HKV + hk, S_CAP, TOTAL_ROWS, HEAD_D, BLOCK_N, TMA)
    else:
        kv = _kv_pages(K, V, BT + b.to(tl.int64) * BT_STRIDE, hk, TOTAL_ROWS, KV_ROW, HEAD_D, BLOCK_N, TMA)
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    qrow = b * HQ + h0 + rows  # query heads of this program (q is [B, HQ, 1, D])
    row_ok = rows < n_rows
    q = tl.load(Q + qrow[:, None] * HEAD_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    row_limit = tl.zeros([BLOCK_M], dtype=tl.int32) + n
    n_full = (n // BLOCK_N) * BLOCK_N  # blocks below hold valid keys only; the cache past n may hold anything
    if SPLIT == 0:
        acc, m_i, l_i = _chunk(q, kv, 0, n, n_full, n, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, TMA, PAGE)
        _store_out(O, O32, qrow, offs_d, row_ok, _finish(acc, l_i), HEAD_D, WRITE32)
    elif FINISH_SINGLE:
        # The whole cache fits one chunk, so every sequence has exactly one: fold it into the empty state and
        # normalise here, the merge launch's own element-wise steps (no merge is launched).
        acc, m_i, l_i = _chunk(q, kv, 0, n, n_full, n, row_limit, qk_scale, BLOCK_M, HEAD_D, BLOCK_N, TMA, PAGE)
        f_acc, f_m, f_l = _fresh(BLOCK_M, HEAD_D)
        f_m, f_l, f_acc = _merge(f_m, f_l, f_acc, m_i, l_i, acc, qk_scale)
        _store_out(O, O32, qrow, offs_d, row_ok, _finish(f_acc, f_l), HEAD_D, WRITE32)
    else:
        _chunks_to_partials(q, kv, n, n_full, row_limit, qk_scale, g, qrow, offs_d, row_ok, M_WS, L_WS, ACC_WS,
                            N_CHUNKS, HEAD_D, BLOCK_M, BLOCK_N, SPLIT, CHUNKS_PER_PROGRAM, CHUNK_LOOP, TMA, PAGE)
        if FUSED_MERGE:
            # The last of this row group's programs to arrive folds every partial, in ascending chunk order as the
            # merge launch does: the counter only picks who runs the fold, never its order. The barrier orders all
            # threads' partial stores before the (cumulative) release; the winner's acquire orders its loads after.
            tl.debug_barrier()
            arrived = tl.atomic_add(ARRIVALS + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                tl.store(ARRIVALS + pid, 0)  # reset for the next launch (and CUDA-graph replays)
                tl.debug_barrier()
                f_rows = tl.arange(0, MERGE_ROWS)  # the merge launch's tile: the fold is element-wise
                f_qrow = b * HQ + h0 + f_rows
                f_ok = f_rows < n_rows
                acc, m_i, l_i = _fold_partials(M_WS, L_WS, ACC_WS, f_qrow.to(tl.int64) * N_CHUNKS, tl.cdiv(n, SPLIT),
                                               offs_d, f_ok, qk_scale, MERGE_ROWS, HEAD_D, MERGE_LOADS, ".cg")
                _store_out(O, O32, f_qrow, offs_d, f_ok, _finish(acc, l_i), HEAD_D, WRITE32)


@triton.jit
def _chunks_to_partials(q, kv, n, n_full, row_limit, qk_scale, g, qrow, offs_d, row_ok, M_WS, L_WS, ACC_WS, N_CHUNKS,
                        HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                        CHUNKS_PER_PROGRAM: tl.constexpr, CHUNK_LOOP: tl.constexpr, TMA: tl.constexpr,
                        PAGE: tl.constexpr):
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
                                  HEAD_D, BLOCK_N, False, TMA, PAGE)
            _store_partial(M_WS, L_WS, ACC_WS, ws_row + c, offs_d, row_ok, m_i, l_i, acc, HEAD_D)
        c_lo = c_whole
    for c in range(c_lo, c_hi):
        lo = c * SPLIT
        acc, m_i, l_i = _chunk(q, kv, lo, tl.minimum(lo + SPLIT, n), n_full, n, row_limit, qk_scale,
                               BLOCK_M, HEAD_D, BLOCK_N, TMA, PAGE)
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
def _load_partial(M_WS, L_WS, ACC_WS, ws, offs_d, ok, HEAD_D: tl.constexpr, CACHE: tl.constexpr):
    m = tl.load(M_WS + ws, mask=ok, other=float("-inf"), cache_modifier=CACHE)
    l = tl.load(L_WS + ws, mask=ok, other=0.0, cache_modifier=CACHE)
    acc = tl.load(ACC_WS + ws[:, None] * HEAD_D + offs_d[None, :], mask=ok[:, None], other=0.0, cache_modifier=CACHE)
    return m, l, acc


@triton.jit
def _load4(M_WS, L_WS, ACC_WS, ws, c, n_chunks, offs_d, ok, HEAD_D: tl.constexpr, CACHE: tl.constexpr):
    """Partials c .. c + 3 (the empty state past n_chunks) as one tuple."""
    return (_load_partial(M_WS, L_WS, ACC_WS, ws + c, offs_d, ok & (c < n_chunks), HEAD_D, CACHE),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 1, offs_d, ok & (c + 1 < n_chunks), HEAD_D, CACHE),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 2, offs_d, ok & (c + 2 < n_chunks), HEAD_D, CACHE),
            _load_partial(M_WS, L_WS, ACC_WS, ws + c + 3, offs_d, ok & (c + 3 < n_chunks), HEAD_D, CACHE))


@triton.jit
def _fold4(m_i, l_i, acc, parts, qk_scale):
    for j in tl.static_range(4):
        m_i, l_i, acc = _merge(m_i, l_i, acc, parts[j][0], parts[j][1], parts[j][2], qk_scale)
    return m_i, l_i, acc


@triton.jit
def _fold_partials(M_WS, L_WS, ACC_WS, ws, n_chunks, offs_d, row_ok, qk_scale, ROWS: tl.constexpr,
                   HEAD_D: tl.constexpr, LOADS: tl.constexpr, CACHE: tl.constexpr):
    """(acc, m, l): the empty state with partials 0 .. n_chunks - 1 folded in, one by one in ascending order, LOADS
    (4 or 8) independent partial loads in flight; chunks past the end load as the empty state (an exact identity
    of the merge). Element-wise, so the tile's shape and layout do not change its bits."""
    acc, m_i, l_i = _fresh(ROWS, HEAD_D)
    for c in range(0, n_chunks, LOADS):
        p0 = _load4(M_WS, L_WS, ACC_WS, ws, c, n_chunks, offs_d, row_ok, HEAD_D, CACHE)
        if LOADS == 8:
            p1 = _load4(M_WS, L_WS, ACC_WS, ws, c + 4, n_chunks, offs_d, row_ok, HEAD_D, CACHE)
        m_i, l_i, acc = _fold4(m_i, l_i, acc, p0, qk_scale)
        if LOADS == 8:
            m_i, l_i, acc = _fold4(m_i, l_i, acc, p1, qk_scale)
    return acc, m_i, l_i


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
    row_ok = rows < GROUP
    acc, m_i, l_i = _fold_partials(M_WS, L_WS, ACC_WS, qrow.to(tl.int64) * N_CHUNKS, tl.cdiv(n, SPLIT), offs_d,
                                   row_ok, qk_scale, ROWS, HEAD_D, LOADS, "")
    _store_out(O, O32, qrow, offs_d, row_ok, _finish(acc, l_i), HEAD_D, WRITE32)


# ---- Warp-specialised Hopper prefill (Gluon): the same per-row operations in explicit partitions ----
# Triton 3.6 cannot warp-specialise `_prefill_kernel` on Hopper, so its two warpgroups meet at a CTA barrier on
# every KV block. Here a one-warp loader streams K and V by TMA through a ring of shared-memory slots (mbarriers)
# and each warpgroup owns 64 rows of the 128-row tile as its own partition, so one's softmax can run during the
# other's MMAs. Per row it does what `_prefill_tile` does with the flat split loop: the same wgmma shapes (the
# layouts Triton gives the 8-warp 128-row tile), the same expressions as `_attn_block` and `_merge` (restated:
# Gluon cannot call Triton functions), the row sum as `_attn_block` takes it (reduced over the same accumulator
# layout, a ones dot of the same shape, or the same tree). Path knob
# FULL_IMPL; covered: every ROW_SUM, head dim 64/128, any sequence length. Q, K and V come through rank-3
# [heads, seq, dim] descriptors, so rows past the sequence load as zeros, as `_load_block`'s masked loads do.
WS_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup (one wgmma M)
WS_SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
WS_LOWER = gl.constexpr(0)
WS_UPPER = gl.constexpr(1)
WS_TOP = gl.constexpr(2)  # the third consumer (FULL_WS_CONSUMERS=3)
WS_BANDED = gl.constexpr(2)  # PERSISTENT: the snake over head bands (FULL_WS_BANDS)


@gluon.jit
def _ws_tile(i, S, BH, HQ, HKV, GROUP, HB, PERSISTENT: gl.constexpr, CONS: gl.constexpr):
    """This program's i-th tile of CONS * 64 rows: (first row, batch * head, flat KV head, end of its keys). One
    tile per program in launch order (a head's row blocks, longest first), or as one program per SM the
    row-block-major tiles dealt like `_prefill_kernel`'s snake: long and short tiles pair. (Dealt KV head by KV
    head instead, for L2 reuse, a round's tiles span a whole causal triangle and the snake no longer pairs them:
    measured much slower: results/attention/design_notes.md.)"""
    n_m = gl.cdiv(S, CONS * WS_ROWS)
    if PERSISTENT:
        p = gl.program_id(0)
        n_prog = gl.num_programs(0)
        t = i * n_prog + gl.where(i % 2 == 0, p, n_prog - 1 - p)
        if PERSISTENT == WS_BANDED:
            # head bands of HB (whole GQA groups), each row-block-major; the bands alternate ascending and
            # descending rows (the last descending), so the tile lengths run as a zigzag the snake still pairs
            band = t // (n_m * HB)
            r = t % (n_m * HB) // HB
            pid_m = gl.where((gl.cdiv(BH, HB) - 1 - band) % 2 == 1, r, n_m - 1 - r)
            bh = band * HB + t % HB
        else:
            pid_m = n_m - 1 - t // BH
            bh = t % BH
    else:
        pid_m = n_m - 1 - gl.program_id(0) % n_m
        bh = gl.program_id(0) // n_m
    tile_start = pid_m * CONS * WS_ROWS
    return tile_start, bh, bh // HQ * HKV + bh % HQ // GROUP, gl.minimum(tile_start + CONS * WS_ROWS, S)


@gluon.jit
def _ws_n_tiles(S, BH, PERSISTENT: gl.constexpr, CONS: gl.constexpr):
    """Tiles this program walks (the last snake round may leave some programs without one)."""
    if PERSISTENT:
        p = gl.program_id(0)
        n_prog = gl.num_programs(0)
        n_tiles = gl.cdiv(S, CONS * WS_ROWS) * BH
        rounds = gl.cdiv(n_tiles, n_prog)
        last = (rounds - 1) * n_prog + gl.where((rounds - 1) % 2 == 0, p, n_prog - 1 - p)
        return gl.where(last < n_tiles, rounds, rounds - 1)
    else:
        return 1


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
               S, BH, HQ, HKV, GROUP, HB, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, PERSISTENT: gl.constexpr,
               CONS: gl.constexpr, Q_TILES: gl.constexpr):
    """One warp: per tile, every consumer's query rows into one of Q_TILES tile slots, then K and V of every
    block into the slot ring (which runs on across tiles, so the next tile's first blocks load during this
    one's last)."""
    g = 0  # blocks loaded so far: ring slot and phase
    for i in range(_ws_n_tiles(S, BH, PERSISTENT, CONS)):
        tile_start, bh, kv_head, hi = _ws_tile(i, S, BH, HQ, HKV, GROUP, HB, PERSISTENT, CONS)
        qt = i % Q_TILES
        # A fresh mbarrier counts as having completed the phase before 0, so the first round passes at once.
        mbarrier.wait(q_empty.index(qt), ((i // Q_TILES) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qt), CONS * q_desc.block_type.nbytes)  # rows past S count as loaded zeros
        for h in gl.static_range(CONS):
            gtma.async_copy_global_to_shared(q_desc, [bh, tile_start + h * WS_ROWS, 0], q_ready.index(qt),
                                             _ws_box(q_bufs.index(CONS * qt + h), q_desc))
        for j in range(gl.cdiv(hi, BLOCK_N)):
            slot = g % NUM_BUF
            mbarrier.wait(empty.index(slot), ((g // NUM_BUF) & 1) ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            gtma.async_copy_global_to_shared(k_desc, [kv_head, j * BLOCK_N, 0], k_ready.index(slot),
                                             _ws_box(k_bufs.index(slot), k_desc))
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            gtma.async_copy_global_to_shared(v_desc, [kv_head, j * BLOCK_N, 0], v_ready.index(slot),
                                             _ws_box(v_bufs.index(slot), v_desc))
            g += 1


@gluon.jit
def _ws_box(buf, desc):
    """A [rows, dim] slot seen as the descriptor's [1, rows, dim] box (a leading unit dimension: same bytes and
    swizzle)."""
    return buf._reinterpret(gl.bfloat16, desc.block_type.shape, desc.layout)


@gluon.jit
def _ws_probs(s, c_m, c_l, j, rows, qk_scale, masked, ones, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr,
              BLOCK_N: gl.constexpr, ROW_SUM_DOT: gl.constexpr):
    """`_attn_block`'s softmax step for block j's scores: (bf16 P as the PV operand, alpha, m, l); with
    ROW_SUM_DOT the row sum's dot is issued and waited here (with any MMA still in flight)."""
    p16, p, alpha, m_new = _ws_scores_to_probs(s, c_m, j, rows, qk_scale, masked, S_LAYOUT, P_LAYOUT, BLOCK_N)
    S_ROW: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    if ROW_SUM_DOT:
        a = _ws_row_sum_operand(p16)
        rs, _a = warpgroup_mma_wait(0, deps=[_ws_row_sum_issue(a, ones), a])
        l_new = gl.fma(c_l, alpha, _ws_row_sum_take(rs, S_ROW))
    elif ROW_SUM_TREE:
        l_new = gl.fma(c_l, alpha, gl.convert_layout(_ws_tree_rows(p, BLOCK_N), S_ROW))
    else:
        l_new = gl.fma(c_l, alpha, gl.sum(p, 1))
    return p16, alpha, m_new, l_new


@gluon.jit
def _ws_scores_to_probs(s, c_m, j, rows, qk_scale, masked, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr,
                        BLOCK_N: gl.constexpr):
    """Mask, new row max, probabilities and rescale factor: (bf16 P as the PV operand, fp32 P, alpha, m)."""
    if masked:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        s = gl.where(cols[None, :] < (rows + 1)[:, None], s, float("-inf"))
    m_new = gl.maximum(c_m, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(gl.fma(s, qk_scale, -(m_use * qk_scale)[:, None]))
    alpha = gl.exp2((c_m - m_use) * qk_scale)
    return gl.convert_layout(p.to(gl.bfloat16), P_LAYOUT), p, alpha, m_new


@gluon.jit
def _ws_tree_levels(p):
    """`_tree_rows`' first levels over one 64-column block of p [R, 64]: columns c0, then c3 .. c5 -> [R, c2, c1]."""
    R: gl.constexpr = p.shape[0]
    return gl.sum(gl.sum(gl.sum(gl.sum(gl.reshape(p, (R, 2, 2, 2, 2, 2, 2)), 6), 3), 2), 1)


@gluon.jit
def _ws_tree_rows(p, BLOCK_N: gl.constexpr):
    """`_tree_rows` (ROW_SUM="tree"): the same pairwise adds in the same tree, whatever p's layout."""
    R: gl.constexpr = p.shape[0]
    gl.static_assert(BLOCK_N == 64 or BLOCK_N == 128)
    if BLOCK_N == 64:
        x = _ws_tree_levels(p)
    else:
        x = gl.sum(gl.sum(gl.sum(gl.sum(gl.sum(gl.reshape(p, (R, 2, 2, 2, 2, 2, 2, 2)), 7), 4), 3), 2), 1)
    return gl.sum(gl.sum(x, 2), 1)  # c1, then c2


# `ROW_SUM="dot"`: the row sum as a wgmma of the bf16 probabilities with a [keys, 16] ones tile (N 16, the tile
# `_attn_block` multiplies by); every column holds the sum, the max over columns picks it exactly. Chained
# over key sub-blocks (acc in, acc out) it keeps the bits of the whole block's dot (measured, H200).
WS_ONES_N = gl.constexpr(16)


@gluon.jit
def _ws_row_sum_operand(p16):
    """The bf16 probabilities as the A operand of the row sum's wgmma."""
    R_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, WS_ONES_N, 16])
    return gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=R_LAYOUT, k_width=2))


@gluon.jit
def _ws_row_sum_issue(a, ones, acc=None):
    """Issue A @ ones (async; A from `_ws_row_sum_operand`), onto `acc` (a pending row-sum token) or from zero."""
    R_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, WS_ONES_N, 16])
    if acc is None:
        return warpgroup_mma(a, ones, gl.zeros([WS_ROWS, WS_ONES_N], gl.float32, R_LAYOUT), use_acc=False,
                             is_async=True)
    else:
        return warpgroup_mma(a, ones, acc, is_async=True)


@gluon.jit
def _ws_row_sum_take(rs, ROW: gl.constexpr):
    """The row sums of a waited ones product, in row layout ROW."""
    return gl.convert_layout(gl.max(rs, 1), ROW)


@gluon.jit
def _ws_finish(acc, l):
    """`_finish` (NORMALIZE) of acc [R, D] by l [R], l already in acc's row layout."""
    if NORMALIZE_RECIPROCAL:
        return acc * (1.0 / l)[:, None]
    else:
        return acc / l[:, None]


@gluon.jit
def _ws_merge(m_a, l_a, acc_a, m_b, l_b, acc_b, qk_scale, O_ROW: gl.constexpr):
    """`_merge`: fold chunk b into the running state a."""
    m = gl.maximum(m_a, m_b)
    m_use = gl.where(m == float("-inf"), 0.0, m)
    alpha = gl.exp2((m_a - m_use) * qk_scale)
    beta = gl.exp2((m_b - m_use) * qk_scale)
    l = gl.fma(l_a, alpha, l_b * beta)
    acc = gl.fma(acc_a, gl.convert_layout(alpha, O_ROW)[:, None], acc_b * gl.convert_layout(beta, O_ROW)[:, None])
    return m, l, acc


@gluon.jit
def _ws_chunk_ends(j, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr):
    """Whether block j is the last of its split chunk."""
    if SPLIT == 0:
        return False
    else:
        return ((j + 1) * BLOCK_N) % SPLIT == 0


@gluon.jit
def _ws_qk(j, q_smem, k_bufs, k_ready, s, NUM_BUF: gl.constexpr):
    """Issue block j's QK^T once its K tile has landed; returns (pending scores, the K tile)."""
    slot = j % NUM_BUF
    mbarrier.wait(k_ready.index(slot), (j // NUM_BUF) & 1)
    k_smem = k_bufs.index(slot)
    return warpgroup_mma(q_smem, k_smem.permute((1, 0)), s, use_acc=False, is_async=True), k_smem


@gluon.jit
def _ws_pv(j, p16, alpha, c_acc, v_bufs, v_ready, O_ROW: gl.constexpr, NUM_BUF: gl.constexpr):
    """Rescale the chunk accumulator and issue block j's PV once its V tile has landed."""
    c_acc = c_acc * gl.convert_layout(alpha, O_ROW)[:, None]
    slot = j % NUM_BUF
    mbarrier.wait(v_ready.index(slot), (j // NUM_BUF) & 1)
    v_smem = v_bufs.index(slot)
    return warpgroup_mma(p16, v_smem, c_acc, is_async=True), v_smem


@gluon.jit
def _ws_pv_done(acc_tok, v_smem, p16, empty, g, j, NUM_BUF: gl.constexpr):
    """Wait for block j's PV (ring index g + j), then hand its K/V slot back to the loader."""
    c_acc, _v, _p = warpgroup_mma_wait(0, deps=[acc_tok, v_smem, p16])
    mbarrier.arrive(empty.index((g + j) % NUM_BUF), count=1)
    return c_acc


@gluon.jit
def _ws_fold(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW: gl.constexpr, ACC_SMEM: gl.constexpr):
    """`_ws_merge` into the running state, whose accumulator `acc` is registers or (ACC_SMEM) a shared-memory
    slot: loaded, merged and stored back by the same threads (an fp32 round trip changes no bit)."""
    if ACC_SMEM:
        m_i, l_i, merged = _ws_merge(m_i, l_i, acc.load(c_acc.type.layout), c_m, c_l, c_acc, qk_scale, O_ROW)
        acc.store(merged)
    else:
        m_i, l_i, acc = _ws_merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)
    return m_i, l_i, acc


@gluon.jit
def _ws_close_chunk(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW: gl.constexpr, ACC_SMEM: gl.constexpr):
    """Fold the chunk state into the running state and start an empty chunk."""
    m_i, l_i, acc = _ws_fold(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW, ACC_SMEM)
    return m_i, l_i, acc, gl.zeros_like(c_acc), gl.full_like(c_m, float("-inf")), gl.zeros_like(c_l)


@gluon.jit
def _ws_diag_half(q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, u, j, rows, c_m, c_l, c_acc, qk_scale,
                  ROWS_LAYOUT: gl.constexpr, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr):
    """Block j (ring index u), a tile's diagonal 128-key block, for the tile's lower 64 rows: its upper 64 keys lie
    past all of them, so only the K/V slot's first 64 rows enter. Each score is its own dot over the head dim; the
    left-out keys would add -inf to the max, zero partials at the tree row sum's column-bit-6 level (after bits 0
    and 3-5, before 1 and 2: the 64-key tree is the 128-key one without those x + 0 adds) and k-steps of zero
    probabilities to the PV. So the bits are the whole block's (checked on the H200 by the family's gate) for half
    its tensor and softmax work. Returns (m, l, chunk acc)."""
    KH: gl.constexpr = WS_ROWS  # keys kept
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, KH, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_ROW: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    slot = u % NUM_BUF
    mbarrier.wait(k_ready.index(slot), (u // NUM_BUF) & 1)
    k_half = k_bufs.index(slot).slice(0, KH)
    s_tok = warpgroup_mma(q_smem, k_half.permute((1, 0)), gl.zeros([WS_ROWS, KH], gl.float32, S_LAYOUT),
                          use_acc=False, is_async=True)
    s, _q, _k = warpgroup_mma_wait(0, deps=[s_tok, q_smem, k_half])
    # block 2j of 64 keys starts at key j * 128
    p16, alpha, m_new, l_new = _ws_probs(s, gl.convert_layout(c_m, S_ROW), gl.convert_layout(c_l, S_ROW), 2 * j,
                                         gl.convert_layout(rows, S_ROW), qk_scale, True, None, S_LAYOUT, P_LAYOUT,
                                         KH, False)
    c_acc = c_acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    mbarrier.wait(v_ready.index(slot), (u // NUM_BUF) & 1)
    v_half = v_bufs.index(slot).slice(0, KH)
    acc_tok = warpgroup_mma(p16, v_half, c_acc, is_async=True)
    c_acc, _v, _p = warpgroup_mma_wait(0, deps=[acc_tok, v_half, p16])
    mbarrier.arrive(empty.index(slot), count=1)
    return gl.convert_layout(m_new, ROWS_LAYOUT), gl.convert_layout(l_new, ROWS_LAYOUT), c_acc


@gluon.jit
def _ws_rows(q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, acc_smem, ones, g, rows, n_blocks, unmasked, qk_scale,
             ROWS_LAYOUT: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr,
             NUM_BUF: gl.constexpr, OVERLAP: gl.constexpr, ACC_SMEM: gl.constexpr, ROW_SUM_DOT: gl.constexpr,
             DIAG_HALF: gl.constexpr = False):
    """This warpgroup's rows over blocks 0 .. n_blocks - 1 (blocks from `unmasked` masked; block j sits in ring
    slot g + j): (m, l, acc), acc in registers, or with ACC_SMEM in `acc_smem` (then returned as that slot).

    OVERLAP issues block j + 1's QK^T before block j's PV, so the softmax of j + 1 runs while the tensor cores do
    PV j; the operations per block and their order per row are the same either way. ACC_SMEM keeps the merged
    accumulator, which only the chunk folds touch, out of registers: 64 registers a thread fewer in the loop.
    DIAG_HALF (the lower rows of a 128-row tile at 128-key blocks, serial schedule, tree row sum): the last block,
    the diagonal, through `_ws_diag_half`."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    O_ROW: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    if ACC_SMEM:
        acc = acc_smem
        acc.store(gl.zeros([WS_ROWS, HEAD_D], gl.float32, O_LAYOUT))
    else:
        acc = gl.zeros([WS_ROWS, HEAD_D], gl.float32, O_LAYOUT)
    m_i = gl.full([WS_ROWS], float("-inf"), gl.float32, ROWS_LAYOUT)
    l_i = gl.zeros([WS_ROWS], gl.float32, ROWS_LAYOUT)
    c_acc = gl.zeros([WS_ROWS, HEAD_D], gl.float32, O_LAYOUT)
    c_m = gl.full_like(m_i, float("-inf"))
    c_l = gl.zeros_like(l_i)
    s = gl.zeros([WS_ROWS, BLOCK_N], gl.float32, S_LAYOUT)
    if OVERLAP:
        s_tok, k_smem = _ws_qk(g, q_smem, k_bufs, k_ready, s, NUM_BUF)
        s, _q, _k = warpgroup_mma_wait(0, deps=[s_tok, q_smem, k_smem])
        p16, alpha, c_m, c_l = _ws_probs(s, c_m, c_l, 0, rows, qk_scale, unmasked <= 0, ones, S_LAYOUT, P_LAYOUT,
                                         BLOCK_N, ROW_SUM_DOT)
        for j in range(0, n_blocks - 1):
            s_tok, k_smem = _ws_qk(g + j + 1, q_smem, k_bufs, k_ready, s, NUM_BUF)
            acc_tok, v_smem = _ws_pv(g + j, p16, alpha, c_acc, v_bufs, v_ready, O_ROW, NUM_BUF)
            s, _q, _k = warpgroup_mma_wait(1, deps=[s_tok, q_smem, k_smem])  # the QK^T, issued first, is done
            ends = _ws_chunk_ends(j, BLOCK_N, SPLIT)  # then block j + 1 starts a fresh chunk state
            p16_n, alpha, m_n, l_n = _ws_probs(s, gl.where(ends, float("-inf"), c_m), gl.where(ends, 0.0, c_l),
                                               j + 1, rows, qk_scale, j + 1 >= unmasked, ones, S_LAYOUT, P_LAYOUT,
                                               BLOCK_N, ROW_SUM_DOT)
            # (`_ws_pv_done` written out: as a call, the persistent kernel's SASS differs from the measured one)
            c_acc, _v, _p = warpgroup_mma_wait(0, deps=[acc_tok, v_smem, p16])
            mbarrier.arrive(empty.index((g + j) % NUM_BUF), count=1)
            if ends:  # fold the chunk; block j + 1 already started from a fresh m and l
                m_i, l_i, acc = _ws_fold(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW, ACC_SMEM)
                c_acc = gl.zeros_like(c_acc)
            p16, c_m, c_l = p16_n, m_n, l_n
        last = n_blocks - 1
        acc_tok, v_smem = _ws_pv(g + last, p16, alpha, c_acc, v_bufs, v_ready, O_ROW, NUM_BUF)
        c_acc, _v, _p = warpgroup_mma_wait(0, deps=[acc_tok, v_smem, p16])
        mbarrier.arrive(empty.index((g + last) % NUM_BUF), count=1)
        if _ws_chunk_ends(last, BLOCK_N, SPLIT):
            m_i, l_i, acc = _ws_fold(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW, ACC_SMEM)
            c_acc = gl.zeros_like(c_acc)
            c_m = gl.full_like(c_m, float("-inf"))
            c_l = gl.zeros_like(c_l)
    else:
        for j in range(0, n_blocks - 1 if DIAG_HALF else n_blocks):
            s_tok, k_smem = _ws_qk(g + j, q_smem, k_bufs, k_ready, s, NUM_BUF)
            s, _q, _k = warpgroup_mma_wait(0, deps=[s_tok, q_smem, k_smem])
            if ROW_SUM_DOT:  # the row sum's dot in flight with the PV, both waited at once
                p16, _p, alpha, m_n = _ws_scores_to_probs(s, c_m, j, rows, qk_scale, j >= unmasked, S_LAYOUT,
                                                          P_LAYOUT, BLOCK_N)
                a = _ws_row_sum_operand(p16)
                rs_tok = _ws_row_sum_issue(a, ones)
                acc_tok, v_smem = _ws_pv(g + j, p16, alpha, c_acc, v_bufs, v_ready, O_ROW, NUM_BUF)
                c_acc, rs, _v, _p16, _a = warpgroup_mma_wait(0, deps=[acc_tok, rs_tok, v_smem, p16, a])
                mbarrier.arrive(empty.index((g + j) % NUM_BUF), count=1)
                c_l = gl.fma(c_l, alpha, _ws_row_sum_take(rs, ROWS_LAYOUT))
                c_m = m_n
            else:
                p16, alpha, c_m, c_l = _ws_probs(s, c_m, c_l, j, rows, qk_scale, j >= unmasked, ones, S_LAYOUT,
                                                 P_LAYOUT, BLOCK_N, ROW_SUM_DOT)
                acc_tok, v_smem = _ws_pv(g + j, p16, alpha, c_acc, v_bufs, v_ready, O_ROW, NUM_BUF)
                c_acc = _ws_pv_done(acc_tok, v_smem, p16, empty, g, j, NUM_BUF)
            if _ws_chunk_ends(j, BLOCK_N, SPLIT):
                m_i, l_i, acc, c_acc, c_m, c_l = _ws_close_chunk(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW,
                                                                 ACC_SMEM)
        if DIAG_HALF:
            last = n_blocks - 1
            c_m, c_l, c_acc = _ws_diag_half(q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, g + last, last, rows,
                                            c_m, c_l, c_acc, qk_scale, ROWS_LAYOUT, HEAD_D, NUM_BUF)
            if _ws_chunk_ends(last, BLOCK_N, SPLIT):
                m_i, l_i, acc, c_acc, c_m, c_l = _ws_close_chunk(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW,
                                                                 ACC_SMEM)
    if SPLIT == 0:
        return c_m, c_l, c_acc  # one chunk, never merged (as `_chunk` alone)
    else:  # the open chunk (identity if empty)
        return _ws_fold(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW, ACC_SMEM)


@gluon.jit
def _ws_consumer(O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty, acc_smem, ones,
                 S, BH, HQ, HKV, GROUP, HB, qk_scale, HALF: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr,
                 SPLIT: gl.constexpr, NUM_BUF: gl.constexpr, OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr,
                 WRITE32: gl.constexpr, CONS: gl.constexpr, Q_TILES: gl.constexpr, ACC_SMEM: gl.constexpr,
                 ROW_SUM_DOT: gl.constexpr, DIAG: gl.constexpr, STORE_TMA: gl.constexpr):
    """One warpgroup, per tile: query rows tile_start + HALF * 64 + [0, 64) over their causal keys, stored (with
    STORE_TMA through the tile's query slot, whose last reader, the last QK^T, is done: one TMA store, which
    clips rows past the sequence end, and the slot goes back to the loader once the store has read it)."""
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    S_ROW: gl.constexpr = gl.SliceLayout(1, gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                                       instr_shape=[16, BLOCK_N, 16]))
    O_ROW: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    g = 0  # blocks consumed so far: ring slot and phase, as the loader counts them
    for i in range(_ws_n_tiles(S, BH, PERSISTENT, CONS)):
        tile_start, bh, _kv_row0, hi = _ws_tile(i, S, BH, HQ, HKV, GROUP, HB, PERSISTENT, CONS)
        rows = tile_start + HALF * WS_ROWS + gl.arange(0, WS_ROWS, layout=S_ROW)
        mbarrier.wait(q_ready.index(i % Q_TILES), (i // Q_TILES) & 1)
        # The tile's blocks as `_prefill_tile` walks them: unmasked below its first row, masked from there to
        # its last row or the sequence end (a mask a row sees in full changes no bit).
        n_blocks = gl.cdiv(hi, BLOCK_N)
        m_i, l_i, acc = _ws_rows(q_bufs.index(CONS * (i % Q_TILES) + HALF), k_bufs, v_bufs, k_ready, v_ready, empty,
                                 acc_smem, ones, g, rows, n_blocks, tile_start // BLOCK_N, qk_scale, S_ROW,
                                 HEAD_D, BLOCK_N, SPLIT, NUM_BUF, OVERLAP, ACC_SMEM, ROW_SUM_DOT,
                                 DIAG and HALF == WS_LOWER)
        if not STORE_TMA:
            mbarrier.arrive(q_empty.index(i % Q_TILES), count=1)  # every MMA reading this Q slot has completed
        g += n_blocks
        if ACC_SMEM and SPLIT != 0:
            acc = acc.load(O_LAYOUT)
        o = _ws_finish(acc, gl.convert_layout(l_i, O_ROW))
        r = HALF * WS_ROWS + gl.arange(0, WS_ROWS, layout=O_ROW)
        io = ((bh * S + tile_start).to(gl.int64) + r[:, None]) * HEAD_D + \
            gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, O_LAYOUT))[None, :]
        ok = (tile_start + r < S)[:, None]
        if STORE_TMA:
            q_slot = q_bufs.index(CONS * (i % Q_TILES) + HALF)
            q_slot.store(o.to(gl.bfloat16))
            fence_async_shared()
            gtma.async_copy_shared_to_global(o_desc, [bh, tile_start + HALF * WS_ROWS, 0], _ws_box(q_slot, o_desc))
            gtma.store_wait(0)
            mbarrier.arrive(q_empty.index(i % Q_TILES), count=1)
        else:
            gl.store(O + io, o.to(gl.bfloat16), mask=ok)
        if WRITE32:
            gl.store(O32 + io, o, mask=ok)


@gluon.jit
def _ws_ones(K: gl.constexpr, ROW_SUM_DOT: gl.constexpr, unused):
    """The [K, 16] bf16 ones tile of the dot row sum in shared memory (written by every thread, fenced for the
    tensor cores before the partitions fork), or `unused` when the row sum is not a dot."""
    if ROW_SUM_DOT:
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])  # the 4 warps before the fork
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, WS_ONES_N], gl.bfloat16)
        ones = gl.allocate_shared_memory(gl.bfloat16, [K, WS_ONES_N], layout,
                                         gl.full([K, WS_ONES_N], 1.0, gl.bfloat16, fill))
        fence_async_shared()
        return ones
    else:
        return unused


@gluon.jit
def _ws_prefill_kernel(q_desc, k_desc, v_desc, o_desc, O, O32, S, qk_scale, BH, HQ, HKV, GROUP, HB,
                       HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, NUM_BUF: gl.constexpr,
                       OVERLAP: gl.constexpr, PERSISTENT: gl.constexpr, WRITE32: gl.constexpr, CONS: gl.constexpr,
                       Q_TILES: gl.constexpr, ACC_SMEM: gl.constexpr, CONS_REGS: gl.constexpr,
                       LOADER_REGS: gl.constexpr, ROW_SUM_DOT: gl.constexpr, DIAG: gl.constexpr = False,
                       STORE_TMA: gl.constexpr = False):
    q_bufs = gl.allocate_shared_memory(gl.bfloat16, [Q_TILES * CONS, WS_ROWS, HEAD_D], WS_SMEM)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, HEAD_D], WS_SMEM)
    v_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, HEAD_D], WS_SMEM)
    if ACC_SMEM:  # the merged accumulators, one per consumer; rows padded by 4 floats, so that a warp's 8
        # accumulator rows (512 bytes apart unpadded) land on 8 different bank offsets
        acc_layout: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_D, 4]], [WS_ROWS, HEAD_D], [1, 0])
        acc0 = gl.allocate_shared_memory(gl.float32, [WS_ROWS, HEAD_D], acc_layout)
        acc1 = gl.allocate_shared_memory(gl.float32, [WS_ROWS, HEAD_D], acc_layout)
        if CONS == 3:
            acc2 = gl.allocate_shared_memory(gl.float32, [WS_ROWS, HEAD_D], acc_layout)
        else:
            acc2 = acc1  # never read
    else:  # never read: no allocation (which keeps the 2-consumer kernel's SASS as measured)
        acc0 = q_bufs
        acc1 = q_bufs
        acc2 = q_bufs
    ones = _ws_ones(BLOCK_N, ROW_SUM_DOT, q_bufs)
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_TILES, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_TILES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONS)  # every consumer warpgroup releases a Q slot
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONS)  # ... and a K/V slot
    # (written out per consumer: the JIT takes no tuples of functions or tuple concatenation)
    if CONS == 3:
        gl.warp_specialize([
            (_ws_consumer, (O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                            acc0, ones, S, BH, HQ, HKV, GROUP, HB, qk_scale, WS_LOWER, HEAD_D, BLOCK_N, SPLIT,
                            NUM_BUF, OVERLAP, PERSISTENT, WRITE32, CONS, Q_TILES, ACC_SMEM, ROW_SUM_DOT, DIAG,
                            STORE_TMA)),
            (_ws_consumer, (O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                            acc1, ones, S, BH, HQ, HKV, GROUP, HB, qk_scale, WS_UPPER, HEAD_D, BLOCK_N, SPLIT,
                            NUM_BUF, OVERLAP, PERSISTENT, WRITE32, CONS, Q_TILES, ACC_SMEM, ROW_SUM_DOT, DIAG,
                            STORE_TMA)),
            (_ws_consumer, (O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                            acc2, ones, S, BH, HQ, HKV, GROUP, HB, qk_scale, WS_TOP, HEAD_D, BLOCK_N, SPLIT,
                            NUM_BUF, OVERLAP, PERSISTENT, WRITE32, CONS, Q_TILES, ACC_SMEM, ROW_SUM_DOT, DIAG,
                            STORE_TMA)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                          S, BH, HQ, HKV, GROUP, HB, BLOCK_N, NUM_BUF, PERSISTENT, CONS, Q_TILES)),
        ], [4, 4, 1], [CONS_REGS, CONS_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_ws_consumer, (O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                            acc0, ones, S, BH, HQ, HKV, GROUP, HB, qk_scale, WS_LOWER, HEAD_D, BLOCK_N, SPLIT,
                            NUM_BUF, OVERLAP, PERSISTENT, WRITE32, CONS, Q_TILES, ACC_SMEM, ROW_SUM_DOT, DIAG,
                            STORE_TMA)),
            (_ws_consumer, (O, O32, o_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                            acc1, ones, S, BH, HQ, HKV, GROUP, HB, qk_scale, WS_UPPER, HEAD_D, BLOCK_N, SPLIT,
                            NUM_BUF, OVERLAP, PERSISTENT, WRITE32, CONS, Q_TILES, ACC_SMEM, ROW_SUM_DOT, DIAG,
                            STORE_TMA)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, empty,
                          S, BH, HQ, HKV, GROUP, HB, BLOCK_N, NUM_BUF, PERSISTENT, CONS, Q_TILES)),
        ], [4, 1], [CONS_REGS, LOADER_REGS])


# ---- Hopper decode (Gluon): KV blocks streamed as 64-key sub-blocks ----
# The Triton decode pipelines whole KV blocks, so at 128-key blocks one program holds three 64 KB stages (one per
# SM). Here a one-warp loader streams each block's keys and values as 64-key sub-blocks by TMA through a ring of
# slots, and one warpgroup does `_attn_block` per block from its sub-blocks: the scores per sub-block (each score
# is its own dot over the head dim), the row max over both (exact), the probabilities element-wise, and the row
# sum and PV as dots chained over the sub-blocks in key order, which keeps the whole block's bits (the tensor
# cores accumulate over keys in a fixed order that chaining preserves; measured on the H200), or the tree row sum
# with its top column bit as the sub-block. A reduced row sum does not split: 128-key blocks need `ROW_SUM` "dot"
# or "tree" (the launcher sends only those here; see `_dec_covers`). Chunks are written as `_chunks_to_partials`
# writes them and folded by the Triton merge launch, or (the fused merge) by the row group's last program here,
# or, when the cache fits one chunk, by each program here. Path knob DECODE_IMPL; the query heads of one KV head
# are the tile's rows (GQA packed).
DEC_SUB = gl.constexpr(64)  # keys per streamed sub-block


@gluon.jit
def _dec_chunks(n, SPLIT: gl.constexpr, CPP: gl.constexpr):
    """This program's chunks [c_lo, c_hi) of a sequence of n keys (one chunk when SPLIT is 0)."""
    if SPLIT == 0:
        return 0, 1
    else:
        c_lo = gl.program_id(0) * CPP
        return c_lo, gl.minimum(c_lo + CPP, gl.cdiv(n, SPLIT))


@gluon.jit
def _dec_bounds(c, n, SPLIT: gl.constexpr):
    """Keys [lo, hi) of chunk c."""
    if SPLIT == 0:
        return 0, n
    else:
        return c * SPLIT, gl.minimum(c * SPLIT + SPLIT, n)


@gluon.jit
def _dec_loader(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, empty, CTX, HKV,
                BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, CPP: gl.constexpr, NUM_BUF: gl.constexpr):
    """One warp: per block, its sub-blocks' K tiles, then their V tiles (the scores need every K first)."""
    kv_head = gl.program_id(1)  # b * HKV + KV head, as the cache's flat heads
    n = gl.load(CTX + kv_head // HKV)
    c_lo, c_hi = _dec_chunks(n, SPLIT, CPP)
    u = 0  # sub-blocks loaded so far: ring slot and phase
    for c in range(c_lo, c_hi):
        lo, hi = _dec_bounds(c, n, SPLIT)
        for start in range(lo, hi, BLOCK_N):
            for h in gl.static_range(BLOCK_N // DEC_SUB):
                slot = (u + h) % NUM_BUF
                mbarrier.wait(empty.index(slot), (((u + h) // NUM_BUF) & 1) ^ 1)
                mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                gtma.async_copy_global_to_shared(k_desc, [kv_head, start + h * DEC_SUB, 0], k_ready.index(slot),
                                                 _ws_box(k_bufs.index(slot), k_desc))
            for h in gl.static_range(BLOCK_N // DEC_SUB):
                slot = (u + h) % NUM_BUF
                mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                gtma.async_copy_global_to_shared(v_desc, [kv_head, start + h * DEC_SUB, 0], v_ready.index(slot),
                                                 _ws_box(v_bufs.index(slot), v_desc))
            u += BLOCK_N // DEC_SUB


@gluon.jit
def _dec_qk(q, k_bufs, k_ready, u, S_LAYOUT: gl.constexpr, NUM_BUF: gl.constexpr):
    """Issue sub-block u's scores q @ K^T once its K tile has landed: (pending scores, the K tile)."""
    slot = u % NUM_BUF
    mbarrier.wait(k_ready.index(slot), (u // NUM_BUF) & 1)
    k_smem = k_bufs.index(slot)
    return warpgroup_mma(q, k_smem.permute((1, 0)), gl.zeros([WS_ROWS, DEC_SUB], gl.float32, S_LAYOUT),
                         use_acc=False, is_async=True), k_smem


@gluon.jit
def _dec_scores(q, k_bufs, k_ready, u, S_LAYOUT: gl.constexpr, NUM_BUF: gl.constexpr, NSUB: gl.constexpr):
    """Issue the scores of the block at ring position u, per sub-block: (token, K tile) twice (one sub-block: the
    same pair twice)."""
    t0, k0 = _dec_qk(q, k_bufs, k_ready, u, S_LAYOUT, NUM_BUF)
    if NSUB == 2:
        t1, k1 = _dec_qk(q, k_bufs, k_ready, u + 1, S_LAYOUT, NUM_BUF)
        return t0, k0, t1, k1
    else:
        return t0, k0, t0, k0


@gluon.jit
def _dec_scores_wait(t0, k0, t1, k1, NSUB: gl.constexpr, PENDING: gl.constexpr):
    """The block's scores per sub-block once at most PENDING MMA groups issued after them are in flight."""
    if NSUB == 2:
        s0, _k0, s1, _k1 = warpgroup_mma_wait(PENDING, deps=[t0, k0, t1, k1])
    else:
        s0, _k0 = warpgroup_mma_wait(PENDING, deps=[t0, k0])
        s1 = s0
    return s0, s1


@gluon.jit
def _dec_values(v_bufs, v_ready, u, start, n, masked, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr):
    """Sub-block u's V tile once landed; in a block reaching past n, rows at or past n are zeroed in place, as
    `_load_block`'s masked loads give zeros there (the cache past n may hold anything, NaN included)."""
    slot = u % NUM_BUF
    mbarrier.wait(v_ready.index(slot), (u // NUM_BUF) & 1)
    v_smem = v_bufs.index(slot)
    if masked:
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        v = v_smem.load(fill)
        keys = start + gl.arange(0, DEC_SUB, layout=gl.SliceLayout(1, fill))
        v_smem.store(gl.where((keys < n)[:, None], v, gl.zeros_like(v)))
        fence_async_shared()  # these generic writes before the tensor cores' reads ...
        gl.thread_barrier()  # ... by every thread of the warpgroup
    return v_smem


@gluon.jit
def _dec_mask(s, start, n, masked, S_LAYOUT: gl.constexpr):
    """Scores of keys at or past n set to -inf (in blocks reaching past n)."""
    if masked:
        cols = start + gl.arange(0, DEC_SUB, layout=gl.SliceLayout(0, S_LAYOUT))
        s = gl.where(cols[None, :] < n, s, float("-inf"))
    return s


@gluon.jit
def _dec_softmax(s0, s1, m_i, start, n, qk_scale, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr,
                 NSUB: gl.constexpr):
    """`_attn_block`'s softmax step from the block's sub-block scores: (bf16 P per sub-block as the PV operand,
    the row sum unless it is a dot (the tree; the reduction of a one-sub-block block), alpha, m). The max is
    exact, so the max over the sub-blocks is the whole block's; the probabilities are element-wise."""
    masked = start + NSUB * DEC_SUB > n
    s0 = _dec_mask(s0, start, n, masked, S_LAYOUT)
    m_blk = gl.max(s0, 1)
    if NSUB == 2:
        s1 = _dec_mask(s1, start + DEC_SUB, n, masked, S_LAYOUT)
        m_blk = gl.maximum(m_blk, gl.max(s1, 1))
    m_new = gl.maximum(m_i, m_blk)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_use) * qk_scale)
    p0 = gl.exp2(gl.fma(s0, qk_scale, -(m_use * qk_scale)[:, None]))
    p16_0 = gl.convert_layout(p0.to(gl.bfloat16), P_LAYOUT)
    if NSUB == 2:
        p1 = gl.exp2(gl.fma(s1, qk_scale, -(m_use * qk_scale)[:, None]))
        p16_1 = gl.convert_layout(p1.to(gl.bfloat16), P_LAYOUT)
    else:
        p16_1 = p16_0
    if ROW_SUM_TREE:  # (the module constexpr) the tree's column bit 6 is the sub-block: its other levels per
        # sub-block, then that add
        if NSUB == 2:
            x = _ws_tree_levels(p0) + _ws_tree_levels(p1)
            row_sum = gl.sum(gl.sum(x, 2), 1)
        else:
            row_sum = _ws_tree_rows(p0, DEC_SUB)
        row_sum = gl.convert_layout(row_sum, gl.SliceLayout(1, S_LAYOUT))
    else:
        row_sum = gl.sum(p0, 1)
    return p16_0, p16_1, row_sum, alpha, m_new


@gluon.jit
def _dec_pv_issue(acc, alpha, p16_0, p16_1, v_bufs, v_ready, ones, u, start, n, HEAD_D: gl.constexpr,
                  NUM_BUF: gl.constexpr, NSUB: gl.constexpr, ROW_SUM_DOT: gl.constexpr):
    """Rescale the accumulator and issue the block's row-sum dots (ROW_SUM_DOT), then its PV dots, each chained
    over the sub-blocks in key order: (PV token, row-sum token, and the operands the MMAs read, to keep alive)."""
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    masked = start + NSUB * DEC_SUB > n
    a0 = _ws_row_sum_operand(p16_0)
    a1 = _ws_row_sum_operand(p16_1)
    if ROW_SUM_DOT:
        rs = _ws_row_sum_issue(a0, ones)
        if NSUB == 2:
            rs = _ws_row_sum_issue(a1, ones, rs)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
    v0 = _dec_values(v_bufs, v_ready, u, start, n, masked, HEAD_D, NUM_BUF)
    acc = warpgroup_mma(p16_0, v0, acc, is_async=True)
    if NSUB == 2:
        v1 = _dec_values(v_bufs, v_ready, u + 1, start + DEC_SUB, n, masked, HEAD_D, NUM_BUF)
        acc = warpgroup_mma(p16_1, v1, acc, is_async=True)
    else:
        v1 = v0
    if not ROW_SUM_DOT:
        rs = acc  # (no row-sum product: the reduced sum came with the probabilities)
    return acc, rs, v0, v1, a0, a1


@gluon.jit
def _dec_pv_done(acc, rs, v0, v1, p16_0, p16_1, a0, a1, l_i, alpha, reduced, empty, u, S_ROW: gl.constexpr,
                 NUM_BUF: gl.constexpr, NSUB: gl.constexpr, ROW_SUM_DOT: gl.constexpr):
    """Wait for the block's MMAs (every operand they read kept alive until then), fold its row sum into l and
    hand its sub-block slots back to the loader: (acc, l)."""
    if ROW_SUM_DOT:
        if NSUB == 2:
            acc, rs, _v0, _v1, _p0, _p1, _a0, _a1 = warpgroup_mma_wait(
                0, deps=[acc, rs, v0, v1, p16_0, p16_1, a0, a1])
        else:
            acc, rs, _v0, _p0, _a0 = warpgroup_mma_wait(0, deps=[acc, rs, v0, p16_0, a0])
        row_sum = _ws_row_sum_take(rs, S_ROW)
    else:
        acc, _v0, _p0 = warpgroup_mma_wait(0, deps=[acc, v0, p16_0])
        row_sum = reduced
    for h in gl.static_range(NSUB):
        mbarrier.arrive(empty.index((u + h) % NUM_BUF), count=1)
    return acc, gl.fma(l_i, alpha, row_sum)


@gluon.jit
def _dec_chunk(q, k_bufs, v_bufs, k_ready, v_ready, empty, ones, u, lo, hi, n, qk_scale, HEAD_D: gl.constexpr,
               BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, ROW_SUM_DOT: gl.constexpr, OVERLAP: gl.constexpr):
    """Keys [lo, hi) from a fresh softmax state, `_attn_block` per block (its sub-blocks from ring position u on):
    (acc, m, l). OVERLAP issues block j + 1's scores before block j's PV, so the softmax of j + 1 runs while the
    tensor cores do PV j; the operations per block and their order per row are the same either way."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DEC_SUB, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_ROW: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    NSUB: gl.constexpr = BLOCK_N // DEC_SUB
    gl.static_assert(NSUB == 1 or (NSUB == 2 and (ROW_SUM_DOT or ROW_SUM_TREE)))  # a reduced row sum does not split
    acc = gl.zeros([WS_ROWS, HEAD_D], gl.float32, O_LAYOUT)
    m_i = gl.full([WS_ROWS], float("-inf"), gl.float32, S_ROW)
    l_i = gl.zeros([WS_ROWS], gl.float32, S_ROW)
    if OVERLAP:
        t0, k0, t1, k1 = _dec_scores(q, k_bufs, k_ready, u, S_LAYOUT, NUM_BUF, NSUB)
        s0, s1 = _dec_scores_wait(t0, k0, t1, k1, NSUB, 0)
        p16_0, p16_1, reduced, alpha, m_i = _dec_softmax(s0, s1, m_i, lo, n, qk_scale, S_LAYOUT, P_LAYOUT, NSUB)
        for start in range(lo, hi - BLOCK_N, BLOCK_N):  # blocks followed by another in this chunk
            t0, k0, t1, k1 = _dec_scores(q, k_bufs, k_ready, u + NSUB, S_LAYOUT, NUM_BUF, NSUB)
            tok, rs, v0, v1, a0, a1 = _dec_pv_issue(acc, alpha, p16_0, p16_1, v_bufs, v_ready, ones, u, start, n,
                                                    HEAD_D, NUM_BUF, NSUB, ROW_SUM_DOT)
            # the scores, issued first, are done once only this block's row-sum and PV groups are in flight
            s0, s1 = _dec_scores_wait(t0, k0, t1, k1, NSUB, NSUB * (2 if ROW_SUM_DOT else 1))
            n16_0, n16_1, n_reduced, n_alpha, n_m = _dec_softmax(s0, s1, m_i, start + BLOCK_N, n, qk_scale,
                                                                 S_LAYOUT, P_LAYOUT, NSUB)
            acc, l_i = _dec_pv_done(tok, rs, v0, v1, p16_0, p16_1, a0, a1, l_i, alpha, reduced, empty, u, S_ROW,
                                    NUM_BUF, NSUB, ROW_SUM_DOT)
            p16_0, p16_1, reduced, alpha, m_i = n16_0, n16_1, n_reduced, n_alpha, n_m
            u += NSUB
        last = lo + (hi - lo - 1) // BLOCK_N * BLOCK_N
        tok, rs, v0, v1, a0, a1 = _dec_pv_issue(acc, alpha, p16_0, p16_1, v_bufs, v_ready, ones, u, last, n,
                                                HEAD_D, NUM_BUF, NSUB, ROW_SUM_DOT)
        acc, l_i = _dec_pv_done(tok, rs, v0, v1, p16_0, p16_1, a0, a1, l_i, alpha, reduced, empty, u, S_ROW,
                                NUM_BUF, NSUB, ROW_SUM_DOT)
    else:
        for start in range(lo, hi, BLOCK_N):
            t0, k0, t1, k1 = _dec_scores(q, k_bufs, k_ready, u, S_LAYOUT, NUM_BUF, NSUB)
            s0, s1 = _dec_scores_wait(t0, k0, t1, k1, NSUB, 0)
            p16_0, p16_1, reduced, alpha, m_new = _dec_softmax(s0, s1, m_i, start, n, qk_scale, S_LAYOUT, P_LAYOUT,
                                                               NSUB)
            tok, rs, v0, v1, a0, a1 = _dec_pv_issue(acc, alpha, p16_0, p16_1, v_bufs, v_ready, ones, u, start, n,
                                                    HEAD_D, NUM_BUF, NSUB, ROW_SUM_DOT)
            acc, l_i = _dec_pv_done(tok, rs, v0, v1, p16_0, p16_1, a0, a1, l_i, alpha, reduced, empty, u, S_ROW,
                                    NUM_BUF, NSUB, ROW_SUM_DOT)
            m_i = m_new
            u += NSUB
    return acc, m_i, l_i


@gluon.jit
def _dec_store_out(O, O32, q_base, o, o_rows, o_cols, GROUP, HEAD_D: gl.constexpr, WRITE32: gl.constexpr):
    io = (q_base + o_rows)[:, None] * HEAD_D + o_cols[None, :]
    ok = (o_rows < GROUP)[:, None]
    gl.store(O + io, o.to(gl.bfloat16), mask=ok)
    if WRITE32:
        gl.store(O32 + io, o, mask=ok)


@gluon.jit
def _dec_load_partial(M_WS, L_WS, ACC_WS, ws_s, ws_o, o_cols, s_ok, o_ok, HEAD_D: gl.constexpr):
    """`_load_partial` (past the last chunk: the empty state); .cg: other SMs wrote them."""
    m = gl.load(M_WS + ws_s, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
    l = gl.load(L_WS + ws_s, mask=s_ok, other=0.0, cache_modifier=".cg")
    acc = gl.load(ACC_WS + ws_o[:, None] * HEAD_D + o_cols[None, :], mask=o_ok[:, None], other=0.0,
                  cache_modifier=".cg")
    return m, l, acc


@gluon.jit
def _dec_load4(M_WS, L_WS, ACC_WS, ws_s, ws_o, c, n_chunks, o_cols, s_ok, o_ok, HEAD_D: gl.constexpr):
    return (_dec_load_partial(M_WS, L_WS, ACC_WS, ws_s + c, ws_o + c, o_cols, s_ok & (c < n_chunks),
                              o_ok & (c < n_chunks), HEAD_D),
            _dec_load_partial(M_WS, L_WS, ACC_WS, ws_s + c + 1, ws_o + c + 1, o_cols, s_ok & (c + 1 < n_chunks),
                              o_ok & (c + 1 < n_chunks), HEAD_D),
            _dec_load_partial(M_WS, L_WS, ACC_WS, ws_s + c + 2, ws_o + c + 2, o_cols, s_ok & (c + 2 < n_chunks),
                              o_ok & (c + 2 < n_chunks), HEAD_D),
            _dec_load_partial(M_WS, L_WS, ACC_WS, ws_s + c + 3, ws_o + c + 3, o_cols, s_ok & (c + 3 < n_chunks),
                              o_ok & (c + 3 < n_chunks), HEAD_D))


@gluon.jit
def _dec_fold4(m_i, l_i, acc, parts, qk_scale, O_ROW: gl.constexpr):
    for j in gl.static_range(4):
        m_i, l_i, acc = _ws_merge(m_i, l_i, acc, parts[j][0], parts[j][1], parts[j][2], qk_scale, O_ROW)
    return m_i, l_i, acc


@gluon.jit
def _dec_fold_out(O, O32, M_WS, L_WS, ACC_WS, q_base, n_chunks, GROUP, N_CHUNKS, qk_scale, HEAD_D: gl.constexpr,
                  ROWS: gl.constexpr, LOADS: gl.constexpr, WRITE32: gl.constexpr):
    """`_fold_partials` and the output in Gluon: the empty state with partials 0 .. n_chunks - 1 merged one by one
    in ascending order, LOADS (4 or 8) partials loaded ahead, then normalised and stored. Element-wise, so the
    tile (the GQA group's ROWS rows, not the consumer's 64) and its layout do not change a bit."""
    FOLD: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [1, 4], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, FOLD)
    rows = gl.arange(0, ROWS, layout=ROW)
    cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, FOLD))
    ws = (q_base + rows).to(gl.int64) * N_CHUNKS
    ok = rows < GROUP
    acc = gl.zeros([ROWS, HEAD_D], gl.float32, FOLD)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, ROW)
    l_i = gl.zeros([ROWS], gl.float32, ROW)
    for c in range(0, n_chunks, LOADS):
        p0 = _dec_load4(M_WS, L_WS, ACC_WS, ws, ws, c, n_chunks, cols, ok, ok, HEAD_D)
        if LOADS == 8:
            p1 = _dec_load4(M_WS, L_WS, ACC_WS, ws, ws, c + 4, n_chunks, cols, ok, ok, HEAD_D)
        m_i, l_i, acc = _dec_fold4(m_i, l_i, acc, p0, qk_scale, ROW)
        if LOADS == 8:
            m_i, l_i, acc = _dec_fold4(m_i, l_i, acc, p1, qk_scale, ROW)
    _dec_store_out(O, O32, q_base, _ws_finish(acc, l_i), rows, cols, GROUP, HEAD_D, WRITE32)


@gluon.jit
def _dec_consumer(Q, CTX, O, O32, M_WS, L_WS, ACC_WS, ARRIVALS, k_bufs, v_bufs, k_ready, v_ready, empty, ones,
                  N_CHUNKS, qk_scale, HQ, HKV, GROUP, HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr,
                  SPLIT: gl.constexpr, CPP: gl.constexpr, NUM_BUF: gl.constexpr, ROW_SUM_DOT: gl.constexpr,
                  FINISH: gl.constexpr, WRITE32: gl.constexpr, OVERLAP: gl.constexpr, FUSED: gl.constexpr,
                  FOLD_ROWS: gl.constexpr, LOADS: gl.constexpr):
    """One warpgroup: the GQA group's query heads as rows, this program's chunks, each stored as a partial (or,
    FINISH, the output: the one chunk alone when SPLIT is 0, else folded into the empty state first). FUSED: the
    row group's last program to arrive folds every partial, as `_decode_kernel`'s fused merge does."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DEC_SUB, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    S_ROW: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROW: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    fill: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    pid = gl.program_id(1)
    b = pid // HKV
    n = gl.load(CTX + b)
    q_base = b * HQ + pid % HKV * GROUP  # this KV head's first query head (q is [B, HQ, 1, D])
    r = gl.arange(0, WS_ROWS, layout=gl.SliceLayout(1, fill))
    q = gl.load(Q + (q_base + r)[:, None] * HEAD_D + gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, fill))[None, :],
                mask=(r < GROUP)[:, None], other=0.0)
    q = gl.convert_layout(q, gl.DotOperandLayout(operand_index=0, parent=S_LAYOUT, k_width=2))
    o_rows = gl.arange(0, WS_ROWS, layout=O_ROW)
    o_cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, O_LAYOUT))
    s_rows = gl.arange(0, WS_ROWS, layout=S_ROW)
    c_lo, c_hi = _dec_chunks(n, SPLIT, CPP)
    u = 0  # sub-blocks consumed so far, as the loader counts them
    for c in range(c_lo, c_hi):
        lo, hi = _dec_bounds(c, n, SPLIT)
        acc, m_i, l_i = _dec_chunk(q, k_bufs, v_bufs, k_ready, v_ready, empty, ones, u, lo, hi, n, qk_scale,
                                   HEAD_D, BLOCK_N, NUM_BUF, ROW_SUM_DOT, OVERLAP)
        u += gl.cdiv(hi - lo, BLOCK_N) * (BLOCK_N // DEC_SUB)
        if FINISH:
            if SPLIT != 0:  # `_merge` into the empty state, as the merge launch would
                m_i, l_i, acc = _ws_merge(gl.full_like(m_i, float("-inf")), gl.zeros_like(l_i),
                                          gl.zeros_like(acc), m_i, l_i, acc, qk_scale, O_ROW)
            _dec_store_out(O, O32, q_base, _ws_finish(acc, gl.convert_layout(l_i, O_ROW)), o_rows, o_cols, GROUP,
                           HEAD_D, WRITE32)
        else:
            ws = (q_base + s_rows).to(gl.int64) * N_CHUNKS + c
            gl.store(M_WS + ws, m_i, mask=s_rows < GROUP)
            gl.store(L_WS + ws, l_i, mask=s_rows < GROUP)
            ws_o = (q_base + o_rows).to(gl.int64) * N_CHUNKS + c
            gl.store(ACC_WS + ws_o[:, None] * HEAD_D + o_cols[None, :], acc, mask=(o_rows < GROUP)[:, None])
    if FUSED:  # `_decode_kernel`'s arrival protocol, restated (Gluon cannot call Triton functions); every
        # program of the row group arrives, chunks or not
        gl.thread_barrier()
        arrived = gl.atomic_add(ARRIVALS + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == gl.num_programs(0) - 1:
            gl.store(ARRIVALS + pid, 0)  # reset for the next launch (and CUDA-graph replays)
            gl.thread_barrier()
            _dec_fold_out(O, O32, M_WS, L_WS, ACC_WS, q_base, gl.cdiv(n, SPLIT), GROUP, N_CHUNKS, qk_scale, HEAD_D,
                          FOLD_ROWS, LOADS, WRITE32)


@gluon.jit
def _dec_kernel(Q, k_desc, v_desc, CTX, O, O32, M_WS, L_WS, ACC_WS, ARRIVALS, N_CHUNKS, qk_scale, HQ, HKV, GROUP,
                HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, CPP: gl.constexpr,
                NUM_BUF: gl.constexpr, ROW_SUM_DOT: gl.constexpr, FINISH: gl.constexpr, WRITE32: gl.constexpr,
                OVERLAP: gl.constexpr, FUSED: gl.constexpr, FOLD_ROWS: gl.constexpr, LOADS: gl.constexpr):
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, DEC_SUB, HEAD_D], WS_SMEM)
    v_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, DEC_SUB, HEAD_D], WS_SMEM)
    ones = _ws_ones(DEC_SUB, ROW_SUM_DOT, k_bufs)
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_dec_consumer, (Q, CTX, O, O32, M_WS, L_WS, ACC_WS, ARRIVALS, k_bufs, v_bufs, k_ready, v_ready, empty,
                         ones, N_CHUNKS, qk_scale, HQ, HKV, GROUP, HEAD_D, BLOCK_N, SPLIT, CPP, NUM_BUF,
                         ROW_SUM_DOT, FINISH, WRITE32, OVERLAP, FUSED, FOLD_ROWS, LOADS)),
        (_dec_loader, (k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, empty, CTX, HKV, BLOCK_N, SPLIT,
                       CPP, NUM_BUF)),
    ], [1], [40])


TMA_MIN_SEQ = 2048
PERSISTENT_MAX_WAVES = 8
WS_MIN_WAVES = 4  # FULL_IMPL "auto": the Gluon prefill above this many waves of tiles (measured: design_notes.md)
WS_PERSISTENT_MAX_WAVES = 32


def _qk_scale(sm_scale: float) -> float:
    return float(sm_scale) * LOG2E


_DEVICE: dict[int, tuple[int, int]] = {}  # device index -> (SMs, major capability): read once, every call needs them


def _device(device: torch.device) -> tuple[int, int]:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE:
        _DEVICE[idx] = (torch.cuda.get_device_properties(idx).multi_processor_count,
                        torch.cuda.get_device_capability(idx)[0])
    return _DEVICE[idx]


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter: CPU tests then reach several chunks per program
    return _device(device)[0]


# Fast launches (path only: the same compiled kernel gets the same arguments). Off: every launch goes through
# Triton's own `kernel[grid](...)` (benchmarks compare the two).
FAST_LAUNCH = True


class _Desc:
    """A host TMA descriptor's fields, built without Triton's per-object validation (`_ws_prefill` and
    `_dec_covers` check contiguity and alignment first): what Triton's launcher reads from a descriptor. Triton's
    own launch path gets a real TensorDescriptor (`full`)."""

    def __init__(self, base, shape, strides, block_shape):
        self.base, self.shape, self.strides, self.block_shape = base, shape, strides, block_shape
        self.layout, self.padding = _WS_DESC_LAYOUT, "zero"

    def full(self) -> TensorDescriptor:
        return TensorDescriptor(self.base, list(self.shape), list(self.strides), list(self.block_shape), self.layout)


def _fast(kernel):
    """`_fast(kernel)[grid](*args, **constexprs)`: tik_evo.launch's fast launch (FAST_LAUNCH off, or the file used
    without tik-evo: Triton's path, light descriptors made full)."""
    if launch is not None:
        return launch.fast(kernel, FAST_LAUNCH)
    return _TritonLaunch(kernel)


class _TritonLaunch:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*(a.full() if type(a) is _Desc else a for a in args), **kw)


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


WS_SMEM_BYTES = 227 * 1024  # shared memory a Hopper block may use
_WS_DESC_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)


# Registers a thread per partition: (consumer warpgroups, loader's warpgroup) and the launch's per-thread budget
# (65,536 over 3 or 4 warpgroups; setmaxnreg moves them from the loader to the consumers).
WS_REGS = {2: (232, 40, 168), 3: (160, 32, 128)}


def _ws_regs(cons: int) -> tuple[int, int, int]:
    """WS_REGS, or with FULL_WS_LOADER_REGS a number the loader's registers and the rest of the launch's budget
    split over the consumers (multiples of 8, as setmaxnreg takes them; at most 256)."""
    loader = KNOBS["FULL_WS_LOADER_REGS"]
    if loader == "auto":
        return WS_REGS[cons]
    launch = WS_REGS[cons][2]
    return min(256, (launch * (cons + 1) - loader) // cons // 8 * 8), loader, launch


def _ws_plan(block_n: int, head_d: int, split: int) -> tuple[int, int, bool, int]:
    """Shared memory of the Gluon prefill: (consumer warpgroups, query tiles held, merged accumulators in shared
    memory, K/V slots). Two query tiles let the loader fetch the next tile's during this one; with 3 consumers
    (FULL_WS_CONSUMERS) the merged accumulators move to shared memory and, at head dim 128, only one fits beside
    two K/V slots. FULL_WS_QUERY_TILES=1 gives the second query tile's room to K/V slots (128-key blocks at head
    dim 128: three slots instead of two)."""
    cons = KNOBS["FULL_WS_CONSUMERS"]
    acc_smem = (cons == 3 or KNOBS["FULL_WS_ACC"] == "shared") and split != 0
    fixed = (cons * 64 * (head_d + 4) * 4 if acc_smem else 0) + 1024  # padded rows; + barriers and alignment
    fixed += block_n * 16 * 2 if KNOBS["ROW_SUM"] == "dot" else 0  # the ones tile
    per_slot = 2 * block_n * head_d * 2
    for q_tiles in range(KNOBS["FULL_WS_QUERY_TILES"], 0, -1):
        slots = min(KNOBS["FULL_WS_BUFFERS"], (WS_SMEM_BYTES - q_tiles * cons * 64 * head_d * 2 - fixed) // per_slot)
        if slots >= 2:
            return cons, q_tiles, acc_smem, slots
    # Triton's own error type: the audit files it as "resources" (a legal choice that does not fit), not a bug.
    need = cons * 64 * head_d * 2 + fixed + 2 * per_slot  # one query tile, two slots
    raise triton.runtime.errors.OutOfResources(need, WS_SMEM_BYTES, "shared memory")


def _ws_band(n_m: int, bh: int, group: int, programs: int) -> int:
    """FULL_WS_BANDS: the persistent Gluon prefill's head band, the fewest heads (whole GQA groups, dividing the
    launch's heads) whose tiles still make the knob's number of rounds of programs; all heads when off. A band's
    tiles in flight read fewer KV heads' keys, which L2 can then hold (B1 16K: 64 MB of K/V for all 8 KV heads)."""
    rounds = KNOBS["FULL_WS_BANDS"]
    if rounds == "off":
        return bh
    return next(h for h in range(group, bh + 1, group) if bh % h == 0 and (n_m * h >= rounds * programs or h == bh))


def _ws_diag(cons: int, block_n: int) -> bool:
    """FULL_WS_DIAG "half" where it applies: the lower consumer's diagonal block on its first 64 keys
    (`_ws_diag_half`) needs 128-row tiles over 128-key blocks, the serial schedule and the tree row sum."""
    return (KNOBS["FULL_WS_DIAG"] == "half" and cons == 2 and block_n == 128 and KNOBS["ROW_SUM"] == "tree"
            and KNOBS["FULL_WS_SCHEDULE"] == "serial")


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can address these tensors as the Gluon kernels build them: contiguous, 16-byte
    aligned (the prefill's output too: FULL_WS_STORE stores it by TMA)."""
    return all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in tensors)


def _ws_prefill(q, k, v, sm_scale, out, out32) -> bool:
    """Run the warp-specialised prefill if it covers this launch (a Hopper GPU, 32- to 128-key blocks (64 or 128 for
    the tree row sum), head dim 64 or 128, contiguous aligned tensors) and return True; else False and the caller
    runs Triton."""
    B, HQ, S, D = q.shape
    bn = KNOBS["BLOCK_N"]
    if not (q.is_cuda and _device(q.device)[1] == 9 and D in (64, 128)
            and 128 % bn == 0 and (bn >= 64 or KNOBS["ROW_SUM"] != "tree")
            and _tma_ready(q, k, v, out)):
        return False
    # Rank 3 ([heads, seq, dim]): a box reaching past the sequence end reads zeros, never the next head's rows.
    # (Built from the contiguous tensors directly and with one shared layout object: this runs on every call.)
    HKV = k.shape[1]
    descs = (_Desc(q, (B * HQ, S, D), (S * D, D, 1), (1, 64, D)),
             _Desc(k, (B * HKV, S, D), (S * D, D, 1), (1, bn, D)),
             _Desc(v, (B * HKV, S, D), (S * D, D, 1), (1, bn, D)),
             _Desc(out, (B * HQ, S, D), (S * D, D, 1), (1, 64, D)))
    cons, q_tiles, acc_smem, slots = _ws_plan(bn, D, KNOBS["SPLIT_TOKENS"])
    tiles = _cdiv(S, cons * 64) * B * HQ
    sms = _sm_count(q.device)
    persistent = KNOBS["FULL_WS_PERSISTENT"]
    # "auto": one program per SM for launches of at most 32 waves of tiles, where the loader's prefetch of the
    # next tile pays; beyond, the snake dealing cost more than it saved (results/attention/design_notes.md).
    persistent = persistent == "snake" or (persistent == "auto" and tiles <= WS_PERSISTENT_MAX_WAVES * sms)
    band = _ws_band(_cdiv(S, cons * 64), B * HQ, HQ // HKV, min(tiles, sms)) if persistent else B * HQ
    persistent = (WS_BANDED.value if band < B * HQ else 1) if persistent else 0
    regs = _ws_regs(cons)
    _fast(_ws_prefill_kernel)[(min(tiles, sms) if persistent else tiles,)](
        *descs, out, out32 if out32 is not None else out, S, _qk_scale(sm_scale), B * HQ, HQ, HKV, HQ // HKV, band,
        HEAD_D=D, BLOCK_N=bn, SPLIT=KNOBS["SPLIT_TOKENS"], NUM_BUF=slots,
        OVERLAP=KNOBS["FULL_WS_SCHEDULE"] == "overlap", PERSISTENT=persistent, WRITE32=out32 is not None,
        CONS=cons, Q_TILES=q_tiles, ACC_SMEM=acc_smem, CONS_REGS=regs[0], LOADER_REGS=regs[1],
        ROW_SUM_DOT=KNOBS["ROW_SUM"] == "dot", DIAG=_ws_diag(cons, bn), STORE_TMA=KNOBS["FULL_WS_STORE"] == "tma",
        num_warps=4, maxnreg=regs[2])
    return True


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, out: torch.Tensor,
            out32: torch.Tensor | None = None) -> None:
    """Causal attention over whole sequences: q [B, HQ, S, D], k/v [B, HKV, S, D] -> out [B, HQ, S, D]."""
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    block_m = KNOBS["BLOCK_M"]
    n_m = _cdiv(S, block_m)
    tiles = n_m * B * HQ
    sms = _sm_count(q.device)
    impl = KNOBS["FULL_IMPL"]
    # "auto": the Gluon kernel at 128-key blocks, where the Triton one spills (H200, B1 S1024: 26 against 45 us of
    # GPU time; with the fast launch its host time no longer exceeds that), and above 4 waves of tiles; shorter
    # launches at narrower blocks run the Triton one (snake-dealt if FULL_PERSISTENT allows), as fast there.
    if (impl == "gluon_ws" or (impl == "auto" and (KNOBS["BLOCK_N"] == 128 or tiles > WS_MIN_WAVES * sms))) and \
            _ws_prefill(q, k, v, sm_scale, out, out32):
        return
    persistent = KNOBS["FULL_PERSISTENT"]
    if persistent == "auto":  # few tiles: the causal tail dominates, and dealing them balances it
        persistent = "snake" if tiles <= PERSISTENT_MAX_WAVES * sms else "off"
    grid = (min(tiles, sms),) if persistent != "off" else (n_m, B * HQ)
    _fast(_prefill_kernel)[grid](
        q, k, v, out, out32 if out32 is not None else out, S, B * HKV * S, _qk_scale(sm_scale), HQ, HKV,
        HQ // HKV, B * HQ, HEAD_D=D, PERSISTENT=persistent, BLOCK_M=block_m, BLOCK_N=KNOBS["BLOCK_N"],
        SPLIT=KNOBS["SPLIT_TOKENS"],
        SPLIT_LOOP=KNOBS["FULL_SPLIT_LOOP"], TMA=_use_tma("FULL_KV_LOADS", k, v, seq=S), WRITE32=out32 is not None,
        num_warps=KNOBS["FULL_NUM_WARPS"], num_stages=KNOBS["FULL_NUM_STAGES"],
    )


def prefill_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                   sm_scale: float, out: torch.Tensor, out32: torch.Tensor | None = None) -> None:
    """Causal attention over a packed batch: sequence b is rows cu_seqlens[b]..cu_seqlens[b + 1] of q [T, HQ, D]
    and k/v [T, HKV, D] and attends its own rows only -> out [T, HQ, D]. cu_seqlens is int32 [B + 1] from 0;
    max_seqlen (a host int, no sync) is at least the longest sequence. Each token's bits are `prefill`'s for its
    sequence alone: the Triton prefill tile over the sequence's rows, read in place, its keys and values through
    TMA as FULL_KV_LOADS says (judged by the longest sequence); FULL_IMPL and FULL_PERSISTENT do not apply (they
    move bytes, not arithmetic)."""
    T, HQ, D = q.shape
    HKV = k.shape[1]
    if k.shape != v.shape or k.shape[::2] != (T, D) or HQ % HKV or out.shape != q.shape \
            or cu_seqlens.dtype != torch.int32 or not all(t.is_contiguous() for t in (q, k, v, out)):
        raise ValueError(f"prefill_packed: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out "
                         f"{tuple(out.shape)}, cu_seqlens {cu_seqlens.dtype}: expected contiguous q/out [T, HQ, D] "
                         "and k/v [T, HKV, D] with HKV dividing HQ, and int32 cu_seqlens")
    B = cu_seqlens.numel() - 1
    if B < 1 or max_seqlen < 1:
        return
    grid = (_cdiv(max_seqlen, KNOBS["BLOCK_M"]), B * HQ)
    _fast(_prefill_packed_kernel)[grid](
        q, k, v, out, out32 if out32 is not None else out, cu_seqlens, T, _qk_scale(sm_scale), HQ, HKV, HQ // HKV,
        Q_ROW=HQ * D, KV_ROW=HKV * D, HEAD_D=D, BLOCK_M=KNOBS["BLOCK_M"], BLOCK_N=KNOBS["BLOCK_N"],
        SPLIT=KNOBS["SPLIT_TOKENS"], SPLIT_LOOP=KNOBS["FULL_SPLIT_LOOP"],
        TMA=_use_tma("FULL_KV_LOADS", k, v, seq=max_seqlen), WRITE32=out32 is not None,
        num_warps=KNOBS["FULL_NUM_WARPS"], num_stages=KNOBS["FULL_NUM_STAGES"],
    )


_ARRIVALS: dict[tuple, list[torch.Tensor]] = {}


def _arrivals(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters for a fused decode merge, one per row group, kept per device and stream: each
    launch's last program resets its counter, so the buffer is zero again between launches and graph replays.
    Outgrown buffers stay referenced: a captured CUDA graph may still point at one."""
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    bufs = _ARRIVALS.setdefault(key, [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 1024), dtype=torch.int32, device=device))
    return bufs[-1]


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,
           sm_scale: float, out: torch.Tensor, out32: torch.Tensor | None = None) -> None:
    """One new token per sequence: q [B, HQ, 1, D] attends keys [0, context_lens[b]) of k/v_cache
    [B, HKV, S_cap, D] (the token's own key included); context_lens is int32 [B], 1 <= len <= S_cap."""
    _decode(q, k_cache, v_cache, context_lens, sm_scale, out, out32, k_cache.shape[1], k_cache.shape[2])


def decode_paged(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                 context_lens: torch.Tensor, sm_scale: float, out: torch.Tensor,
                 out32: torch.Tensor | None = None) -> None:
    """`decode` from a paged KV cache, with `decode`'s bits on the same logical cache: q [B, HQ, 1, D];
    k/v_pages [num_pages, page_size, HKV, D] (vLLM's and flash-attn's paged layout; any page_size >= 1), key j of
    sequence b in row j % page_size of page block_table[b, j // page_size]; block_table int32 [B, max_pages] (its
    rows may be a slice of a wider table); context_lens int32 [B], 1 <= len <= max_pages * page_size. Table entries
    past a sequence's last page are never read. The launch is sized from max_pages * page_size, never from the
    lengths (CUDA-graph capturable). The same chunks, blocks and merges as `decode`: only the addresses differ.
    With DECODE_IMPL "gluon_ws" the Triton decode runs (the Gluon one reads contiguous caches only; both give the
    same bits)."""
    _check_paged(q, k_pages, v_pages, block_table, context_lens, out, out32)
    page = k_pages.shape[1]
    _decode(q, k_pages, v_pages, context_lens, sm_scale, out, out32, k_pages.shape[2], block_table.shape[1] * page,
            block_table, page)


def _check_paged(q, k_pages, v_pages, block_table, context_lens, out, out32) -> None:
    """Refuse, naming the argument, what `decode_paged` does not read as documented (shapes, dtypes and strides
    only: nothing on the device is read)."""
    problems = []
    if q.dim() != 4 or q.shape[2] != 1 or not q.is_contiguous():
        problems.append(f"q {tuple(q.shape)}: expected a contiguous [B, HQ, 1, D]")
    if k_pages.dim() != 4 or not k_pages.is_contiguous():
        problems.append(f"k_pages {tuple(k_pages.shape)}: expected a contiguous [num_pages, page_size, HKV, D]")
    elif v_pages.shape != k_pages.shape or not v_pages.is_contiguous() or v_pages.dtype != k_pages.dtype:
        problems.append(f"v_pages {tuple(v_pages.shape)} {v_pages.dtype}: expected contiguous and like k_pages "
                        f"{tuple(k_pages.shape)} {k_pages.dtype}")
    if problems:
        raise ValueError("decode_paged: " + "; ".join(problems))
    B, HQ, _, D = q.shape
    _, page, HKV, Dk = k_pages.shape
    if k_pages.dtype != q.dtype:
        problems.append(f"k_pages dtype {k_pages.dtype}: expected q's, {q.dtype}")
    if Dk != D or D < 16 or D & (D - 1):
        problems.append(f"head dim {Dk} (q: {D}): expected q's, a power of two >= 16")
    if HKV < 1 or HQ % HKV:
        problems.append(f"{HKV} KV heads: expected a divisor of q's {HQ} heads")
    if page < 1:
        problems.append(f"page_size {page}: expected >= 1")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B \
            or block_table.shape[1] < 1 or block_table.stride(1) != 1:
        problems.append(f"block_table {block_table.dtype} {tuple(block_table.shape)} strides {block_table.stride()}: "
                        f"expected int32 [{B}, max_pages >= 1] with unit column stride")
    if context_lens.dtype != torch.int32 or tuple(context_lens.shape) != (B,) or not context_lens.is_contiguous():
        problems.append(f"context_lens {context_lens.dtype} {tuple(context_lens.shape)}: expected contiguous int32 "
                        f"[{B}]")
    for name, o, dt in (("out", out, q.dtype), ("out32", out32, torch.float32)):
        if o is not None and (o.shape != q.shape or o.dtype != dt or not o.is_contiguous()):
            problems.append(f"{name} {o.dtype} {tuple(o.shape)}: expected contiguous {dt} {tuple(q.shape)}")
    if problems:
        raise ValueError("decode_paged: " + "; ".join(problems))


def _decode(q, k_cache, v_cache, context_lens, sm_scale, out, out32, HKV, s_cap, table=None, page=0) -> None:
    """decode (page 0: k/v_cache [B, HKV, s_cap, D]) and decode_paged (pages of `page` keys, `table` the block
    table, s_cap its capacity in keys): one launch plan for both, so a paged call splits, packs and merges as the
    contiguous one would."""
    B, HQ, _, D = q.shape
    group = HQ // HKV
    split = KNOBS["SPLIT_TOKENS"]
    pack = KNOBS["DECODE_PACK_GQA"]
    cpp = KNOBS["DECODE_CHUNKS_PER_PROGRAM"]
    o32 = out32 if out32 is not None else out
    qk_scale = _qk_scale(sm_scale)
    # A cache of at most one chunk: one launch (a shape choice; the bits are the merge's either way).
    finish_single = bool(split) and KNOBS["DECODE_FINISH_SINGLE"] and s_cap <= split
    merge = bool(split) and not finish_single
    gluon = KNOBS["DECODE_IMPL"] == "gluon_ws" and not page and _dec_covers(q, k_cache, v_cache)
    # (Which program computes a chunk does not change its bits: each chunk starts fresh and is written as its own
    # partial.)
    programs = B * (HKV if pack else HQ)  # per chunk
    if split:
        n_chunks = _cdiv(s_cap, split)
        if cpp == 0:  # "auto": the fewest programs that still give every SM two
            cpp = 1
            while cpp < n_chunks and _cdiv(n_chunks, 2 * cpp) * programs >= 2 * _sm_count(q.device):
                cpp *= 2
        elif cpp == "waves":
            cpp = _waves_cpp(n_chunks, programs, _dec_per_sm(KNOBS["BLOCK_N"], D) if gluon else 2,
                             _sm_count(q.device))
    else:
        n_chunks, cpp = 1, 1
    grid = (_cdiv(n_chunks, cpp), programs)
    launch = KNOBS["DECODE_MERGE_LAUNCH"]
    if launch == "auto":  # the Triton decode's fused fold wins from 128 chunk programs, PDL below; the Gluon
        # decode's fused fold wins on every grid (results/attention/design_notes.md)
        launch = "fused" if gluon or grid[0] * grid[1] * 4 >= 3 * _sm_count(q.device) else "pdl"
    # Programmatic dependent launch exists on the GPU only (Hopper and later); the interpreter runs plain.
    pdl = merge and launch == "pdl" and q.is_cuda
    fused = merge and launch == "fused"  # the chunk grid's last programs fold: one launch
    if merge:
        m_ws = torch.empty((B * HQ * n_chunks,), dtype=torch.float32, device=q.device)
        l_ws = torch.empty_like(m_ws)
        acc_ws = torch.empty((B * HQ * n_chunks * D,), dtype=torch.float32, device=q.device)
    else:  # no partials: the slots are never read or written
        m_ws = l_ws = acc_ws = o32
    arrivals = _arrivals(q.device, grid[1]) if fused else m_ws
    if gluon:
        _dec_launch(q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, grid, n_chunks,
                    qk_scale, cpp, finish=not merge, fused=fused, write32=out32 is not None)
    else:
        _triton_decode(q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, grid, n_chunks,
                       qk_scale, cpp, pdl, fused, finish_single, out32 is not None, HKV, s_cap, table, page)
    if merge and not fused:
        _fast(_decode_merge_kernel)[(B * HKV,)](
            context_lens, out, o32, m_ws, l_ws, acc_ws, n_chunks, qk_scale, HQ, HKV, group,
            HEAD_D=D, ROWS=max(KNOBS["DECODE_MERGE_ROWS"], _pow2(group)), SPLIT=split, PDL=pdl,
            LOADS=KNOBS["DECODE_MERGE_LOADS"], WRITE32=out32 is not None, num_warps=4,
            **({"launch_pdl": True} if pdl else {}),
        )


def _triton_decode(q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, grid, n_chunks,
                   qk_scale, cpp, pdl, fused, finish_single, write32, HKV, s_cap, table, page):
    B, HQ, _, D = q.shape
    group = HQ // HKV
    bn = KNOBS["BLOCK_N"]
    # TMA reads a block as one box, so a paged cache takes it only where a page holds whole blocks.
    tma = (not page or page % bn == 0) and _use_tma("DECODE_KV_LOADS", k_cache, v_cache)
    # A paged block's loads wait on its block-table load, and Triton's pipeliner splits a loop's stages between
    # the two levels; 2S - 1 stages keep S K/V blocks in flight, as S do for a contiguous cache (offline sm_90a:
    # the same shared memory). Pipelining moves loads, not arithmetic.
    stages = KNOBS["DECODE_NUM_STAGES"]
    stages = 2 * stages - 1 if page else stages
    pack = KNOBS["DECODE_PACK_GQA"]
    layout_free = KNOBS["ROW_SUM"] != "reduce"  # a reduced row sum must keep prefill's wgmma layout family
    block_m = KNOBS["DECODE_BLOCK_M"] if layout_free else max(KNOBS["DECODE_BLOCK_M"], 64)
    block_m = max(block_m, _pow2(group)) if pack else block_m
    # rows of the merge's tile: the row group (a KV head's query heads, or one query head) padded
    merge_rows = max(KNOBS["DECODE_MERGE_ROWS"], _pow2(group if pack else 1))
    _fast(_decode_kernel)[grid](
        q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, s_cap,
        k_cache.shape[0] * page if page else B * HKV * s_cap, n_chunks, qk_scale, HQ, HKV, group,
        table if page else context_lens, table.stride(0) if page else 0,
        HEAD_D=D, BLOCK_M=block_m, BLOCK_N=bn, SPLIT=KNOBS["SPLIT_TOKENS"],
        PACK_GQA=pack, CHUNKS_PER_PROGRAM=cpp, CHUNK_LOOP=KNOBS["DECODE_CHUNK_LOOP"],
        TMA=tma, PDL=pdl, FINISH_SINGLE=finish_single, FUSED_MERGE=fused,
        MERGE_ROWS=merge_rows, MERGE_LOADS=KNOBS["DECODE_MERGE_LOADS"], WRITE32=write32, PAGE=page,
        KV_ROW=HKV * D if page else 0, num_warps=KNOBS["DECODE_NUM_WARPS"], num_stages=stages,
    )


# Registers a thread at launch for the Gluon decode's two warpgroups (its loader warp padded to one): 128 lets two
# programs share an SM's 65,536 (the loader gives up all but 40, so the consumer warpgroup gets 216); where the
# slots' shared memory allows one program an SM anyway, 168 (no spill for the overlapped schedule either).
DEC_MAXNREG = 128
DEC_MAXNREG_ALONE = 168
DEC_FIXED_SMEM = 10 * 1024  # beside the slots: ones tile, barriers, layout-conversion scratch (offline sm_90a compile)


def _waves_cpp(n_chunks: int, programs: int, per_sm: int, sms: int) -> int:
    """DECODE_CHUNKS_PER_PROGRAM "waves": the power of two (up to the chunk count's) whose launch takes the fewest
    chunk-times (waves of programs, as many an SM as fit, times chunks a program), the largest among equals: the
    fewest programs, whose loads stream on across their chunks instead of refilling a pipeline per program."""
    def cost(cpp: int) -> int:
        return _cdiv(_cdiv(n_chunks, cpp) * programs, per_sm * sms) * min(cpp, n_chunks)

    return min((2 ** i for i in range((n_chunks - 1).bit_length() + 1)), key=lambda c: (cost(c), -c))


def _dec_per_sm(block_n: int, head_d: int) -> int:
    """Gluon decode programs an SM holds (shared memory)."""
    return 2 if _dec_plan(block_n, head_d)[1] == DEC_MAXNREG else 1


def _dec_plan(block_n: int, head_d: int) -> tuple[int, int]:
    """The Gluon decode's (sub-block slots, registers a thread at launch). A block holds its sub-blocks' slots until
    its PV is done; the overlapped schedule also needs the next block's K tiles before that, so it needs two
    blocks' slots (fewer would deadlock the loader and the consumer)."""
    overlap = KNOBS["DECODE_WS_SCHEDULE"] == "overlap"
    slots = max(KNOBS["DECODE_WS_BUFFERS"], block_n // 64 * (2 if overlap else 1))
    two_per_sm = 2 * (slots * 2 * 64 * head_d * 2 + DEC_FIXED_SMEM + 1024) <= 228 * 1024
    return slots, DEC_MAXNREG if two_per_sm else DEC_MAXNREG_ALONE


def _dec_covers(q, k_cache, v_cache) -> bool:
    """Whether the Gluon decode covers this call: a Hopper GPU, head dim 64 or 128, GQA packed (at most 64 query
    heads per KV head), 128-key blocks with a dot or tree row sum, contiguous aligned tensors. (The kernel also
    builds for 64-key blocks, one sub-block each, but with the reduced row sum at head dim 64 it disagreed with
    the Triton decode on a GPU (cause not found), and 64-key blocks have a fast Triton decode.)"""
    group = q.shape[1] // k_cache.shape[1]
    bn, row_sum = KNOBS["BLOCK_N"], KNOBS["ROW_SUM"]
    return (q.is_cuda and _device(q.device)[1] == 9 and q.shape[3] in (64, 128) and KNOBS["DECODE_PACK_GQA"]
            and group <= 64 and bn == 128 and row_sum in ("dot", "tree")
            and _tma_ready(q, k_cache, v_cache))


def _dec_launch(q, k_cache, v_cache, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, grid, n_chunks, qk_scale,
                cpp, finish, fused, write32):
    B, HQ, _, D = q.shape
    HKV, s_cap = k_cache.shape[1], k_cache.shape[2]
    # Rank 3 ([B * HKV, S_cap, D]): sub-blocks reaching past the cache read zeros, never the next head's rows.
    k_desc = _Desc(k_cache, (B * HKV, s_cap, D), (s_cap * D, D, 1), (1, 64, D))
    v_desc = _Desc(v_cache, (B * HKV, s_cap, D), (s_cap * D, D, 1), (1, 64, D))
    slots, maxnreg = _dec_plan(KNOBS["BLOCK_N"], D)
    _fast(_dec_kernel)[grid](
        q, k_desc, v_desc, context_lens, out, o32, m_ws, l_ws, acc_ws, arrivals, n_chunks, qk_scale, HQ, HKV,
        HQ // HKV, HEAD_D=D, BLOCK_N=KNOBS["BLOCK_N"], SPLIT=KNOBS["SPLIT_TOKENS"], CPP=cpp, NUM_BUF=slots,
        ROW_SUM_DOT=KNOBS["ROW_SUM"] == "dot", FINISH=finish, WRITE32=write32,
        OVERLAP=KNOBS["DECODE_WS_SCHEDULE"] == "overlap", FUSED=fused,
        FOLD_ROWS=max(KNOBS["DECODE_MERGE_ROWS"], _pow2(HQ // HKV)), LOADS=KNOBS["DECODE_MERGE_LOADS"],
        num_warps=4, maxnreg=maxnreg)
