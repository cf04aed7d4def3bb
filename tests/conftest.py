"""Shared test setup: kernels run under Triton's CPU interpreter with the exact-dot fix installed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tik_evo import interp  # noqa: E402

interp.install()

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def offline():
    """run(*argv, timeout=600) -> stdout: Python with argv (a benchmarks/ script and its flags, or "-c", code) in
    the repository root, without the interpreter, as an offline sm_90a compile needs the real compiler; a non-zero
    exit fails the test with the end of stderr."""
    def run(*argv: str, timeout: int = 600) -> str:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=timeout)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout
    return run
