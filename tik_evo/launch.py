"""Fast kernel launches for the families' kernels (path only: the same compiled kernel gets the same arguments).

`fast(kernel)[grid](*args, **constexprs)` launches like `kernel[grid](...)`, but pays Triton's per-call binding
and specialisation of its arguments (tens of microseconds of Python per launch: more than a short launch's GPU
time, and most of a small GEMM's) once per launch key: each argument's `arg_key`, the keywords, the device. The
key's first launch goes through Triton, which compiles or finds the kernel; later ones call that compiled
kernel's launcher directly, as Triton itself does after its lookup. The interpreter, launch hooks (profilers)
and torch.compile's tracing always take Triton's path.

Kernels pass their tensors and scalars positionally and their constexprs and launch options (num_warps, ...)
by keyword. An argument with a `full()` method is a light host-descriptor record (fields Triton's launcher
reads); Triton's own path gets `full()`. `cdiv` and `pow2` are the host arithmetic of grids. Imported by the
kernels' sources (an allowed import of the audit); a source used without tik-evo falls back to Triton's own.
"""

from __future__ import annotations

import torch
import triton

ENABLED = True  # off: every launch takes Triton's own path (benchmarks compare the two)
MAX_KEYS = 1024  # distinct launch keys per kernel; past it, start over rather than grow without bound
_CONST_TYPES = (int, bool, str, type(None))
_I32 = range(-(2 ** 31), 2 ** 31)


def arg_key(a, value_free: bool = False):
    """What an argument contributes to a launch key, never coarser than Triton's specialisation of it: tensors,
    dtype and 16-byte alignment; descriptors, the same plus their geometry; floats, nothing; ints of a
    do_not_specialize parameter (`value_free`), whether they are 1, multiples of 16 and 32-bit; the rest, the
    value."""
    t = type(a)
    if t is torch.Tensor or isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if t is float:
        return float
    if t is int and value_free:
        return int, a == 1, a % 16 == 0, a in _I32
    if hasattr(a, "block_shape") and hasattr(a, "base"):
        return (a.base.dtype, a.base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                id(getattr(a, "layout", None)), getattr(a, "padding", None))
    return t, a


class Launcher:
    def __init__(self, fn):
        self.fn = fn
        self.fast = isinstance(fn, triton.runtime.JITFunction)
        self.kernels: dict = {}
        self.value_free = frozenset(i for i, p in enumerate(getattr(fn, "params", ())) if p.do_not_specialize
                                    and not p.is_constexpr)

    def __getitem__(self, grid):
        return lambda *args, **kw: self._launch(grid, args, kw)

    def _launch(self, grid, args, kw):
        hooks = triton.knobs.runtime
        # Keywords are kept by value in the key and replayed as they were; anything else (a tensor passed by
        # keyword) takes Triton's path every time, and so does a launch torch.compile is tracing.
        if not (self.fast and ENABLED and _no_hooks(hooks.launch_enter_hook) and _no_hooks(hooks.launch_exit_hook)
                and all(type(v) in _CONST_TYPES for v in kw.values()) and not torch.compiler.is_compiling()):
            return self.fn[grid](*_full(args), **kw)
        device = launch_device()
        key = (device, tuple(arg_key(a, i in self.value_free) for i, a in enumerate(args)), tuple(kw.items()))
        hit = self.kernels.get(key)
        if hit is None:
            kernel = self.fn[grid](*_full(args), **kw)
            if len(self.kernels) >= MAX_KEYS:
                self.kernels.clear()
            params = self.fn.signature.parameters  # the kernel's arguments after the positional ones, in order
            tail = tuple(kw[n] if n in kw else params[n].default for n in self.fn.arg_names[len(args):])
            self.kernels[key] = kernel, tail
            return kernel
        kernel, tail = hit
        g = (*grid, 1, 1)
        kernel.run(g[0], g[1], g[2], launch_stream(device), kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *tail)
        return kernel


class _Triton:
    """Triton's own path for a kernel, light descriptors made full."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kw: self.fn[grid](*_full(args), **kw)


_LAUNCHERS: dict = {}


def fast(kernel, enabled: bool = True):
    """The kernel's Launcher (one per kernel), or with `enabled` False Triton's own path."""
    launch = _LAUNCHERS.get(kernel)
    if launch is None:
        launch = _LAUNCHERS[kernel] = Launcher(kernel)
    return launch if enabled else _Triton(kernel)


def cdiv(a: int, b: int) -> int:
    """Host-side ceil division for grids (triton.cdiv unwraps constexprs: microseconds a call, every launch)."""
    return -(-a // b)


def pow2(n: int) -> int:
    """Host-side next power of two (as triton.next_power_of_2, without its constexpr-call cost)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def _full(args: tuple) -> tuple:
    return tuple(a.full() if hasattr(a, "full") and not isinstance(a, torch.Tensor) else a for a in args)


def _no_hooks(hook) -> bool:
    return hook is None or (isinstance(hook, triton.knobs.HookChain) and not hook.calls)


def launch_device() -> int:
    return triton.runtime.driver.active.get_current_device()


def launch_stream(device: int) -> int:
    return triton.runtime.driver.active.get_current_stream(device)
