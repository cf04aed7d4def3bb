"""Unified NeoX RoPE (rotate halves) for q and k: bf16 in/out, fp32 math, one fp32 cos/sin table.

cos/sin are rows of one fp32 table [max_position, head_dim // 2] indexed by each token's absolute
position, so a token's result depends only on its own values and position. Both entry points call the
same @triton.jit rotation helper with its FMAs written out, so contraction and casts match whatever code
surrounds it; the paths differ only in how many tokens one program handles, how many programs share a
token's heads, the order loads are issued in, warps and pipelining. `rope_backward` is the same kernel run
as the inverse rotation (sin negated).

COS_SIN="sincos" (contract) computes cos/sin in the kernel from the position and the fp64 inverse
frequencies (`inv_freq`) instead of gathering table rows: the fp64 angle pos * inv_freq (the table's own
angle), an fp64 Cody-Waite reduction by pi/2, fp32 polynomials; ~1-2 fp32 ulp from the table's values. It
removes the dependent position -> table load; both paths run the same helper, so they stay bitwise.
LOAD_ORDER="early" issues every q and k load of a token before the table lookup (which must wait for the
position) and before any store: one memory round trip instead of three.

`rows=(cos_rows, sin_rows)` (fp32 [tokens, head_dim // 2], exactly cos[positions] and sin[positions]:
`gather_rows`) hands every entry point its tokens' rows already gathered, as HF's `position_embeddings` are:
a model gathers them once per forward or decode step and every layer reuses them, so the kernel drops the
dependent position -> table load. The kernel reads row `tok` instead of row `positions[tok]` (a constexpr
switch); the values and every operation after the load are the table path's, so are the bits.
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
    "ROUND_TABLE_TO_BF16": False,
    "COS_SIN": "table",
    "FULL_TOKENS_PER_PROGRAM": 1,
    "FULL_NUM_WARPS": 4,
    "FULL_NUM_STAGES": 1,
    "FULL_LOAD_ORDER": "early",
    "FULL_HEAD_SPLIT": 1,
    "DECODE_TOKENS_PER_PROGRAM": 1,
    "DECODE_NUM_WARPS": 2,
    "DECODE_NUM_STAGES": 1,
    "DECODE_LOAD_ORDER": "early",
    "DECODE_HEAD_SPLIT": 0,
}


@triton.jit
def _rotate(x1, x2, c, s):
    # NeoX: out[:half] = x1*cos - x2*sin, out[half:] = x2*cos + x1*sin (all fp32), each one explicit FMA over
    # one rounded product. Written as a*b - c*d the compiler may fuse either product, and its pick followed the
    # order the loads were issued in (FULL_LOAD_ORDER "serial" changed 140 of 1536 fp32 values on an H100).
    return tl.fma(x1, c, -(x2 * s)), tl.fma(x2, c, x1 * s)


@triton.jit
def _cos_sin(pos, inv_ptr, cols, HALF):
    """cos/sin of the fp64 angle pos * inv_freq[cols] as fp32 (explicit FMAs: no contraction choices left)."""
    inv = tl.load(inv_ptr + cols, mask=cols < HALF, other=0.0)
    a = pos.to(tl.float64) * inv  # the same fp64 product the table is built from
    # k = round(a / (pi/2)); r = a - k*pi/2 with pi/2 = P1 + P2 (P1 has 30 bits: k*P1 is exact, so is a - k*P1).
    k = tl.floor(tl.fma(a, tl.full([], 0.6366197723675814, tl.float64), tl.full([], 0.5, tl.float64)))
    r = tl.fma(-k, tl.full([], 1.570796325802803, tl.float64), a)
    r = tl.fma(-k, tl.full([], 9.920935796805404e-10, tl.float64), r).to(tl.float32)
    quad = k.to(tl.int32) & 3
    r2 = r * r
    # Taylor to r^9 / r^10 on |r| <= pi/4: truncation below 2e-9, under half an fp32 ulp of the result.
    ps = tl.fma(r2, 2.7557319223985893e-06, -1.984126984126984e-04)
    ps = tl.fma(r2, ps, 8.333333333333333e-03)
    ps = tl.fma(r2, ps, -1.6666666666666666e-01)
    sr = tl.fma(r * r2, ps, r)
    pc = tl.fma(r2, -2.755731922398589e-07, 2.48015873015873e-05)
    pc = tl.fma(r2, pc, -1.388888888888889e-03)
    pc = tl.fma(r2, pc, 4.1666666666666664e-02)
    pc = tl.fma(r2, pc, -0.5)
    cr = tl.fma(r2, pc, 1.0)
    # sin(r + quad*pi/2), cos(r + quad*pi/2)
    c = tl.where(quad == 0, cr, tl.where(quad == 1, -sr, tl.where(quad == 2, -cr, sr)))
    s = tl.where(quad == 0, sr, tl.where(quad == 1, cr, tl.where(quad == 2, -sr, -cr)))
    return c, s


@triton.jit
def _head_tile(tok, n_heads, head0, HALF, BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Offsets and mask of heads [head0, head0 + BLOCK_HEADS) of one token."""
    heads = head0 + tl.arange(0, BLOCK_HEADS)
    cols = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (cols < HALF)[None, :]
    offs = tok.to(tl.int64) * n_heads * 2 * HALF + heads[:, None] * 2 * HALF + cols[None, :]
    return offs, mask


