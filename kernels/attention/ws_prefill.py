"""Warp-specialised Hopper prefill (Gluon), the root's arithmetic in explicit partitions. GPU only (sm_90).

Triton 3.6 cannot warp-specialise the Triton prefill on Hopper (its pass aborts), so its two warpgroups meet at
a CTA barrier on every KV block and cannot overlap one's softmax with the other's MMAs. Here a one-warp loader
streams K and V tiles by TMA through a ring of shared-memory slots (mbarriers, no CTA barrier), and each
warpgroup owns 64 query rows of the 128-row tile as its own partition, so the two drift apart freely.

Per row the arithmetic is the root's `flat` prefill, operation for operation: the same wgmma instruction shapes
(m64n{BLOCK_N}k16 for QK^T, m64n{HEAD_D}k16 for PV, i.e. the layouts Triton gives the 8-warp 128-row tile), the
same explicit fma/exp2 expressions, the row sum reduced over the same accumulator layout, chunks of SPLIT keys
folded at chunk ends and once more after the last block. So its bits are meant to equal the Triton prefill's
(and through it decode's); the GPU check compares them bit for bit rather than assuming it.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

TILE_M = 128  # query rows per program: two consumer warpgroups of one wgmma M each
ROWS = gl.constexpr(TILE_M // 2)
BLOCK_M = gl.constexpr(TILE_M)
LOWER = gl.constexpr(0)  # the consumer halves of the tile
UPPER = gl.constexpr(1)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, empty,
            q_row0, kv_row0, n_blocks, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """One warp: both query halves once, then K and V of every block into the slot ring."""
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, 0], q_bar, q_bufs.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row0 + ROWS, 0], q_bar, q_bufs.index(1))
    for j in range(n_blocks):
        slot = j % NUM_BUF
        # A fresh mbarrier counts as having completed the phase before 0, so the first round passes at once.
        mbarrier.wait(empty.index(slot), ((j // NUM_BUF) & 1) ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row0 + j * BLOCK_N, 0], k_ready.index(slot), k_bufs.index(slot))
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row0 + j * BLOCK_N, 0], v_ready.index(slot), v_bufs.index(slot))


@gluon.jit
def _probs(s, c_m, c_l, j, rows, qk_scale, masked, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr,
           BLOCK_N: gl.constexpr):
    """The root's softmax step for block j's scores s: (bf16 P as the PV dot's operand, alpha, m, l)."""
    if masked:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        s = gl.where(cols[None, :] < (rows + 1)[:, None], s, float("-inf"))
    m_new = gl.maximum(c_m, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(gl.fma(s, qk_scale, -(m_use * qk_scale)[:, None]))
    alpha = gl.exp2((c_m - m_use) * qk_scale)
    l_new = gl.fma(c_l, alpha, gl.sum(p, 1))
    return gl.convert_layout(p.to(gl.bfloat16), P_LAYOUT), alpha, m_new, l_new


@gluon.jit
def _block(j, q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, c_acc, c_m, c_l, rows, qk_scale,
           S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr, O_ROW: gl.constexpr,
           BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, MASK: gl.constexpr):
    """The root's `_attn_block` for KV block j on this warpgroup's rows, one MMA at a time."""
    slot = j % NUM_BUF
    phase = (j // NUM_BUF) & 1
    mbarrier.wait(k_ready.index(slot), phase)
    k_smem = k_bufs.index(slot)
    s = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
    s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s, use_acc=False, is_async=True)
    s, _, _ = warpgroup_mma_wait(0, deps=[s, q_smem, k_smem])
    p16, alpha, m_new, c_l = _probs(s, c_m, c_l, j, rows, qk_scale, MASK, S_LAYOUT, P_LAYOUT, BLOCK_N)
    c_acc = c_acc * gl.convert_layout(alpha, O_ROW)[:, None]
    mbarrier.wait(v_ready.index(slot), phase)
    v_smem = v_bufs.index(slot)
    c_acc = warpgroup_mma(p16, v_smem, c_acc, is_async=True)
    c_acc, _ = warpgroup_mma_wait(0, deps=[c_acc, v_smem])
    mbarrier.arrive(empty.index(slot), count=1)
    return c_acc, m_new, c_l


@gluon.jit
def _merge(m_a, l_a, acc_a, m_b, l_b, acc_b, qk_scale, O_ROW: gl.constexpr):
    """The root's `_merge`: fold chunk b into the running state a."""
    m = gl.maximum(m_a, m_b)
    m_use = gl.where(m == float("-inf"), 0.0, m)
    alpha = gl.exp2((m_a - m_use) * qk_scale)
    beta = gl.exp2((m_b - m_use) * qk_scale)
    l = gl.fma(l_a, alpha, l_b * beta)
    acc = gl.fma(acc_a, gl.convert_layout(alpha, O_ROW)[:, None], acc_b * gl.convert_layout(beta, O_ROW)[:, None])
    return m, l, acc


@gluon.jit
def _walk(lo, hi, acc, m_i, l_i, c_acc, c_m, c_l, q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, rows, qk_scale,
          S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr, O_ROW: gl.constexpr, BLOCK_N: gl.constexpr,
          SPLIT: gl.constexpr, NUM_BUF: gl.constexpr, MASK: gl.constexpr):
    """Blocks lo..hi-1 into the chunk state, folding it into the running state at every chunk end."""
    for j in range(lo, hi):
        c_acc, c_m, c_l = _block(j, q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, c_acc, c_m, c_l, rows,
                                 qk_scale, S_LAYOUT, P_LAYOUT, O_ROW, BLOCK_N, NUM_BUF, MASK)
        if ((j + 1) * BLOCK_N) % SPLIT == 0:
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)
            c_acc = gl.zeros_like(c_acc)
            c_m = gl.full_like(c_m, float("-inf"))
            c_l = gl.zeros_like(c_l)
    return acc, m_i, l_i, c_acc, c_m, c_l


@gluon.jit
def _walk_overlapped(n_blocks, unmasked, acc, m_i, l_i, q_smem, k_bufs, v_bufs, k_ready, v_ready, empty, my_turn,
                     other_turn, rows, qk_scale, S_LAYOUT: gl.constexpr, P_LAYOUT: gl.constexpr, O_ROW: gl.constexpr,
                     BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, NUM_BUF: gl.constexpr, PINGPONG: gl.constexpr):
    """Every block, the next block's QK^T issued before this block's PV so that the softmax of one runs while
    the tensor cores do the other. Same operations per block as `_walk`; only their issue order differs."""
    s = gl.zeros([ROWS, BLOCK_N], gl.float32, S_LAYOUT)
    mbarrier.wait(k_ready.index(0), 0)
    s, _q0, _k0 = warpgroup_mma_wait(0, deps=[warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s, use_acc=False,
                                                        is_async=True), q_smem, k_bufs.index(0)])
    c_m = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    p16, alpha, c_m, c_l = _probs(s, c_m, gl.zeros_like(c_m), 0, rows, qk_scale, unmasked <= 0, S_LAYOUT, P_LAYOUT,
                                  BLOCK_N)
    c_acc = gl.zeros_like(acc)
    for j in range(0, n_blocks - 1):
        slot = j % NUM_BUF
        nslot = (j + 1) % NUM_BUF
        mbarrier.wait(k_ready.index(nslot), ((j + 1) // NUM_BUF) & 1)
        if PINGPONG:  # the warpgroups take turns issuing their MMAs, so one's softmax meets the other's MMAs
            mbarrier.wait(my_turn, j & 1)
        k_smem = k_bufs.index(nslot)
        s_next = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s, use_acc=False, is_async=True)
        c_acc = c_acc * gl.convert_layout(alpha, O_ROW)[:, None]
        mbarrier.wait(v_ready.index(slot), (j // NUM_BUF) & 1)
        v_smem = v_bufs.index(slot)
        c_acc = warpgroup_mma(p16, v_smem, c_acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(other_turn, count=1)
        s, _q1, _k1 = warpgroup_mma_wait(1, deps=[s_next, q_smem, k_smem])  # the QK^T (issued first) is done
        ends = ((j + 1) * BLOCK_N) % SPLIT == 0  # block j closes its chunk: block j + 1 starts a fresh state
        m_prev = gl.where(ends, float("-inf"), c_m)
        l_prev = gl.where(ends, 0.0, c_l)
        p16_n, alpha, m_n, l_n = _probs(s, m_prev, l_prev, j + 1, rows, qk_scale, j + 1 >= unmasked, S_LAYOUT,
                                        P_LAYOUT, BLOCK_N)
        c_acc, _v1, _p1 = warpgroup_mma_wait(0, deps=[c_acc, v_smem, p16])
        mbarrier.arrive(empty.index(slot), count=1)
        if ends:
            m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)
            c_acc = gl.zeros_like(c_acc)
        p16, c_m, c_l = p16_n, m_n, l_n
    last = n_blocks - 1
    slot = last % NUM_BUF
    c_acc = c_acc * gl.convert_layout(alpha, O_ROW)[:, None]
    mbarrier.wait(v_ready.index(slot), (last // NUM_BUF) & 1)
    v_smem = v_bufs.index(slot)
    c_acc, _v2, _p2 = warpgroup_mma_wait(0, deps=[warpgroup_mma(p16, v_smem, c_acc, is_async=True), v_smem,
                                                                p16])
    mbarrier.arrive(empty.index(slot), count=1)
    # The chunk open after the last block (folded whole; if it had just closed, this folds it and then an
    # empty state, as the root's flat loop does).
    if (n_blocks * BLOCK_N) % SPLIT == 0:
        m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)
        c_acc = gl.zeros_like(c_acc)
        c_m = gl.full_like(c_m, float("-inf"))
        c_l = gl.zeros_like(c_l)
    return _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)


@gluon.jit
def _consumer(O, O32, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, empty, turns, o_row0, tile_start, qk_scale,
              HALF: gl.constexpr, HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr,
              NUM_BUF: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, WRITE32: gl.constexpr):
    """One warpgroup: query rows tile_start + HALF * 64 + [0, 64) over their causal keys."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    S_ROW: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROW: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    rows = tile_start + HALF * ROWS + gl.arange(0, ROWS, layout=S_ROW)
    q_smem = q_bufs.index(HALF)
    mbarrier.wait(q_bar, 0)
    acc = gl.zeros([ROWS, HEAD_D], gl.float32, O_LAYOUT)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, S_ROW)
    l_i = gl.zeros([ROWS], gl.float32, S_ROW)
    c_acc = gl.zeros([ROWS, HEAD_D], gl.float32, O_LAYOUT)
    c_m = gl.full([ROWS], float("-inf"), gl.float32, S_ROW)
    c_l = gl.zeros([ROWS], gl.float32, S_ROW)
    # Blocks below the 128-row tile's first row are unmasked for every row of the tile, the rest masked (as the
    # root does for the whole tile: a mask a row sees in full changes no bit).
    unmasked = tile_start // BLOCK_N
    n_blocks = (tile_start + 2 * ROWS) // BLOCK_N
    if OVERLAP:
        m_i, l_i, acc = _walk_overlapped(n_blocks, unmasked, acc, m_i, l_i, q_smem, k_bufs, v_bufs, k_ready, v_ready,
                                         empty, turns.index(HALF), turns.index(1 - HALF), rows, qk_scale, S_LAYOUT,
                                         P_LAYOUT, O_ROW, BLOCK_N, SPLIT, NUM_BUF, PINGPONG)
    else:
        acc, m_i, l_i, c_acc, c_m, c_l = _walk(0, unmasked, acc, m_i, l_i, c_acc, c_m, c_l, q_smem, k_bufs, v_bufs,
                                               k_ready, v_ready, empty, rows, qk_scale, S_LAYOUT, P_LAYOUT, O_ROW,
                                               BLOCK_N, SPLIT, NUM_BUF, False)
        acc, m_i, l_i, c_acc, c_m, c_l = _walk(unmasked, n_blocks, acc, m_i, l_i, c_acc, c_m, c_l, q_smem, k_bufs,
                                               v_bufs, k_ready, v_ready, empty, rows, qk_scale, S_LAYOUT, P_LAYOUT,
                                               O_ROW, BLOCK_N, SPLIT, NUM_BUF, True)
        m_i, l_i, acc = _merge(m_i, l_i, acc, c_m, c_l, c_acc, qk_scale, O_ROW)  # the open chunk (identity if empty)
    o = acc / gl.convert_layout(l_i, O_ROW)[:, None]
    r = HALF * ROWS + gl.arange(0, ROWS, layout=O_ROW)
    d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, O_LAYOUT))
    io = o_row0 + r[:, None].to(gl.int64) * HEAD_D + d[None, :]
    gl.store(O + io, o.to(gl.bfloat16))
    if WRITE32:
        gl.store(O32 + io, o)


@gluon.jit
def _ws_prefill_kernel(q_desc, k_desc, v_desc, O, O32, S, qk_scale, HQ, HKV, GROUP,
                       HEAD_D: gl.constexpr, BLOCK_N: gl.constexpr, SPLIT: gl.constexpr, NUM_BUF: gl.constexpr,
                       OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, WRITE32: gl.constexpr):
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # longest causal rows first
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    tile_start = pid_m * BLOCK_M
    q_row0 = bh * S + tile_start
    kv_row0 = (b * HKV + h // GROUP) * S
    SMEM: gl.constexpr = q_desc.layout
    q_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, HEAD_D], SMEM)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, HEAD_D], SMEM)
    v_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, HEAD_D], SMEM)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumer warpgroups release a slot
    if PINGPONG:
        mbarrier.arrive(turns.index(0), count=1)  # the lower half issues first
    o_row0 = q_row0.to(gl.int64) * HEAD_D
    n_blocks = (tile_start + BLOCK_M) // BLOCK_N
    gl.warp_specialize([
        (_consumer, (O, O32, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, empty, turns, o_row0, tile_start,
                     qk_scale, LOWER, HEAD_D, BLOCK_N, SPLIT, NUM_BUF, OVERLAP, PINGPONG, WRITE32)),
        (_consumer, (O, O32, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, empty, turns, o_row0, tile_start,
                     qk_scale, UPPER, HEAD_D, BLOCK_N, SPLIT, NUM_BUF, OVERLAP, PINGPONG, WRITE32)),
        (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bar, k_ready, v_ready, empty, q_row0, kv_row0,
                   n_blocks, BLOCK_N, NUM_BUF)),
    ], [4, 1], [232, 40])


def supported(q: torch.Tensor, block_n: int) -> bool:
    """Shapes this kernel covers: a Hopper GPU, whole 128-row tiles, head dim 64 or 128."""
    S, D = q.shape[2], q.shape[3]
    return (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9 and S % TILE_M == 0
            and D in (64, 128) and TILE_M % block_n == 0)


def prefill(q, k, v, sm_scale: float, out, out32=None, *, block_n: int = 64, split: int = 1024,
            num_buf: int = 4, overlap: bool = False, pingpong: bool = False,
            log2e: float = 1.4426950408889634) -> None:
    """Causal GQA prefill, q [B, HQ, S, D], k/v [B, HKV, S, D] -> out (the root's contract: BLOCK_N, SPLIT)."""
    B, HQ, S, D = q.shape
    HKV = k.shape[1]
    if not supported(q, block_n):
        raise ValueError(f"warp-specialised prefill needs a Hopper GPU, S % {TILE_M} == 0 and head dim 64/128; "
                         f"got S={S}, D={D} on {q.device}")
    if split and split % block_n:
        raise ValueError(f"SPLIT_TOKENS {split} is not a multiple of BLOCK_N {block_n}")
    # Host-built descriptors (kernel arguments): no program builds its own.
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_desc = TensorDescriptor.from_tensor(q.view(B * HQ * S, D), [TILE_M // 2, D], layout)
    k_desc = TensorDescriptor.from_tensor(k.view(B * HKV * S, D), [block_n, D], layout)
    v_desc = TensorDescriptor.from_tensor(v.view(B * HKV * S, D), [block_n, D], layout)
    _ws_prefill_kernel[(S // TILE_M, B * HQ)](
        q_desc, k_desc, v_desc, out, out32 if out32 is not None else out, S, float(sm_scale) * log2e, HQ, HKV,
        HQ // HKV, HEAD_D=D, BLOCK_N=block_n, SPLIT=split or (1 << 30), NUM_BUF=num_buf,
        OVERLAP=overlap or pingpong, PINGPONG=pingpong, WRITE32=out32 is not None, num_warps=4, maxnreg=168)
