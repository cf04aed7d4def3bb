"""Triton with no GPU: every launch compiles its kernel for a named CUDA target and launches nothing.

Used by a warm runner (:mod:`tik_evo.warm`), a process that sees no GPU: Triton's CUDA driver is replaced by one
that answers the target (compute capability, warp size) and device 0 without asking CUDA; tensors are meta
tensors (shapes and dtypes, no memory; `data_ptr()` is 0, so 16-byte aligned as the judge's arena slots are);
`JITFunction.run` always takes its warm-up path (compile, cache, return) and tik-evo's fast launch path is off, so
a repeated launch key compiles too instead of calling a launcher. What is compiled lands in the process's Triton
cache, under the same keys a GPU process of that target computes.
"""

from __future__ import annotations

from typing import Any


def install(capability: tuple[int, int], warp_size: int = 32) -> None:
    _fresh_triton()
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime.jit import JITFunction

    from tik_evo import launch

    target = GPUTarget("cuda", capability[0] * 10 + capability[1], warp_size)

    class CompileOnlyDriver(CudaDriver):
        def __init__(self) -> None:  # CudaDriver's own asks CUDA for its utils: none here
            pass

        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_current_target(self) -> GPUTarget:
            return target

        def get_active_torch_device(self) -> Any:
            return torch.device("meta")

        def get_device_interface(self) -> Any:
            return torch.cuda

        def get_benchmarker(self) -> Any:
            raise RuntimeError("compile-only: nothing is timed")

        def get_empty_cache_for_benchmark(self) -> Any:
            raise RuntimeError("compile-only: nothing is timed")

        def clear_cache(self, cache: Any) -> None:
            pass

    triton.runtime.driver.set_active(CompileOnlyDriver())
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = compile_only
    launch.ENABLED = False


def _fresh_triton() -> None:
    """A runner forked from a judge that interprets (CPU tests) inherits a Triton built for the interpreter: its
    language's @jit helpers are interpreted functions, and its compiler refers to that language. Import Triton
    again (all but its C extension), and tik-evo's launch path with it, now that nothing interprets."""
    import os
    import sys

    import triton
    from triton.runtime.jit import JITFunction

    os.environ.pop("TRITON_INTERPRET", None)
    if isinstance(triton.language.standard.sum, JITFunction):
        return
    for name in list(sys.modules):
        if ((name == "triton" or name.startswith("triton.")) and not name.startswith("triton._C")) \
                or name == "tik_evo.launch":
            del sys.modules[name]


def meta(dtype: Any, shape: list[int]) -> Any:
    import torch

    return torch.empty([int(s) for s in shape], dtype=dtype, device="meta")