@triton.jit
def _store_heads(y_ptr, y32_ptr, offs, mask, x1, x2, c, s, HALF, WRITE32: tl.constexpr):
    o1, o2 = _rotate(x1, x2, c[None, :], s[None, :])
    tl.store(y_ptr + offs, o1.to(tl.bfloat16), mask=mask)
    tl.store(y_ptr + offs + HALF, o2.to(tl.bfloat16), mask=mask)
    if WRITE32:
        tl.store(y32_ptr + offs, o1, mask=mask)
        tl.store(y32_ptr + offs + HALF, o2, mask=mask)


@triton.jit
def _rope_heads(x_ptr, y_ptr, y32_ptr, tok, n_heads, c, s, HALF,
                BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr, WRITE32: tl.constexpr):
    """Load, rotate and store all heads of one token (loads after cos/sin, in program order)."""
    offs, mask = _head_tile(tok, n_heads, 0, HALF, BLOCK_HEADS, BLOCK_HALF)
    x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    _store_heads(y_ptr, y32_ptr, offs, mask, x1, x2, c, s, HALF, WRITE32)


@triton.jit
def _cos_sin_of(pos, cos_ptr, sin_ptr, inv_ptr, cols, HALF,
                SINCOS: tl.constexpr, ROUND_TABLE: tl.constexpr, INVERSE: tl.constexpr):
    if SINCOS:
        c, s = _cos_sin(pos, inv_ptr, cols, HALF)
    else:
        c = tl.load(cos_ptr + pos * HALF + cols, mask=cols < HALF, other=0.0)
        s = tl.load(sin_ptr + pos * HALF + cols, mask=cols < HALF, other=0.0)
    if ROUND_TABLE:  # the HF order: the table cast to the activation dtype first
        c = c.to(tl.bfloat16).to(tl.float32)
        s = s.to(tl.bfloat16).to(tl.float32)
    if INVERSE:
        s = -s
    return c, s


