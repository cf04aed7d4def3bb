"""Batch-invariant linear layer y = x @ W^T (+ bias): bf16 in/out, fp32 accumulation.

Bitwise agreement between paths holds because every output element is produced by the same sequence of
`tl.dot` steps: BLOCK_K is fixed (a contract knob), the K loop runs in ascending order from column 0, there is
no split-K chosen by shape, no atomics, and one epilogue. `tl.dot` gives the same bits for any BLOCK_M /
BLOCK_N / warps / stages (measured on Hopper), so those follow the path.

An optional fixed K split (K_CHUNK, contract): K is cut into chunks of K_CHUNK columns at the same absolute
boundaries for every M (only for weights with K >= K_CHUNK_MIN_K: a property of the weight, never of M; weights
with K <= K_CHUNK, which that split would leave whole, may take chunks of K_CHUNK_SHORT instead);
each chunk starts from a zero accumulator and the chunk results are added to a zero
total in ascending order by `_merge`. The full path does that inside one program (one loop copy per chunk, or
one flat loop that folds at chunk boundaries: *_CHUNK_LOOP; or, for up to FULL_PERSISTENT_MAX_CHUNKS equal chunks,
a persistent program's (tile, chunk) items); decode may run the chunks as parallel programs
writing fp32 partials, merged by a second launch with the same `_merge` and epilogue (DECODE_SPLIT_MAX_M and
DECODE_SPLIT_MAX_TILES can keep launches that already have tiles enough in-program).

Decode may load UNROLL consecutive BLOCK_K tiles per loop iteration (more bytes in flight per program for the
memory-bound GEMV); their dots still run one after another in ascending k, and a tail that does not fill a
group runs tile by tile, so every output sees the same dot steps as with UNROLL 1 (no dot on tiles past K).
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
    "BLOCK_K": 64,
    "K_CHUNK": 4096,
    "FULL_BLOCK_M": 128,
    "FULL_BLOCK_N": 128,
    "FULL_GROUP_M": 8,
    "FULL_NUM_WARPS": 8,
    "FULL_NUM_STAGES": 5,
    "FULL_SPLIT_PARALLEL": False,
    "FULL_USE_TMA": True,
    "DECODE_BLOCK_M": 64,
    "DECODE_BLOCK_N": 0,
    "DECODE_GROUP_M": 4,
    "DECODE_NUM_WARPS": 4,
    "DECODE_NUM_STAGES": 0,
    "DECODE_SPLIT_PARALLEL": True,
    "DECODE_USE_TMA": True,
    "DECODE_K_UNROLL": 1,
    "DECODE_SMALL_M": 16,
    "DECODE_SMALL_BLOCK_N": 32,
    "DECODE_SMALL_K_UNROLL": 4,
    "DECODE_SMALL_NUM_WARPS": 2,
    "DECODE_SMALL_NUM_STAGES": 4,
    "DECODE_FULL_TILES_M": 128,
    "FULL_CHUNK_LOOP": "flat",
    "DECODE_CHUNK_LOOP": "flat",
    "DECODE_SPLIT_MAX_M": 128,
    "DECODE_FULL_TILES_MIN_PROGRAMS": 96,
    "K_CHUNK_MIN_K": 4096,
    "K_CHUNK_SHORT": 2048,
    "FULL_SHORT_K": 4096,
    "FULL_SHORT_K_NUM_STAGES": 3,
    "DECODE_SPLIT_MAX_TILES": 128,
    "FULL_PERSISTENT": "long_k",
    "FULL_PERSISTENT_MAX_CHUNKS": 2,
    "FULL_UNSPLIT_TILE": "128x256",
    "FULL_UNSPLIT_NUM_STAGES": 4,
    "FULL_CHUNKED_WIDE": "auto",
    "K_CHUNK_EQUAL": False,
    "FULL_GROUPED_BLOCK_M": 0,
    "FULL_GROUPED_BLOCK_N": 256,
    "FULL_GROUPED_NUM_STAGES": 4,
    "DECODE_GROUPED_BLOCK_M": 0,
    "DECODE_GROUPED_BLOCK_N": 128,
    "DECODE_GROUPED_NUM_STAGES": 4,
}


@triton.jit
def _tma_step(acc, x_desc, w_desc, off_m, off_n, k0):
    a = x_desc.load([off_m, k0])
    b = w_desc.load([off_n, k0])
    return tl.dot(a, b.T, acc)


@triton.jit
def _ptr_step(acc, x_ptr, w_ptr, offs_m, offs_n, offs_k, k0, k_hi, sxm, sxk, swn, swk, EVEN_K: tl.constexpr):
    kk = k0 + offs_k
    a_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * sxm + kk[None, :] * sxk
    b_ptrs = w_ptr + offs_n[None, :] * swn + kk[:, None] * swk
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=kk[None, :] < k_hi, other=0.0)
        b = tl.load(b_ptrs, mask=kk[:, None] < k_hi, other=0.0)
    return tl.dot(a, b, acc)


@triton.jit
def _k_range(x_ptr, w_ptr, offs_m, offs_n, off_m, off_n, M, N, K, k_lo, k_hi, sxm, sxk, swn, swk,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
             USE_TMA: tl.constexpr, UNROLL: tl.constexpr):
    # One accumulator from zero over columns [k_lo, k_hi) in BLOCK_K steps, ascending: the contract. The
    # tile loads (pointers or TMA descriptors, zero-filled past K either way) do not change the dot's bits.
    # UNROLL tiles per iteration (schedule only): whole groups first, then the leftover tiles one by one.
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_main = k_hi
    if UNROLL > 1:
        k_main = k_lo + (tl.cdiv(k_hi - k_lo, BLOCK_K) // UNROLL) * (UNROLL * BLOCK_K)
    if USE_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BLOCK_N, BLOCK_K])
        for k0 in range(k_lo, k_main, BLOCK_K * UNROLL):
            for u in tl.static_range(UNROLL):
                acc = _tma_step(acc, x_desc, w_desc, off_m, off_n, k0 + u * BLOCK_K)
        if UNROLL > 1:
            for k0 in range(k_main, k_hi, BLOCK_K):
                acc = _tma_step(acc, x_desc, w_desc, off_m, off_n, k0)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(k_lo, k_main, BLOCK_K * UNROLL):
            for u in tl.static_range(UNROLL):
                acc = _ptr_step(acc, x_ptr, w_ptr, offs_m, offs_n, offs_k, k0 + u * BLOCK_K, k_hi,
                                sxm, sxk, swn, swk, EVEN_K)
        if UNROLL > 1:
            for k0 in range(k_main, k_hi, BLOCK_K):
                acc = _ptr_step(acc, x_ptr, w_ptr, offs_m, offs_n, offs_k, k0, k_hi, sxm, sxk, swn, swk, EVEN_K)
    return acc


@triton.jit
def _k_chunks_flat(x_ptr, w_ptr, offs_m, offs_n, off_m, off_n, M, N, K, sxm, sxk, swn, swk,
                   K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, USE_TMA: tl.constexpr):
    # The same chunks as the unrolled form, in one K loop: the chunk's accumulator is folded into the total
    # (`_merge`, ascending) when its last tile is done and restarts from zero. Same dot steps and merges, so
    # the same bits; one pipelined loop and one live accumulator chain instead of N_CHUNKS loop copies.
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if USE_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        if USE_TMA:
            acc = _tma_step(acc, x_desc, w_desc, off_m, off_n, k0)
        else:
            acc = _ptr_step(acc, x_ptr, w_ptr, offs_m, offs_n, offs_k, k0, K, sxm, sxk, swn, swk, EVEN_K)
        k_next = k0 + BLOCK_K
        if (k_next % K_CHUNK == 0) | (k_next >= K):
            total = _merge(total, acc)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    return total


@triton.jit
def _merge(total, part):
    # Chunk results join a zero-initialised total in ascending chunk order, in every path.
    return total + part


@triton.jit
def _epilogue(total, b_ptr, offs_n, n_mask, HAS_BIAS: tl.constexpr):
    y = total
    if HAS_BIAS:
        y = y + tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    return y


@triton.jit
def _store_tile(total, b_ptr, y_ptr, y32_ptr, rows, cols, M, N, sym, syn,
                HAS_BIAS: tl.constexpr, WRITE32: tl.constexpr):
    # The one epilogue of every path: bias, bf16 output, optionally the fp32 values before the cast.
    n_mask = cols < N
    y = _epilogue(total, b_ptr, cols, n_mask, HAS_BIAS)
    mask = (rows[:, None] < M) & n_mask[None, :]
    r = rows.to(tl.int64)[:, None]  # rows x N passes 2**31 at a 151936-wide vocabulary from 14134 rows
    tl.store(y_ptr + r * sym + cols[None, :] * syn, y.to(y_ptr.dtype.element_ty), mask=mask)
    if WRITE32:
        tl.store(y32_ptr + r * N + cols[None, :], y, mask=mask)


@triton.jit
def _store_tile_halves(total, b_ptr, y_ptr, y32_ptr, off_m, off_n, M, N, sym, syn, HAS_BIAS: tl.constexpr,
                       WRITE32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # A 256-wide tile is stored as two halves along its long side: the store's layout change then stages half
    # the tile in shared memory (the fp32 output of a whole 128x256 tile would not fit beside the pipeline).
    # Element-wise epilogue, so the same bits as one store.
    if BLOCK_N >= 256:
        lo, hi = tl.split(tl.permute(tl.reshape(total, [BLOCK_M, 2, BLOCK_N // 2]), (0, 2, 1)))
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N // 2)
        _store_tile(lo, b_ptr, y_ptr, y32_ptr, rows, cols, M, N, sym, syn, HAS_BIAS, WRITE32)
        _store_tile(hi, b_ptr, y_ptr, y32_ptr, rows, cols + BLOCK_N // 2, M, N, sym, syn, HAS_BIAS, WRITE32)
    elif BLOCK_M >= 256:
        lo, hi = tl.split(tl.permute(tl.reshape(total, [2, BLOCK_M // 2, BLOCK_N]), (1, 2, 0)))
        rows = off_m + tl.arange(0, BLOCK_M // 2)
        cols = off_n + tl.arange(0, BLOCK_N)
        _store_tile(lo, b_ptr, y_ptr, y32_ptr, rows, cols, M, N, sym, syn, HAS_BIAS, WRITE32)
        _store_tile(hi, b_ptr, y_ptr, y32_ptr, rows + BLOCK_M // 2, cols, M, N, sym, syn, HAS_BIAS, WRITE32)
    else:
        _store_tile(total, b_ptr, y_ptr, y32_ptr, off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N),
                    M, N, sym, syn, HAS_BIAS, WRITE32)


@triton.jit
def _tile_ids(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped ordering so consecutive programs share W tiles in L2 (schedule only).
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % size_m)
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit(do_not_specialize=["M"])  # one compiled kernel for every M (M == 1 is not special)
def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, y32_ptr, M, N, K, sxm, sxk, swn, swk, sym, syn,
                   K_CHUNK: tl.constexpr, N_CHUNKS: tl.constexpr, HAS_BIAS: tl.constexpr, WRITE32: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, UNROLL: tl.constexpr,
                   FLAT_CHUNKS: tl.constexpr):
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows/cols read valid memory (wrapped) and are never stored: no M/N masks in the K loop.
    offs_m = rows % M
    offs_n = cols % N
    if K_CHUNK == 0:
        total = _merge(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                       _k_range(x_ptr, w_ptr, offs_m, offs_n, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K, 0, K,
                                sxm, sxk, swn, swk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, USE_TMA, UNROLL))
    elif FLAT_CHUNKS:
        total = _k_chunks_flat(x_ptr, w_ptr, offs_m, offs_n, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K,
                               sxm, sxk, swn, swk, K_CHUNK, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, USE_TMA)
    else:
        # Unrolled over the chunks (N_CHUNKS depends on K only) so each chunk's K loop is pipelined on its own;
        # a runtime outer loop measured 25% slower even with one chunk. Several 128x128 chunk loops exhaust
        # the registers (sm_90a: 255, spills, serialised wgmma at 4 chunks): FLAT_CHUNKS is one loop instead.
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(N_CHUNKS):
            k_lo = c * K_CHUNK
            k_hi = min(k_lo + K_CHUNK, K)
            total = _merge(total, _k_range(x_ptr, w_ptr, offs_m, offs_n, pid_m * BLOCK_M, pid_n * BLOCK_N,
                                           M, N, K, k_lo, k_hi, sxm, sxk, swn, swk,
                                           BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, USE_TMA, UNROLL))
    _store_tile(total, b_ptr, y_ptr, y32_ptr, rows, cols, M, N, sym, syn, HAS_BIAS, WRITE32)


@triton.jit(do_not_specialize=["M"])
def _linear_persistent_kernel(x_ptr, w_ptr, b_ptr, y_ptr, y32_ptr, M, N, K, sxm, swn, sym, syn,
                              HAS_BIAS: tl.constexpr, WRITE32: tl.constexpr, BLOCK_M: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                              K_CHUNK: tl.constexpr, N_CHUNKS: tl.constexpr):
    # Each program walks tiles a grid apart; the tile loop nest is flattened into one software pipeline, so
    # the next tile's first K tiles load during this tile's epilogue. Per output: the K loop from a zero
    # accumulator and one merge into a zero total, the dot steps of the unsplit (or one-chunk) kernel above.
    # (A fold inside the K loop of this nest measured 1.4-1.6x slower on the down projections: not used.)
    # With N_CHUNKS > 1 (K a multiple of K_CHUNK) the loop walks (tile, chunk) items instead, a tile's chunks
    # back to back: one K loop per item from a zero accumulator, merged into the total carried from the tile's
    # previous chunk (a zero total at chunk 0), stored after the last: the dot steps and merges of
    # `_k_chunks_flat`.
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[sxm, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[swn, 1], block_shape=[BLOCK_N, BLOCK_K])
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if N_CHUNKS == 1:
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
            pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                acc = _tma_step(acc, x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k0)
            total = _merge(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), acc)
            _store_tile_halves(total, b_ptr, y_ptr, y32_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, sym, syn,
                               HAS_BIAS, WRITE32, BLOCK_M, BLOCK_N)
    else:
        my_tiles = tl.cdiv(num_tiles - tl.program_id(0), tl.num_programs(0))
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for item in tl.range(0, my_tiles * N_CHUNKS, flatten=True):
            chunk = item % N_CHUNKS
            tile = tl.program_id(0) + (item // N_CHUNKS) * tl.num_programs(0)
            pid_m, pid_n = _tile_ids(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for kk in range(0, K_CHUNK, BLOCK_K):  # bounds the item loop cannot change: it stays one pipeline
                acc = _tma_step(acc, x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, chunk * K_CHUNK + kk)
            total = _merge(tl.where(chunk == 0, 0.0, total), acc)
            # Every item computes the store's addresses; only the tile's last chunk stores (the others see no
            # rows below their bound of 0). A store under `if` instead fails Triton 3.6's nested-loop fusion
            # (its scf.if result count).
            _store_tile_halves(total, b_ptr, y_ptr, y32_ptr, pid_m * BLOCK_M, pid_n * BLOCK_N,
                               tl.where(chunk == N_CHUNKS - 1, M, 0), N, sym, syn, HAS_BIAS, WRITE32, BLOCK_M,
                               BLOCK_N)


@triton.jit(do_not_specialize=["M"])
def _linear_chunk_kernel(x_ptr, w_ptr, ws_ptr, M, N, K, sxm, sxk, swn, swk,
                         K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                         USE_TMA: tl.constexpr, UNROLL: tl.constexpr):
    # One K chunk of one tile: the same _k_range call as the full path's chunk loop, stored as fp32.
    pid_m, pid_n = _tile_ids(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    chunk = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = rows % M
    offs_n = cols % N
    k_lo = chunk * K_CHUNK
    k_hi = min(k_lo + K_CHUNK, K)
    part = _k_range(x_ptr, w_ptr, offs_m, offs_n, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K, k_lo, k_hi,
                    sxm, sxk, swn, swk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, USE_TMA, UNROLL)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(ws_ptr + chunk * M * N + rows[:, None] * N + cols[None, :], part, mask=mask)


@triton.jit
def _linear_merge_kernel(ws_ptr, b_ptr, y_ptr, y32_ptr, M, N, n_chunks, sym, syn,
                         HAS_BIAS: tl.constexpr, WRITE32: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    rows = offs // N
    cols = offs % N
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(n_chunks):
        total = _merge(total, tl.load(ws_ptr + c * M * N + offs, mask=mask, other=0.0))
    y = _epilogue(total, b_ptr, cols, mask, HAS_BIAS)
    tl.store(y_ptr + rows * sym + cols * syn, y.to(y_ptr.dtype.element_ty), mask=mask)
    if WRITE32:
        tl.store(y32_ptr + offs, y, mask=mask)


_SMS: dict = {}  # device index -> SMs, read once (each call needs it)


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: CPU tests then reach several programs' worth of tiles
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


@triton.jit(do_not_specialize=["T"])
def _linear_grouped_kernel(x_ptr, w_ptr, y_ptr, y32_ptr, starts_ptr, E, T, N, K, sxm, sxk, swe, swn, swk,
                           sym, syn, K_CHUNK: tl.constexpr, WRITE32: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, E_PAD: tl.constexpr,
                           USE_TMA: tl.constexpr):
    # Program (row tile, column tile) of the grouped launch. Each program reads the E + 1 row offsets and
    # counts every expert's row tiles itself (a cumulative sum over E_PAD lanes: no host-side tensor ops and no
    # second launch); row tile t belongs to the expert whose tiles [first, first + tiles) hold t, and its rows
    # are starts[e] + BLOCK_M * (t - first) + arange, within [starts[e], starts[e + 1]). The K loop and the store
    # are linear_full's (`_k_range` / `_k_chunks_flat`, pointer or TMA loads), so each row gets linear_full's
    # bits for its expert's weight.
    t = tl.program_id(0)
    ex = tl.arange(0, E_PAD)
    lo = tl.load(starts_ptr + ex, mask=ex < E, other=0)
    hi = tl.load(starts_ptr + ex + 1, mask=ex < E, other=0)
    tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, 0)  # one past each expert's last tile
    if t >= tl.max(ends, 0):
        return  # the grid is an upper bound: without this exit each spare tile would run a whole K loop
    e = tl.sum((ends <= t).to(tl.int32), 0)  # experts whose tiles all lie before t (empty ones included)
    mine = ex == e
    row0 = tl.sum(tl.where(mine, lo + (t - (ends - tiles)) * BLOCK_M, 0), 0)
    row_end = tl.sum(tl.where(mine, hi, 0), 0)
    count = tl.maximum(row_end - row0, 1)
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = row0 + tl.arange(0, BLOCK_M) % count  # rows past the tile's end read one of its rows, never stored
    offs_n = cols % N
    w = w_ptr + e.to(tl.int64) * swe
    off_n = tl.program_id(1) * BLOCK_N
    # With TMA the descriptors span all of x and the expert's weight: rows past the expert's end load the next
    # expert's rows (or zeros past T), which are never stored.
    if K_CHUNK == 0:
        total = _merge(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                       _k_range(x_ptr, w, offs_m, offs_n, row0, off_n, T, N, K, 0, K, sxm, sxk, swn, swk, BLOCK_M,
                                BLOCK_N, BLOCK_K, EVEN_K, USE_TMA, 1))
    else:
        total = _k_chunks_flat(x_ptr, w, offs_m, offs_n, row0, off_n, T, N, K, sxm, sxk, swn, swk, K_CHUNK, BLOCK_M,
                               BLOCK_N, BLOCK_K, EVEN_K, USE_TMA)
    _store_tile(total, y_ptr, y_ptr, y32_ptr, rows, cols, row_end, N, sym, syn, False, WRITE32)


# The grouped dW kernel's (BLOCK_N, BLOCK_K, BLOCK_R, warps, stages). Backward only, so not a knob (no bits
# depend on it); tik-evo bench linear-grouped times alternatives (H200, Qwen3-30B-A3B experts at 8192
# tokens: 128x128x64 with 8 warps 1.29x faster than 64x64x64 with 4).
DW_TILE = (128, 128, 64, 8, 3)


@triton.jit
def _linear_grouped_dw_kernel(gy_ptr, x_ptr, gw_ptr, starts_ptr, N, K, sgm, sgn, sxm, sxk, swe, swn, swk,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    # dW[e] = dY[rows of e]^T @ X[rows of e] for one (expert, N tile, K tile): a K loop over the expert's rows.
    # Experts without rows store zeros. Backward is checked by tolerance only (no bitwise contract).
    e = tl.program_id(0)
    tiles_k = tl.cdiv(K, BLOCK_K)
    n = (tl.program_id(1) // tiles_k) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = (tl.program_id(1) % tiles_k) * BLOCK_K + tl.arange(0, BLOCK_K)
    lo = tl.load(starts_ptr + e)
    hi = tl.load(starts_ptr + e + 1)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for r0 in range(lo, hi, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        a = tl.load(gy_ptr + r[None, :] * sgm + n[:, None] * sgn, mask=(r[None, :] < hi) & (n[:, None] < N),
                    other=0.0)
        b = tl.load(x_ptr + r[:, None] * sxm + k[None, :] * sxk, mask=(r[:, None] < hi) & (k[None, :] < K),
                    other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(gw_ptr + e.to(tl.int64) * swe + n[:, None] * swn + k[None, :] * swk,
             acc.to(gw_ptr.dtype.element_ty), mask=(n[:, None] < N) & (k[None, :] < K))


# DW_KERNEL "tma" reads each expert's rows through TMA instead (_linear_grouped_dw_tma_kernel); "pointer" is the
# kernel above. Backward only, not a knob; tik-evo bench linear-grouped times the two (H200, 65,536 routed
# rows: TMA 1146 / 1120 us against the pointer kernel's 1120 / 1079 for gate / down, so "pointer" stays).
DW_KERNEL = "pointer"


@triton.jit
def _linear_grouped_dw_tma_kernel(gy_ptr, x_ptr, gw_ptr, starts_ptr, N, K, sgm, sxm, swe, swn,
                                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    # The pointer kernel's dW[e] = dY[rows of e]^T @ X[rows of e], with both operands read by TMA from
    # descriptors over the expert's own rows (made here, one pair per program): TMA fills rows past the expert's
    # last with zeros, so the R loop needs no mask and the next expert's rows never enter. dY's tile is
    # transposed in shared memory, as in the dense backward's dW.
    e = tl.program_id(0)
    tiles_k = tl.cdiv(K, BLOCK_K)
    n0 = (tl.program_id(1) // tiles_k) * BLOCK_N
    k0 = (tl.program_id(1) % tiles_k) * BLOCK_K
    lo = tl.load(starts_ptr + e).to(tl.int64)
    rows = tl.load(starts_ptr + e + 1) - lo.to(tl.int32)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if rows > 0:
        gy_desc = tl.make_tensor_descriptor(gy_ptr + lo * sgm, shape=[rows, N], strides=[sgm, 1],
                                            block_shape=[BLOCK_R, BLOCK_N])
        x_desc = tl.make_tensor_descriptor(x_ptr + lo * sxm, shape=[rows, K], strides=[sxm, 1],
                                           block_shape=[BLOCK_R, BLOCK_K])
        for r0 in range(0, rows, BLOCK_R):
            acc = tl.dot(gy_desc.load([r0, n0]).T, x_desc.load([r0, k0]), acc)
    n = n0 + tl.arange(0, BLOCK_N)
    k = k0 + tl.arange(0, BLOCK_K)
    tl.store(gw_ptr + e.to(tl.int64) * swe + n[:, None] * swn + k[None, :],
             acc.to(gw_ptr.dtype.element_ty), mask=(n[:, None] < N) & (k[None, :] < K))


def _tma_alloc(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_ok(*tensors):
    # TMA needs unit inner strides and 16-byte aligned rows; transposed views (the backward) use pointers.
    ok = all(t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
             for t in tensors)
    if ok and tensors[0].is_cuda:
        triton.set_allocator(_tma_alloc)  # scratch for the in-kernel descriptors
    return ok


def _k_chunk(K):
    # Contract: the K split depends on the weight's K only (never on the rows); short reductions stay whole.
    if not KNOBS["K_CHUNK"] or KNOBS["K_CHUNK_MIN_K"] > K:
        return 0
    width = KNOBS["K_CHUNK"]
    if KNOBS["K_CHUNK"] >= K and KNOBS["K_CHUNK_SHORT"]:
        width = KNOBS["K_CHUNK_SHORT"]  # weights K_CHUNK would leave whole get narrower chunks of their own
    if KNOBS["K_CHUNK_EQUAL"] and width < K and K % KNOBS["BLOCK_K"] == 0:
        # Equal chunks of whole K steps, the fewest (up to twice the count) no wider than `width`: K 9728 in
        # four of 2432 rather than 4096 + 4096 + 1536, so the persistent (tile, chunk) items can take it.
        steps, least = K // KNOBS["BLOCK_K"], -(-K // width)
        for n in range(least, 2 * least + 1):
            if steps % n == 0:
                return K // n
    return width


def _auto_tiles(M, N, K, bm, k_chunk, n_chunks, may_split, max_tiles, sms):
    """(block_n, parallel chunks) of a decode launch with DECODE_BLOCK_N = 0 (schedule only).

    A decode program streams (bm + bn) * its K columns of x and W; the launch takes as many waves of programs
    as the SMs need. Ties go to in-program chunks (no merge launch), then to the narrower tile."""
    options = []
    for bn in (32, 64, 128):
        tiles = cdiv(M, bm) * cdiv(N, bn)
        for par in (False, True) if may_split and (not max_tiles or tiles <= max_tiles) else (False,):
            programs = tiles * (n_chunks if par else 1)
            options.append((cdiv(programs, sms) * (bm + bn) * (k_chunk if par else K), par, bn))
    _, parallel, bn = min(options)
    return bn, parallel


# A 128x256 (tile, chunk) item's time over that of the two 128x128 items it replaces (H200, o at M 16384:
# 1.22-1.26x cuBLAS -> 1.12-1.18x).
WIDE_PAIR_COST = 0.93
SMEM_PER_SM = 233472  # bytes of shared memory per SM (H100/H200); each resident program also reserves 1 KB
MAX_DECODE_STAGES = 6


def _fit_stages(tiles, bm, bn, unroll, sms):
    """DECODE_NUM_STAGES = 0: the deepest pipeline (<= MAX_DECODE_STAGES) among those whose programs fit on the
    SMs in the fewest waves (shared memory decides how many 4-warp programs an SM holds; schedule only)."""
    stage = (bm + bn) * KNOBS["BLOCK_K"] * 2 * unroll  # bf16 x and W tiles of one pipeline stage
    return min(range(2, MAX_DECODE_STAGES + 1),
               key=lambda s: (cdiv(tiles, sms * max(1, SMEM_PER_SM // (s * stage + 1024))), -s))


def _schedule(M, N, K, path, sms=132, write32=False, tma=True):
    """Tiles, warps, stages, unrolling and chunk execution of one launch (schedule only: no bits depend on it).
    `write32`: the launch also stores the fp32 output; `tma`: its operands can be loaded by TMA."""
    k_chunk = _k_chunk(K)
    n_chunks = cdiv(K, k_chunk) if k_chunk else 1
    split_max_m = KNOBS["DECODE_SPLIT_MAX_M"] if path == "DECODE" else 0
    parallel = n_chunks > 1 and KNOBS[path + "_SPLIT_PARALLEL"] and (split_max_m == 0 or split_max_m >= M)
    src = path
    if path == "DECODE" and 0 < KNOBS["DECODE_FULL_TILES_M"] <= M:
        # A decode batch big enough to be a GEMM takes the full path's tiles, warps and stages, when they
        # still make DECODE_FULL_TILES_MIN_PROGRAMS programs (parallel K chunks count).
        programs = cdiv(M, KNOBS["FULL_BLOCK_M"]) * cdiv(N, KNOBS["FULL_BLOCK_N"])
        if programs * (n_chunks if parallel else 1) >= KNOBS["DECODE_FULL_TILES_MIN_PROGRAMS"]:
            src = "FULL"
    sch = {"bm": KNOBS[src + "_BLOCK_M"], "bn": KNOBS[src + "_BLOCK_N"], "group_m": KNOBS[src + "_GROUP_M"],
           "warps": KNOBS[src + "_NUM_WARPS"], "stages": KNOBS[src + "_NUM_STAGES"],
           "unroll": KNOBS["DECODE_K_UNROLL"] if src == "DECODE" else 1}
    short_k = path == "FULL" and KNOBS["FULL_SHORT_K"] > K
    # Unsplit full-path launches may take a larger tile (one accumulator: 128 fp32 registers per thread at
    # 8 warps; with a chunk total beside it, it spills): fewer bytes from L2 per output, one program per SM.
    # Only with TMA: the pointer kernel (transposed operands of the backward) is neither persistent nor stores
    # in halves, and a 128x256 tile of it would not fit in shared memory.
    # With FULL_CHUNKED_WIDE, persistent (tile, chunk) items take it too, their chunk total beside the
    # accumulator (sm_90a: an 88-byte spill at 128x256); "auto" only where the wide tiles' rounds over the SMs,
    # each costing 2 * WIDE_PAIR_COST narrow rounds, take no longer than the narrow tiles' (o at M 4096:
    # 3 rounds of 1.86 against 5 of 1, narrow; at M 16384: 10 of 1.86 against 20, wide).
    items = (path == "FULL" and n_chunks > 1 and KNOBS["FULL_CHUNKED_WIDE"] != "off" and not parallel
             and n_chunks <= KNOBS["FULL_PERSISTENT_MAX_CHUNKS"] and K % k_chunk == 0)
    if items and KNOBS["FULL_CHUNKED_WIDE"] == "auto":
        narrow = cdiv(M, sch["bm"]) * cdiv(N, sch["bn"])
        items = 2 * WIDE_PAIR_COST * cdiv(cdiv(narrow, 2), sms) <= cdiv(narrow, sms)
    wide = path == "FULL" and (n_chunks == 1 or items) and KNOBS["FULL_UNSPLIT_TILE"] != "same" and tma
    if wide:
        bm, bn = (int(v) for v in KNOBS["FULL_UNSPLIT_TILE"].split("x"))
        # The fp32 output's half-tile staging (64 KB) does not fit beside four stages: three then.
        sch.update(bm=bm, bn=bn, warps=8, stages=min(KNOBS["FULL_UNSPLIT_NUM_STAGES"], 3 if write32 else 4))
    elif short_k:
        # Short reductions: a shallower pipeline leaves shared memory for two tiles per SM, which hide each
        # other's prologue and epilogue; long ones want the deep pipeline (one tile per SM).
        sch["stages"] = KNOBS["FULL_SHORT_K_NUM_STAGES"]
    if path == "DECODE" and KNOBS["DECODE_SMALL_M"] >= M:
        # GEMV-like launches get their own schedule (tl.dot's bits do not follow the tile, warps or stages).
        sch.update(bm=max(16, pow2(M)), bn=KNOBS["DECODE_SMALL_BLOCK_N"],
                   unroll=KNOBS["DECODE_SMALL_K_UNROLL"], warps=KNOBS["DECODE_SMALL_NUM_WARPS"],
                   stages=KNOBS["DECODE_SMALL_NUM_STAGES"])
    if path == "DECODE" and src == "DECODE" and KNOBS["DECODE_SMALL_M"] < M and sch["bn"] == 0:
        sch["bn"], parallel = _auto_tiles(M, N, K, sch["bm"], k_chunk, n_chunks, parallel,
                                          KNOBS["DECODE_SPLIT_MAX_TILES"], sms)
    elif parallel and path == "DECODE" and KNOBS["DECODE_SPLIT_MAX_TILES"]:
        # A launch with tiles enough to fill the GPU gains nothing from parallel chunks but pays their merge.
        tiles = cdiv(M, sch["bm"]) * cdiv(N, sch["bn"])
        parallel = tiles <= KNOBS["DECODE_SPLIT_MAX_TILES"]
    if path == "DECODE" and src == "DECODE" and KNOBS["DECODE_SMALL_M"] < M and sch["stages"] == 0:
        tiles = cdiv(M, sch["bm"]) * cdiv(N, sch["bn"]) * (n_chunks if parallel else 1)
        sch["stages"] = _fit_stages(tiles, sch["bm"], sch["bn"], sch["unroll"], sms)
    flat = not parallel and n_chunks > 1 and KNOBS[path + "_CHUNK_LOOP"] == "flat"
    if flat:
        sch["unroll"] = 1  # the flat loop folds chunk by chunk, tile by tile
    # Persistent programs (full path, K chunks in-program, at most FULL_PERSISTENT_MAX_CHUNKS of them; as many
    # programs as fit at once: two per SM with the short-K pipeline).
    in_program = n_chunks == 1 or (not parallel and n_chunks <= KNOBS["FULL_PERSISTENT_MAX_CHUNKS"]
                                   and K % k_chunk == 0)  # equal chunks: the item loop's K bounds are fixed
    persistent = path == "FULL" and in_program and (wide or {"off": False, "long_k": not short_k,
                                                             "all": True}[KNOBS["FULL_PERSISTENT"]])
    return {**sch, "k_chunk": k_chunk, "n_chunks": n_chunks, "parallel": parallel, "flat": flat,
            "persistent_per_sm": (2 if short_k and not wide else 1) if persistent else 0}


def _launch(x, weight, bias, out, out32, path):
    """out[m, n] = sum_k x[m, k] * weight[n, k] (+ bias[n]); any strides (the backward passes transposes)."""
    M, K = x.shape
    N = weight.shape[0]
    sms = _sms(x.device)
    use_tma = KNOBS[path + "_USE_TMA"] and _tma_ok(x, weight)
    sch = _schedule(M, N, K, path, sms, out32 is not None, use_tma)
    block_k, k_chunk, bm, bn = KNOBS["BLOCK_K"], sch["k_chunk"], sch["bm"], sch["bn"]
    has_bias, write32 = bias is not None, out32 is not None
    b = bias if has_bias else out
    even_k = K % block_k == 0 and k_chunk % block_k == 0
    tiles = cdiv(M, bm) * cdiv(N, bn)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k, GROUP_M=sch["group_m"], EVEN_K=even_k, USE_TMA=use_tma,
                UNROLL=sch["unroll"], num_warps=sch["warps"], num_stages=sch["stages"])
    if sch["persistent_per_sm"] and use_tma:
        programs = min(tiles, sch["persistent_per_sm"] * sms)
        fast(_linear_persistent_kernel)[(programs,)](
            x, weight, b, out, out32 if write32 else out, M, N, K, x.stride(0), weight.stride(0),
            out.stride(0), out.stride(1), HAS_BIAS=has_bias, WRITE32=write32, BLOCK_M=bm, BLOCK_N=bn,
            BLOCK_K=block_k, GROUP_M=sch["group_m"], K_CHUNK=k_chunk if sch["n_chunks"] > 1 else 0,
            N_CHUNKS=sch["n_chunks"],
            num_warps=sch["warps"], num_stages=sch["stages"])
        return
    if sch["parallel"]:
        ws = torch.empty((sch["n_chunks"], M, N), dtype=torch.float32, device=x.device)
        fast(_linear_chunk_kernel)[(tiles, sch["n_chunks"])](
            x, weight, ws, M, N, K, x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            K_CHUNK=k_chunk, **meta)
        block = 1024
        fast(_linear_merge_kernel)[(cdiv(M * N, block),)](
            ws, b, out, out32 if write32 else ws, M, N, sch["n_chunks"], out.stride(0), out.stride(1),
            HAS_BIAS=has_bias, WRITE32=write32, BLOCK=block, num_warps=4)
        return
    fast(_linear_kernel)[(tiles,)](
        x, weight, b, out, out32 if write32 else out, M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        K_CHUNK=k_chunk, N_CHUNKS=sch["n_chunks"], HAS_BIAS=has_bias, WRITE32=write32, FLAT_CHUNKS=sch["flat"],
        **meta)


def linear_full(x: torch.Tensor, weight: torch.Tensor, bias, out: torch.Tensor,
                out32: torch.Tensor | None = None) -> None:
    """Every token of a packed batch: x [tokens, K], weight [N, K], bias [N] or None -> out [tokens, N]."""
    _launch(x, weight, bias, out, out32, "FULL")


def linear_decode(x: torch.Tensor, weight: torch.Tensor, bias, out: torch.Tensor,
                  out32: torch.Tensor | None = None) -> None:
    """One token per sequence: x [batch, K]; same per-element numerics as linear_full."""
    _launch(x, weight, bias, out, out32, "DECODE")


def _grouped_tile(path, K):
    """(BLOCK_M, BLOCK_N, stages) of a grouped launch of the path: its own knobs, else the path's tile. A weight
    whose K chunks fold keeps two accumulators live, so its tile is at most 128 x 128 (larger ones spill)."""
    bm = KNOBS[path + "_GROUPED_BLOCK_M"] or KNOBS[path + "_BLOCK_M"]
    bn = KNOBS[path + "_GROUPED_BLOCK_N"] or KNOBS[path + "_BLOCK_N"] or 64
    k_chunk = _k_chunk(K)
    if k_chunk and k_chunk < K and bm * bn > 128 * 128:
        bm, bn = KNOBS[path + "_BLOCK_M"], min(KNOBS[path + "_BLOCK_N"] or 64, 128 * 128 // KNOBS[path + "_BLOCK_M"])
    return bm, bn, KNOBS[path + "_GROUPED_NUM_STAGES"]


def _launch_grouped(x, weights, starts, out, out32, path):
    T, K = x.shape
    E, N = weights.shape[0], weights.shape[1]
    if weights.dim() != 3 or weights.shape[2] != K or starts.numel() != E + 1 or out.shape != (T, N):
        raise ValueError(f"linear_grouped: x [T, K] = {list(x.shape)}, weights [E, N, K] = {list(weights.shape)}, "
                         f"starts [E + 1] = {list(starts.shape)}, out [T, N] = {list(out.shape)} do not agree")
    k_chunk = _k_chunk(K)
    bm, bn, stages = _grouped_tile(path, K)
    starts = starts.to(torch.int32)
    even_k = K % KNOBS["BLOCK_K"] == 0 and k_chunk % KNOBS["BLOCK_K"] == 0
    write32 = out32 is not None
    if T == 0:
        return
    # The most row tiles any split of T rows over E experts can make; spare programs exit at once.
    fast(_linear_grouped_kernel)[(cdiv(T, bm) + E, cdiv(N, bn))](
        x, weights, out, out32 if write32 else out, starts, E, T, N, K, x.stride(0), x.stride(1),
        weights.stride(0), weights.stride(1), weights.stride(2), out.stride(0), out.stride(1), K_CHUNK=k_chunk,
        WRITE32=write32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=KNOBS["BLOCK_K"], EVEN_K=even_k,
        E_PAD=pow2(E), USE_TMA=KNOBS[path + "_USE_TMA"] and (weights.stride(0) * 2) % 16 == 0
        and _tma_ok(x, weights[0]),
        num_warps=KNOBS[path + "_NUM_WARPS"],
        num_stages=stages)


def linear_grouped_full(x: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor, out: torch.Tensor,
                        out32: torch.Tensor | None = None) -> None:
    """Several weights in one launch (an MoE layer's experts): rows starts[e]:starts[e + 1] of x (sorted by
    expert) go through weights[e] ([E, N, K]); each row gets linear_full's bits for its weight."""
    _launch_grouped(x, weights, starts, out, out32, "FULL")


