"""Fixes for Triton's CPU interpreter so CPU runs check the *structure* of bitwise consistency.

Under ``TRITON_INTERPRET=1`` (Triton 3.6) ``tl.dot`` on bf16 multiplies the raw uint16 bit patterns, and
numpy's float32 matmul rounds differently depending on the row count, so even a correct unified kernel shows
prefill/decode mismatches. Products of bf16/fp16 values are exact in float64, so computing the dot in float64,
rounding once to float32 and then adding the accumulator gives a result that no longer depends on the tile
shape: CPU tests then catch real structural mismatches (a different BLOCK_N, another merge order) exactly.
The interpreter also truncates fp32 -> bf16 casts where the GPU rounds to nearest even; that is fixed too, so
CPU checks comparing with torch's bf16 rounding (e.g. a residual sum) are exact.
Speed and bits on a GPU are a separate matter, measured there.
"""

from __future__ import annotations

import os

import numpy as np

_installed = False


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _as_f64(data: np.ndarray, dtype) -> np.ndarray:
    import triton.language as tl

    if dtype == tl.bfloat16:  # stored as raw uint16 bits
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return data.astype(np.float64)


def install() -> None:
    """Patch the interpreter's dot (idempotent). Only meaningful when interpreting."""
    global _installed
    if _installed:
        return
    from triton.runtime import interpreter as interp

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_data, b_data, a_ty, b_ty = a.data, b.data, a.dtype, b.dtype
        if a_ty.primitive_bitwidth == 8 and a_ty.is_floating():
            a_data = interp._convert_float(a_data, a_ty, interp.tl.float16, None).view(np.float16)
            a_ty = interp.tl.float16
        if b_ty.primitive_bitwidth == 8 and b_ty.is_floating():
            b_data = interp._convert_float(b_data, b_ty, interp.tl.float16, None).view(np.float16)
            b_ty = interp.tl.float16
        prod = np.matmul(_as_f64(a_data, a_ty), _as_f64(b_data, b_ty))
        acc = d.data
        if np.issubdtype(acc.dtype, np.floating):
            result = prod.astype(acc.dtype) + acc
        else:  # integer dots: exact in int64
            result = (np.matmul(a_data.astype(np.int64), b_data.astype(np.int64)) + acc).astype(acc.dtype)
        return interp.TensorHandle(result, d.dtype.scalar)

    interp.InterpreterBuilder.create_dot = create_dot
    _install_bf16_rtne(interp)
    _installed = True


def _install_bf16_rtne(interp) -> None:
    # Triton 3.6's "rtne" cast rounds half up without carrying into the exponent; do what the GPU does.
    original = interp._convert_float

    def convert(data, in_ty, out_ty, rounding_mode):
        if in_ty == interp.tl.float32 and out_ty == interp.tl.bfloat16:
            b = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint32).astype(np.uint64)
            r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
            r = np.where((b & 0x7FFFFFFF) > 0x7F800000, ((b >> 16) | 0x40).astype(np.uint16), r)  # keep NaN
            return r.reshape(np.shape(data))
        return original(data, in_ty, out_ty, rounding_mode)

    interp._convert_float = convert
