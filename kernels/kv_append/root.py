"""Unified KV-cache append: write new K/V rows into a paged cache at per-sequence absolute positions.

The cache is [num_pages, page_size, kv_heads, head_dim] for K and for V (a contiguous per-sequence cache
is the special case of one page per sequence, page_size = max length). A token at absolute position p
of sequence b goes to page block_table[b, p // page_size], row p % page_size. Both entry points call one
@triton.jit row copy, so the cache bytes are identical whichever path wrote a token; the copy is exact
(cache dtype = activation dtype). The full path writes a packed prompt (sequence b's tokens
cu_seqlens[b]:cu_seqlens[b+1] at positions start_pos[b]...); decode writes one token per sequence. A third entry
point, `kv_append_slots`, takes vLLM's slot mapping instead of the block table: token i goes to flat cache row
slot_mapping[i] (= page * page_size + row in the page; negative: a padding token, not written).
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
    "FULL_TOKENS_PER_PROGRAM": 8,
    "FULL_NUM_WARPS": 4,
    "DECODE_TOKENS_PER_PROGRAM": 1,
    "DECODE_NUM_WARPS": 4,
}


@triton.jit
def _append_tile(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, src_rows, seqs, pos, valid, bt_stride, page_size, W,
                 BLOCK_W: tl.constexpr):
    # A tile of tokens: each token's K and V (kv_heads * head_dim contiguous values) into its cache slot.
    page = tl.load(bt_ptr + seqs * bt_stride + pos // page_size, mask=valid, other=0).to(tl.int64)
    _copy_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, src_rows * W, page * page_size + pos % page_size, valid, W, BLOCK_W)


@triton.jit
def _copy_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, src, slot, valid, W, BLOCK_W: tl.constexpr):
    # Tokens' K and V (W contiguous values each, from offsets src) into cache rows slot: every path's copy.
    cols = tl.arange(0, BLOCK_W)
    for off in range(0, W, BLOCK_W):
        c = off + cols
        m = valid[:, None] & (c < W)[None, :]
        s_off = src[:, None] + c[None, :]
        dst = slot[:, None] * W + c[None, :]
        tl.store(kc_ptr + dst, tl.load(k_ptr + s_off, mask=m), mask=m)
        tl.store(vc_ptr + dst, tl.load(v_ptr + s_off, mask=m), mask=m)


@triton.jit
def _append_full_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, cu_ptr, start_ptr, bt_stride, page_size, W,
                        TOKENS_PER_PROGRAM: tl.constexpr, BLOCK_W: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * TOKENS_PER_PROGRAM + tl.arange(0, TOKENS_PER_PROGRAM).to(tl.int64)
    lo = tl.load(cu_ptr + seq).to(tl.int64)
    n = tl.load(cu_ptr + seq + 1).to(tl.int64) - lo
    start = tl.load(start_ptr + seq).to(tl.int64)
    _append_tile(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, lo + t, seq + 0 * t, start + t, t < n, bt_stride,
                 page_size, W, BLOCK_W)


@triton.jit
def _append_decode_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, pos_ptr, n_seqs, bt_stride, page_size, W,
                          TOKENS_PER_PROGRAM: tl.constexpr, BLOCK_W: tl.constexpr):
    seqs = tl.program_id(0) * TOKENS_PER_PROGRAM + tl.arange(0, TOKENS_PER_PROGRAM).to(tl.int64)
    valid = seqs < n_seqs
    pos = tl.load(pos_ptr + seqs, mask=valid, other=0).to(tl.int64)
    _append_tile(k_ptr, v_ptr, kc_ptr, vc_ptr, bt_ptr, seqs, seqs, pos, valid, bt_stride, page_size, W, BLOCK_W)


@triton.jit
def _append_slots_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, n_tokens, row_stride, W,
                         TOKENS_PER_PROGRAM: tl.constexpr, BLOCK_W: tl.constexpr):
    # Token rows row_stride apart (K and V may be views of a fused QKV output), each to its flat cache row.
    t = tl.program_id(0) * TOKENS_PER_PROGRAM + tl.arange(0, TOKENS_PER_PROGRAM).to(tl.int64)
    in_range = t < n_tokens
    slot = tl.load(slot_ptr + t, mask=in_range, other=-1).to(tl.int64)
    _copy_rows(k_ptr, v_ptr, kc_ptr, vc_ptr, t * row_stride, slot, in_range & (slot >= 0), W, BLOCK_W)


def _block_w(width: int) -> int:
    return min(pow2(width), 1024)


def kv_append_full(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_table: torch.Tensor, cu_seqlens: torch.Tensor, start_pos: torch.Tensor,
                   max_seqlen: int) -> None:
    """Packed prompt: k, v [tokens, kv_heads, head_dim]; sequence b's tokens cu_seqlens[b]:cu_seqlens[b+1]
    go to absolute positions start_pos[b], start_pos[b]+1, ...; block_table [batch, max_pages] (int32)."""
    n_seqs = cu_seqlens.numel() - 1
    page_size = k_cache.shape[1]
    W = k_cache.shape[2] * k_cache.shape[3]
    tpp = KNOBS["FULL_TOKENS_PER_PROGRAM"]
    grid = (n_seqs, cdiv(max(max_seqlen, 1), tpp))
    fast(_append_full_kernel)[grid](k, v, k_cache, v_cache, block_table, cu_seqlens, start_pos, block_table.stride(0),
                              page_size, W, TOKENS_PER_PROGRAM=tpp, BLOCK_W=_block_w(W),
                              num_warps=KNOBS["FULL_NUM_WARPS"])


def kv_append_decode(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, positions: torch.Tensor) -> None:
    """One token per sequence: k, v [batch, kv_heads, head_dim] to absolute positions[b] of sequence b."""
    n_seqs = k.shape[0]
    page_size = k_cache.shape[1]
    W = k_cache.shape[2] * k_cache.shape[3]
    tpp = KNOBS["DECODE_TOKENS_PER_PROGRAM"]
    fast(_append_decode_kernel)[(cdiv(n_seqs, tpp),)](
        k, v, k_cache, v_cache, block_table, positions, n_seqs, block_table.stride(0), page_size, W,
        TOKENS_PER_PROGRAM=tpp, BLOCK_W=_block_w(W), num_warps=KNOBS["DECODE_NUM_WARPS"])


def _row_dense(t: torch.Tensor) -> bool:
    """Each row's [kv_heads, head_dim] values contiguous; a dimension of size 1 may have any stride (one KV head per
    GPU under tensor parallelism gives views whose head stride is arbitrary)."""
    return all(size == 1 or stride == want for size, stride, want in zip(t.shape[1:], t.stride()[1:], (t.shape[2], 1)))


def kv_append_slots(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """vLLM's slot mapping: token i of k, v [tokens, kv_heads, head_dim] to flat row slot_mapping[i] of the caches
    (row p % page_size of page p // page_size is flat row page * page_size + p % page_size); a negative slot is a
    padding token and writes nothing. slot_mapping is int32 or int64 [tokens]. k and v may be row views of a fused
    projection (rows any equal stride apart; each row's kv_heads * head_dim values contiguous). The same copy as the
    other paths, so the same cache bytes. An engine passes every token of a step in one call (prompt chunks and
    decode tokens alike): scheduled as the full path's packed tokens, by the FULL_* knobs."""
    T = k.shape[0]
    hk, d = k_cache.shape[2:]
    W = hk * d
    problems = []
    if k.dim() != 3 or k.shape[1:] != (hk, d) or v.shape != k.shape or not (_row_dense(k) and _row_dense(v)) \
            or (T > 1 and v.stride(0) != k.stride(0)) or k.dtype != k_cache.dtype or v.dtype != k_cache.dtype:
        problems.append(f"k {k.dtype} {tuple(k.shape)} strides {k.stride()}, v {v.dtype} {tuple(v.shape)} strides "
                        f"{v.stride()}: expected [tokens, {hk}, {d}] {k_cache.dtype} rows of contiguous values, the "
                        "same row stride for both")
    if v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        problems.append(f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}: expected two contiguous "
                        "[num_pages, page_size, kv_heads, head_dim] of one shape")
    if slot_mapping.dtype not in (torch.int32, torch.int64) or tuple(slot_mapping.shape) != (T,) \
            or not slot_mapping.is_contiguous():
        problems.append(f"slot_mapping {slot_mapping.dtype} {tuple(slot_mapping.shape)}: expected contiguous int32 "
                        f"or int64 [{T}]")
    if problems:
        raise ValueError("kv_append_slots: " + "; ".join(problems))
    if T == 0:
        return
    tpp = KNOBS["FULL_TOKENS_PER_PROGRAM"]
    fast(_append_slots_kernel)[(cdiv(T, tpp),)](
        k, v, k_cache, v_cache, slot_mapping, T, k.stride(0), W, TOKENS_PER_PROGRAM=tpp, BLOCK_W=_block_w(W),
        num_warps=KNOBS["FULL_NUM_WARPS"])
