"""Shared helpers of the attention family's CPU tests (TRITON_INTERPRET=1, exact float64 dot)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from tik_evo import interp
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo_kernels.attention import FAMILY

REPO = Path(__file__).resolve().parents[2]
SMALL = FAMILY.check_cases("small")[0]
# Negative tests only need one decode position to differ: a smaller case keeps them fast.
TINY = {"batch": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 64, "prompt": 40, "answer": 10, "scale": 1.0}
_TMP = Path(tempfile.mkdtemp(prefix="tik_attention_"))
_count = [0]


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    interp.install()


def load(source: str) -> ModuleType:
    """Import a candidate source from a real file (Triton needs one)."""
    _count[0] += 1
    path = _TMP / f"attention_cand_{_count[0]}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_launches(mod: ModuleType, kernel: str, record) -> None:
    """Replace ``mod.<kernel>`` by a launcher that calls ``record(grid, kwargs)`` before each real launch."""
    real = getattr(mod, kernel)

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                record(grid, kw)
                return real[grid](*args, **kw)
            return launch

    setattr(mod, kernel, Recorder())


def with_knobs(source: str, **changes) -> str:
    return write_knobs(source, {**read_knobs(source), **changes})


def failed(results) -> list[str]:
    return [c.name for c in results if not c.passed]
