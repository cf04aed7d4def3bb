"""Fused token log-prob and entropy over the vocabulary (bf16 logits in, fp32 out), one pass, no fp32 copy.

Per row: z = logits / temperature (skipped when temperature == 1, where it is exact), an online softmax over
vocabulary chunks of VOCAB_CHUNK columns walked from column 0 in ascending order, keeping per-lane sums
s = sum exp(z - m) and t = sum exp(z - m) * z, reduced with one tl.sum at the end of each split. Then
lse = m + log(s), log-prob = z_target - lse, entropy = lse - t / s.
SOFTMAX_FORM "exp2" computes exp(z - m) as exp2(z * log2(e) - m * log2(e)) (one FFMA and one MUFU.EX2 per
element instead of six instructions for tl.exp), accumulates s += p and t = fma(p, z, t), and rescales the lane
sums only when a chunk raises the running max; "exp" is the previous formula (rescale every chunk).

Bitwise agreement between paths holds because both call `_split_stats`, `_fold` and `_finish` with the same
contract parameters (VOCAB_CHUNK and NUM_WARPS fix the tl.sum order; VOCAB_SPLIT fixes the split boundaries).
With VOCAB_SPLIT > 0 the vocabulary is cut into fixed splits at the same absolute columns for every batch;
split results are folded in ascending order from an empty state. The full path folds them in-program; decode
may compute splits in parallel programs and fold them in a second launch.
"""

import torch
import triton
import triton.language as tl

try:  # tik-evo's launch path and grid arithmetic; used alone, this file takes Triton's (same kernels, same bits)
    from tik_evo.launch import cdiv, fast
except ImportError:
    from triton import cdiv

    def fast(kernel):
        return kernel


KNOBS = {
    "VOCAB_CHUNK": 2048,
    "NUM_WARPS": 4,
    "VOCAB_SPLIT": 16384,
    "SOFTMAX_FORM": "exp2",
    "FULL_NUM_STAGES": 1,
    "FULL_SPLIT_PARALLEL": False,
    "DECODE_NUM_STAGES": 1,
    "DECODE_SPLIT_PARALLEL": True,
    "FULL_PREFETCH": True,
    "DECODE_PREFETCH": True,
}


@triton.jit
def _scaled(x, temperature, APPLY_TEMP: tl.constexpr):
    # The one place the temperature is applied, for the loop and the target logit alike.
    z = x.to(tl.float32)
    if APPLY_TEMP:
        z = z / temperature
    return z