@triton.jit
def _row_of(tok, pos_ptr, ROWS: tl.constexpr):
    """The cos/sin row of token `tok`: its position's table row, or row `tok` of pre-gathered rows."""
    if ROWS:
        row = tok.to(tl.int64)
    else:
        row = tl.load(pos_ptr + tok).to(tl.int64)
    return row


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, inv_ptr, qo_ptr, ko_ptr, q32_ptr, k32_ptr,
                 n_tokens, n_q_heads, n_k_heads, HALF,
                 TOKENS_PER_PROGRAM: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, ROUND_TABLE: tl.constexpr, INVERSE: tl.constexpr,
                 WRITE32: tl.constexpr, SINCOS: tl.constexpr, EARLY_LOADS: tl.constexpr,
                 HEAD_SPLIT: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_HALF)
    for i in range(TOKENS_PER_PROGRAM):
        tok = pid * TOKENS_PER_PROGRAM + i
        if tok < n_tokens:
            if EARLY_LOADS or HEAD_SPLIT > 1:
                # Position first, then every q/k load (independent of it), then cos/sin, which wait on it
                # (with pre-gathered rows the row is tok: nothing to wait on).
                pos = _row_of(tok, pos_ptr, ROWS)
                if HEAD_SPLIT > 1:
                    part = tl.program_id(1)
                    q_offs, q_mask = _head_tile(tok, n_q_heads, part * BLOCK_QH, HALF, BLOCK_QH, BLOCK_HALF)
                    k_offs, k_mask = _head_tile(tok, n_k_heads, part * BLOCK_KH, HALF, BLOCK_KH, BLOCK_HALF)
                else:
                    q_offs, q_mask = _head_tile(tok, n_q_heads, 0, HALF, BLOCK_QH, BLOCK_HALF)
                    k_offs, k_mask = _head_tile(tok, n_k_heads, 0, HALF, BLOCK_KH, BLOCK_HALF)
                q1 = tl.load(q_ptr + q_offs, mask=q_mask, other=0.0).to(tl.float32)
                q2 = tl.load(q_ptr + q_offs + HALF, mask=q_mask, other=0.0).to(tl.float32)
                k1 = tl.load(k_ptr + k_offs, mask=k_mask, other=0.0).to(tl.float32)
                k2 = tl.load(k_ptr + k_offs + HALF, mask=k_mask, other=0.0).to(tl.float32)
                c, s = _cos_sin_of(pos, cos_ptr, sin_ptr, inv_ptr, cols, HALF, SINCOS, ROUND_TABLE, INVERSE)
                _store_heads(qo_ptr, q32_ptr, q_offs, q_mask, q1, q2, c, s, HALF, WRITE32)
                _store_heads(ko_ptr, k32_ptr, k_offs, k_mask, k1, k2, c, s, HALF, WRITE32)
            else:
                pos = _row_of(tok, pos_ptr, ROWS)
                c, s = _cos_sin_of(pos, cos_ptr, sin_ptr, inv_ptr, cols, HALF, SINCOS, ROUND_TABLE, INVERSE)
                _rope_heads(q_ptr, qo_ptr, q32_ptr, tok, n_q_heads, c, s, HALF, BLOCK_QH, BLOCK_HALF, WRITE32)
                _rope_heads(k_ptr, ko_ptr, k32_ptr, tok, n_k_heads, c, s, HALF, BLOCK_KH, BLOCK_HALF, WRITE32)