def linear_grouped_decode(x: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor, out: torch.Tensor,
                          out32: torch.Tensor | None = None) -> None:
    """linear_grouped_full with the decode path's tiles; the same bits."""
    _launch_grouped(x, weights, starts, out, out32, "DECODE")


def linear_grouped_backward(x: torch.Tensor, weights: torch.Tensor, starts: torch.Tensor, grad_out: torch.Tensor,
                            grad_x: torch.Tensor, grad_weights: torch.Tensor) -> None:
    """Gradients of the grouped launch: dX = dY @ W[e] for each expert's rows (the grouped kernel on the weights'
    transposed view), dW[e] = dY[rows]^T @ X[rows] (zeros for an expert without rows); checked by tolerance."""
    T, K = x.shape
    E, N = weights.shape[0], weights.shape[1]
    if grad_out.shape != (T, N) or grad_x.shape != (T, K) or grad_weights.shape != weights.shape:
        raise ValueError(f"linear_grouped_backward: x {list(x.shape)}, weights {list(weights.shape)}, grad_out "
                         f"{list(grad_out.shape)}, grad_x {list(grad_x.shape)}, grad_weights "
                         f"{list(grad_weights.shape)} do not agree")
    _launch_grouped(grad_out, weights.transpose(1, 2), starts, grad_x, None, "FULL")
    bn, bk, br, warps, stages = DW_TILE
    grid = (E, cdiv(N, bn) * cdiv(K, bk))
    if DW_KERNEL == "tma" and grad_weights.stride(2) == 1 and _tma_ok(grad_out, x):
        fast(_linear_grouped_dw_tma_kernel)[grid](
            grad_out, x, grad_weights, starts.to(torch.int32), N, K, grad_out.stride(0), x.stride(0),
            grad_weights.stride(0), grad_weights.stride(1), BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, num_warps=warps,
            num_stages=stages)
        return
    fast(_linear_grouped_dw_kernel)[grid](
        grad_out, x, grad_weights, starts.to(torch.int32), N, K, grad_out.stride(0), grad_out.stride(1),
        x.stride(0), x.stride(1), grad_weights.stride(0), grad_weights.stride(1), grad_weights.stride(2),
        BLOCK_N=bn, BLOCK_K=bk, BLOCK_R=br, num_warps=warps, num_stages=stages)


