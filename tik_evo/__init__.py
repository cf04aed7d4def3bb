"""tik-evo: evolve faster GPU kernels whose full-sequence and decode paths agree bit for bit."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

# The kernel families live in the folder `kernels/`, imported as `tik_evo_kernels`, and the benchmark suites in
# `benchmarks/`, imported as `tik_evo_bench`, so that they never take the name of another package (Hugging Face's
# `kernels`, which transformers requires). An install maps the names to the folders; run from a checkout without
# installing (PYTHONPATH=.), the names are mapped here.
KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"
BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


def _map(name: str, folder: Path) -> None:
    if name in sys.modules or importlib.util.find_spec(name) is not None or not folder.is_dir():
        return
    init = folder / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)]) \
        if init.exists() else importlib.machinery.ModuleSpec(name, None, is_package=True)
    if not init.exists():  # a namespace-like package: the folder's modules, no __init__
        spec.submodule_search_locations = [str(folder)]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if init.exists():
        spec.loader.exec_module(module)


_map("tik_evo_kernels", KERNELS_DIR)
_map("tik_evo_bench", BENCH_DIR)