def gather_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` for the entry points: each token's cos/sin table row (an exact copy), gathered once per forward or
    decode step and reused by every layer."""
    return torch.index_select(cos, 0, positions), torch.index_select(sin, 0, positions)


def _check_rows(rows, n_tokens: int, half: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    if KNOBS["COS_SIN"] == "sincos":
        raise ValueError("rows= (pre-gathered cos/sin rows) conflicts with COS_SIN='sincos', which computes cos/sin "
                         "in the kernel from positions and inv_freq: pass one or the other")
    if not isinstance(rows, (tuple, list)) or len(rows) != 2:
        raise ValueError(f"rows must be (cos_rows, sin_rows), got {type(rows).__name__}")
    for name, r in zip(("cos_rows", "sin_rows"), rows):
        if not isinstance(r, torch.Tensor):
            raise ValueError(f"rows: {name} must be a tensor, got {type(r).__name__}")
        if r.dtype != torch.float32 or tuple(r.shape) != (n_tokens, half) or not r.is_contiguous():
            raise ValueError(f"rows: {name} must be contiguous fp32 [tokens, head_dim // 2] = [{n_tokens}, {half}], "
                             f"got {r.dtype} {list(r.shape)}{'' if r.is_contiguous() else ' (not contiguous)'}")
        if r.device != device:
            raise ValueError(f"rows: {name} is on {r.device}, q on {device}")
    return rows[0], rows[1]


def _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, inv_freq, rows, tokens_per_program, num_warps,
            num_stages, load_order, head_split, inverse=False):
    n_tokens, n_q_heads, head_dim = q.shape
    n_k_heads = k.shape[1]
    half = head_dim // 2
    write32 = q32 is not None
    sincos = KNOBS["COS_SIN"] == "sincos"
    if rows is not None:  # the kernel reads row tok of these instead of row positions[tok] of the table
        cos, sin = _check_rows(rows, n_tokens, half, q.device)
        positions = cos  # not read
    elif cos is None or sin is None or positions is None:
        raise ValueError("cos, sin and positions are required unless rows= (pre-gathered cos/sin rows) is given")
    if sincos and (inv_freq is None or inv_freq.dtype != torch.float64 or inv_freq.numel() != half):
        raise ValueError("COS_SIN='sincos' needs inv_freq: fp64 [head_dim // 2] on the device")
    programs = cdiv(n_tokens, tokens_per_program)
    if head_split == 0:  # auto: split a token's heads over up to 4 programs while that still fits one wave
        head_split = 1
        while head_split < 4 and programs * head_split * 2 <= _sm_count(q.device):
            head_split *= 2
    grid = (programs, head_split)
    block_qh = pow2(cdiv(n_q_heads, head_split))
    block_kh = pow2(cdiv(n_k_heads, head_split))
    if sincos:  # k in a tile of q's shape: one register layout, so cos/sin are computed once, not per layout
        block_kh = block_qh = max(block_qh, block_kh)
    fast(_rope_kernel)[grid](
        q, k, cos, sin, positions, inv_freq if sincos else cos, q_out, k_out,
        q32 if write32 else q_out, k32 if write32 else k_out,
        n_tokens, n_q_heads, n_k_heads, half,
        TOKENS_PER_PROGRAM=tokens_per_program, BLOCK_QH=block_qh, BLOCK_KH=block_kh,
        BLOCK_HALF=pow2(half), ROUND_TABLE=KNOBS["ROUND_TABLE_TO_BF16"], INVERSE=inverse,
        WRITE32=write32, SINCOS=sincos, EARLY_LOADS=load_order == "early", HEAD_SPLIT=head_split,
        ROWS=rows is not None, num_warps=num_warps, num_stages=num_stages,
    )


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def rope_full(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
              positions: torch.Tensor | None, q_out: torch.Tensor, k_out: torch.Tensor, q32: torch.Tensor | None = None,
              k32: torch.Tensor | None = None, inv_freq: torch.Tensor | None = None,
              rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """All tokens of a packed batch: q [tokens, q_heads, head_dim], k [tokens, kv_heads, head_dim] (contiguous),
    positions [tokens] (each token's absolute position), cos/sin fp32 [max_position, head_dim // 2], inv_freq
    the fp64 inverse frequencies [head_dim // 2] the table was built from (read only with COS_SIN="sincos").
    rows: `gather_rows(cos, sin, positions)`, gathered once for all layers; cos, sin, positions are then not
    read (may be None) and the bits are the table path's."""
    _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, inv_freq, rows, KNOBS["FULL_TOKENS_PER_PROGRAM"],
            KNOBS["FULL_NUM_WARPS"], KNOBS["FULL_NUM_STAGES"], KNOBS["FULL_LOAD_ORDER"], KNOBS["FULL_HEAD_SPLIT"])


def rope_decode(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                positions: torch.Tensor | None, q_out: torch.Tensor, k_out: torch.Tensor,
                q32: torch.Tensor | None = None, k32: torch.Tensor | None = None,
                inv_freq: torch.Tensor | None = None, rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """One token per sequence: q [batch, q_heads, head_dim], positions [batch] (rows [batch, head_dim // 2]);
    same numerics as rope_full."""
    _launch(q, k, cos, sin, positions, q_out, k_out, q32, k32, inv_freq, rows, KNOBS["DECODE_TOKENS_PER_PROGRAM"],
            KNOBS["DECODE_NUM_WARPS"], KNOBS["DECODE_NUM_STAGES"], KNOBS["DECODE_LOAD_ORDER"],
            KNOBS["DECODE_HEAD_SPLIT"])


def rope_backward(grad_q: torch.Tensor, grad_k: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                  positions: torch.Tensor | None, dq: torch.Tensor, dk: torch.Tensor,
                  inv_freq: torch.Tensor | None = None, rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Gradients w.r.t. the un-rotated q and k: the inverse rotation of the incoming gradients (rows as in
    rope_full: the forward's rows serve the backward too)."""
    _launch(grad_q, grad_k, cos, sin, positions, dq, dk, None, None, inv_freq, rows, KNOBS["FULL_TOKENS_PER_PROGRAM"],
            KNOBS["FULL_NUM_WARPS"], KNOBS["FULL_NUM_STAGES"], KNOBS["FULL_LOAD_ORDER"], KNOBS["FULL_HEAD_SPLIT"],
            inverse=True)