# The dense backward's (BLOCK_P, BLOCK_Q, BLOCK_R, GROUP_P, warps, stages, least rows of R per split). Backward
# only, so not a knob (no bits depend on it, and the audit times the forward); tik-evo bench linear-backward
# times alternatives. BWD_KERNEL "transposed" runs the forward kernel on transposed views instead (pointer loads).
BWD_TILE = (128, 256, 64, 8, 8, 3, 1024)
BWD_KERNEL = "dedicated"


@triton.jit(do_not_specialize=["P", "R"])
def _linear_bwd_kernel(a_ptr, b_ptr, c_ptr, ws_ptr, P, Q, R, sa, sb, sc, r_split,
                       A_T: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_R: tl.constexpr, GROUP_P: tl.constexpr):
    # C[p, q] = sum_r A[p, r] * B[r, q] for the two backward GEMMs, every operand read through TMA from its
    # row-major storage: A is [P, R] (dX = dY @ W), or [R, P] and transposed in shared memory (dW = dY^T @ X);
    # B is [R, Q]. Persistent over (tile, split) items; TMA pads reads past R with zeros, so every item runs the
    # same r_split loop (one pipeline). SPLIT > 1 (outputs too few to fill the GPU) stores fp32 partials, summed
    # by the caller. Checked by tolerance only: no bitwise contract on gradients.
    if A_T:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[R, P], strides=[sa, 1], block_shape=[BLOCK_R, BLOCK_P])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[P, R], strides=[sa, 1], block_shape=[BLOCK_P, BLOCK_R])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[R, Q], strides=[sb, 1], block_shape=[BLOCK_R, BLOCK_Q])
    items = tl.cdiv(P, BLOCK_P) * tl.cdiv(Q, BLOCK_Q) * SPLIT
    for item in tl.range(tl.program_id(0), items, tl.num_programs(0), flatten=True):
        pid_p, pid_q = _tile_ids(item // SPLIT, P, Q, BLOCK_P, BLOCK_Q, GROUP_P)
        r_lo = (item % SPLIT) * r_split
        acc = tl.zeros([BLOCK_P, BLOCK_Q], dtype=tl.float32)
        for rr in range(0, r_split, BLOCK_R):
            if A_T:
                a = a_desc.load([r_lo + rr, pid_p * BLOCK_P]).T
            else:
                a = a_desc.load([pid_p * BLOCK_P, r_lo + rr])
            acc = tl.dot(a, b_desc.load([r_lo + rr, pid_q * BLOCK_Q]), acc)
        rows = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        cols = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        mask = (rows[:, None] < P) & (cols[None, :] < Q)
        r = rows.to(tl.int64)[:, None]
        if SPLIT == 1:
            tl.store(c_ptr + r * sc + cols[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            ws_rows = (rows + (item % SPLIT) * P).to(tl.int64)[:, None]  # ws is [SPLIT * P, Q]
            tl.store(ws_ptr + ws_rows * Q + cols[None, :], acc, mask=mask)


def _bwd_schedule(P, Q, R, sms):
    """(BLOCK_P, BLOCK_Q, splits, rows of R per split) of a backward GEMM (schedule only)."""
    bp, bq, br, _, _, _, min_split_r = BWD_TILE
    # Split the reduction only when the output tiles leave SMs idle and each split keeps min_split_r rows.
    split = max(1, min(sms // (cdiv(P, bp) * cdiv(Q, bq)), R // min_split_r))
    if split > 1:  # fp32 partials: a 128x256 fp32 tile's store would not fit in shared memory beside the pipeline
        bp, bq = min(bp, 128), min(bq, 128)
        split = max(1, min(sms // (cdiv(P, bp) * cdiv(Q, bq)), R // min_split_r))
    r_split = cdiv(cdiv(R, split), br) * br
    return bp, bq, cdiv(R, r_split), r_split


def _bwd_gemm(a, b, c, a_t):
    """c = a @ b (a_t: c = a^T @ b) for row-major a, b, c, by _linear_bwd_kernel."""
    P, R = (a.shape[1], a.shape[0]) if a_t else a.shape
    Q = b.shape[1]
    if P == 0 or Q == 0:
        return
    if R == 0:
        c.zero_()
        return
    sms = _sms(a.device)
    bp, bq, split, r_split = _bwd_schedule(P, Q, R, sms)
    _, _, br, group, warps, stages, _ = BWD_TILE
    ws = torch.empty((split, P, Q), dtype=torch.float32, device=a.device) if split > 1 else c
    fast(_linear_bwd_kernel)[(min(cdiv(P, bp) * cdiv(Q, bq) * split, sms),)](
        a, b, c, ws, P, Q, R, a.stride(0), b.stride(0), c.stride(0), r_split, A_T=a_t, SPLIT=split,
        BLOCK_P=bp, BLOCK_Q=bq, BLOCK_R=br, GROUP_P=group, num_warps=warps, num_stages=stages)
    if split > 1:
        c.copy_(ws.sum(0))


def linear_backward(x: torch.Tensor, weight: torch.Tensor, grad_out: torch.Tensor, grad_x: torch.Tensor,
                    grad_weight: torch.Tensor, grad_bias: torch.Tensor | None = None) -> None:
    """Gradients of y = x @ W^T + b: dX = dY @ W and dW = dY^T @ X (checked by tolerance, not bit-exact)."""
    dedicated = BWD_KERNEL == "dedicated" and _tma_ok(x, weight, grad_out, grad_x, grad_weight)
    if dedicated:
        _bwd_gemm(grad_out, weight, grad_x, False)
        _bwd_gemm(grad_out, x, grad_weight, True)
    else:  # the forward kernel on transposed views
        _launch(grad_out, weight.t(), None, grad_x, None, "FULL")
        _launch(grad_out.t(), x.t(), None, grad_weight, None, "FULL")
    if grad_bias is not None:
        grad_bias.copy_(grad_out.float().sum(0))