@triton.jit
def _split_stats(row_ptr, v_lo, v_hi, temperature, CHUNK: tl.constexpr, APPLY_TEMP: tl.constexpr,
                 FORM: tl.constexpr, PREFETCH: tl.constexpr = False):
    if FORM == "exp2":
        # Full chunks unmasked, then one masked tail; the same per-lane operations in both.
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([CHUNK], dtype=tl.float32)
        t = tl.zeros([CHUNK], dtype=tl.float32)
        v_full = v_lo + (v_hi - v_lo) // CHUNK * CHUNK
        if PREFETCH:
            # Schedule only: chunk i+1's load is issued before chunk i's reductions, so two chunks are in
            # flight per program; every chunk still goes through the same _step_exp2 in ascending order.
            if v_full > v_lo:
                cols = tl.arange(0, CHUNK)
                raw = tl.load(row_ptr + v_lo + cols)
                for off in range(v_lo + CHUNK, v_full, CHUNK):
                    nxt = tl.load(row_ptr + off + cols)
                    m, s, t = _step_exp2(raw, cols < CHUNK, m, s, t, temperature, APPLY_TEMP, False)
                    raw = nxt
                m, s, t = _step_exp2(raw, cols < CHUNK, m, s, t, temperature, APPLY_TEMP, False)
        else:
            for off in range(v_lo, v_full, CHUNK):
                m, s, t = _chunk_exp2(row_ptr, off, v_hi, m, s, t, temperature, CHUNK, APPLY_TEMP, False)
        if v_full < v_hi:
            m, s, t = _chunk_exp2(row_ptr, v_full, v_hi, m, s, t, temperature, CHUNK, APPLY_TEMP, True)
        return m, tl.sum(s, 0), tl.sum(t, 0)
    else:
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([CHUNK], dtype=tl.float32)
        t = tl.zeros([CHUNK], dtype=tl.float32)
        for off in range(v_lo, v_hi, CHUNK):
            cols = off + tl.arange(0, CHUNK)
            mask = cols < v_hi
            z = _scaled(tl.load(row_ptr + cols, mask=mask, other=float("-inf")), temperature, APPLY_TEMP)
            m_new = tl.maximum(m, tl.max(z, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_safe)
            p = tl.exp(z - m_safe)
            s = s * alpha + p
            t = t * alpha + p * tl.where(mask, z, 0.0)
            m = m_new
        return m, tl.sum(s, 0), tl.sum(t, 0)


@triton.jit
def _chunk_exp2(row_ptr, off, v_hi, m, s, t, temperature, CHUNK: tl.constexpr, APPLY_TEMP: tl.constexpr,
                MASKED: tl.constexpr):
    """One online-softmax step in base 2: p = exp2(z * log2(e) - m * log2(e)) (one FFMA and one MUFU.EX2 per
    element; probabilities below 2^-126 flush to 0), s += p, t = fma(p, z, t). The per-lane sums are rescaled
    only when the chunk raises the running max (a uniform branch), not on every chunk."""
    cols = off + tl.arange(0, CHUNK)
    mask = cols < v_hi
    if MASKED:
        raw = tl.load(row_ptr + cols, mask=mask, other=float("-inf"))
    else:
        raw = tl.load(row_ptr + cols)
    return _step_exp2(raw, mask, m, s, t, temperature, APPLY_TEMP, MASKED)


@triton.jit
def _step_exp2(raw, mask, m, s, t, temperature, APPLY_TEMP: tl.constexpr, MASKED: tl.constexpr):
    """The arithmetic of one chunk (see _chunk_exp2), on logits already loaded (masked lanes hold -inf)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    z = _scaled(raw, temperature, APPLY_TEMP)
    m_new = tl.maximum(m, tl.max(z, 0))
    if m_new > m:
        alpha = tl.math.exp2(m * LOG2E - m_new * LOG2E)  # 0 on the first chunk (m = -inf)
        s = s * alpha
        t = t * alpha
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(z * LOG2E - m_safe * LOG2E)
    s = s + p
    if MASKED:
        t = t + p * tl.where(mask, z, 0.0)
    else:
        t = t + p * z
    return m_new, s, t


@triton.jit
def _fold(m, s, t, m2, s2, t2):
    # Joins split results in ascending split order; the first fold is onto the empty state (-inf, 0, 0).
    mn = tl.maximum(m, m2)
    ms = tl.where(mn == float("-inf"), 0.0, mn)
    a = tl.exp(m - ms)
    b = tl.exp(m2 - ms)
    return mn, s * a + s2 * b, t * a + t2 * b


@triton.jit
def _finish(m, s, t, z_target):
    lse = m + tl.log(s)
    return z_target - lse, lse - t / s, lse


@triton.jit
def _write_row(row_ptr, tgt_ptr, row, m, s, t, temperature, lp_ptr, ent_ptr, lse_ptr,
               APPLY_TEMP: tl.constexpr, WRITE_LSE: tl.constexpr):
    """A row's outputs from its folded statistics: the target's log-prob, the entropy and (for the backward)
    the log-sum-exp; shared by the one-pass and the split+merge paths."""
    z_t = _scaled(tl.load(row_ptr + tl.load(tgt_ptr + row).to(tl.int64)), temperature, APPLY_TEMP)
    lp, ent, lse = _finish(m, s, t, z_t)
    tl.store(lp_ptr + row, lp)
    tl.store(ent_ptr + row, ent)
    if WRITE_LSE:
        tl.store(lse_ptr + row, lse)


@triton.jit
def _logprob_rows_kernel(x_ptr, tgt_ptr, lp_ptr, ent_ptr, lse_ptr, V, stride, split, temperature,
                         CHUNK: tl.constexpr, APPLY_TEMP: tl.constexpr, WRITE_LSE: tl.constexpr,
                         FORM: tl.constexpr, PREFETCH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = x_ptr + row * stride
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    t = tl.zeros([], dtype=tl.float32)
    for v_lo in range(0, V, split):
        m2, s2, t2 = _split_stats(row_ptr, v_lo, tl.minimum(v_lo + split, V), temperature, CHUNK, APPLY_TEMP, FORM,
                                  PREFETCH)
        m, s, t = _fold(m, s, t, m2, s2, t2)
    _write_row(row_ptr, tgt_ptr, row, m, s, t, temperature, lp_ptr, ent_ptr, lse_ptr, APPLY_TEMP, WRITE_LSE)


@triton.jit
def _logprob_split_kernel(x_ptr, ws_ptr, V, stride, split, n_splits, temperature,
                          CHUNK: tl.constexpr, APPLY_TEMP: tl.constexpr, FORM: tl.constexpr,
                          PREFETCH: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    v_lo = j * split
    m, s, t = _split_stats(x_ptr + row * stride, v_lo, tl.minimum(v_lo + split, V), temperature,
                           CHUNK, APPLY_TEMP, FORM, PREFETCH)
    base = ws_ptr + (row * n_splits + j) * 3
    tl.store(base, m)
    tl.store(base + 1, s)
    tl.store(base + 2, t)


@triton.jit
def _logprob_merge_kernel(x_ptr, tgt_ptr, ws_ptr, lp_ptr, ent_ptr, lse_ptr, stride, n_splits, temperature,
                          APPLY_TEMP: tl.constexpr, WRITE_LSE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], dtype=tl.float32)
    t = tl.zeros([], dtype=tl.float32)
    for j in range(n_splits):
        base = ws_ptr + (row * n_splits + j) * 3
        m, s, t = _fold(m, s, t, tl.load(base), tl.load(base + 1), tl.load(base + 2))
    _write_row(x_ptr + row * stride, tgt_ptr, row, m, s, t, temperature, lp_ptr, ent_ptr, lse_ptr, APPLY_TEMP,
               WRITE_LSE)


@triton.jit
def _logprob_grad_kernel(x_ptr, tgt_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, gx_ptr, V, stride, temperature,
                         BLOCK: tl.constexpr, APPLY_TEMP: tl.constexpr):
    # d logp/dz = onehot - p ; d H/dz = -p (z - E[z]) with E[z] = lse - H ; then / temperature.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    z = _scaled(tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0), temperature, APPLY_TEMP)
    lse = tl.load(lse_ptr + row)
    ez = lse - tl.load(ent_ptr + row)
    p = tl.exp(z - lse)
    onehot = (cols == tl.load(tgt_ptr + row)).to(tl.float32)
    g = tl.load(glp_ptr + row) * (onehot - p) - tl.load(gent_ptr + row) * p * (z - ez)
    if APPLY_TEMP:
        g = g / temperature
    tl.store(gx_ptr + row * V + cols, g.to(gx_ptr.dtype.element_ty), mask=mask)


def _launch(logits, target, temperature, logprob, entropy, lse, path):
    T, V = logits.shape
    chunk, warps, split = KNOBS["VOCAB_CHUNK"], KNOBS["NUM_WARPS"], KNOBS["VOCAB_SPLIT"]
    split = split if split > 0 else V
    n_splits = cdiv(V, split)
    apply_temp = float(temperature) != 1.0
    write_lse = lse is not None
    stages, prefetch = KNOBS[path + "_NUM_STAGES"], KNOBS[path + "_PREFETCH"]
    if T == 0:
        return
    if n_splits > 1 and KNOBS[path + "_SPLIT_PARALLEL"]:
        ws = torch.empty((T, n_splits, 3), dtype=torch.float32, device=logits.device)
        fast(_logprob_split_kernel)[(T, n_splits)](
            logits, ws, V, logits.stride(0), split, n_splits, temperature,
            CHUNK=chunk, APPLY_TEMP=apply_temp, FORM=KNOBS["SOFTMAX_FORM"], PREFETCH=prefetch, num_warps=warps,
            num_stages=stages)
        fast(_logprob_merge_kernel)[(T,)](
            logits, target, ws, logprob, entropy, lse if write_lse else logprob, logits.stride(0), n_splits,
            temperature, APPLY_TEMP=apply_temp, WRITE_LSE=write_lse, num_warps=1)
        return
    fast(_logprob_rows_kernel)[(T,)](
        logits, target, logprob, entropy, lse if write_lse else logprob, V, logits.stride(0), split, temperature,
        CHUNK=chunk, APPLY_TEMP=apply_temp, WRITE_LSE=write_lse, FORM=KNOBS["SOFTMAX_FORM"], PREFETCH=prefetch,
        num_warps=warps, num_stages=stages)


def logprob_full(logits: torch.Tensor, target: torch.Tensor, temperature: float, logprob: torch.Tensor,
                 entropy: torch.Tensor, lse: torch.Tensor | None = None) -> None:
    """Every token of a packed batch: logits [tokens, V] bf16, target [tokens] int -> logprob, entropy [tokens]
    fp32 (and the log-sum-exp of the scaled logits when `lse` is given)."""
    _launch(logits, target, temperature, logprob, entropy, lse, "FULL")


def logprob_decode(logits: torch.Tensor, target: torch.Tensor, temperature: float, logprob: torch.Tensor,
                   entropy: torch.Tensor, lse: torch.Tensor | None = None) -> None:
    """One token per sequence: logits [batch, V]; same per-row numerics as logprob_full."""
    _launch(logits, target, temperature, logprob, entropy, lse, "DECODE")


def logprob_backward(logits: torch.Tensor, target: torch.Tensor, temperature: float, grad_logprob: torch.Tensor,
                     grad_entropy: torch.Tensor, grad_logits: torch.Tensor) -> None:
    """Gradient of (logprob, entropy) with respect to the logits (bf16), recomputing lse in one pass."""
    T, V = logits.shape
    lp = torch.empty(T, dtype=torch.float32, device=logits.device)
    ent = torch.empty_like(lp)
    lse = torch.empty_like(lp)
    _launch(logits, target, temperature, lp, ent, lse, "FULL")
    block = 4096
    fast(_logprob_grad_kernel)[(T, cdiv(V, block))](
        logits, target, lse, ent, grad_logprob.float().contiguous(), grad_entropy.float().contiguous(), grad_logits,
        V, logits.stride(0), temperature, BLOCK=block, APPLY_TEMP=float(temperature) != 1.0, num_warps=8)
