"""Load a candidate source as a module. Triton compiles from real source files, so a source is written to a
file first; the audit worker, the benchmarks and the tests all load candidates this way."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_tmp: Path | None = None
_count = itertools.count()


def load_module(path: str | Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_source(source: str, tag: str = "cand") -> ModuleType:
    global _tmp
    if _tmp is None:
        _tmp = Path(tempfile.mkdtemp(prefix="tik_evo_cand_"))
    name = f"_cand_{tag}_{next(_count)}"
    path = _tmp / f"{name}.py"
    path.write_text(source)
    return load_module(path, name)
