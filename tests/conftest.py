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


def _skip_nested_lang_patches() -> None:
    """Speed only: Triton 3.6's interpreter re-patches triton.language (inspect.getmembers over it) on every @jit
    helper call inside a launch, though the launch patched the same modules already and restores them after (a
    third of the interpreter's time in the attention tests). A helper call covered by its launch's patch skips
    it; anything else takes Triton's own path."""
    from triton.runtime import interpreter as ti

    langs_of: dict = {}
    launches: list[set] = []  # the language modules patched by each launch in progress

    def langs(fn) -> set:
        if fn not in langs_of:
            langs_of[fn] = {id(v) for v in fn.__globals__.values() if v is ti.tl or v is ti.tl.core}
        return langs_of[fn]

    launch, call = ti.GridExecutor.__call__, ti.InterpretedFunction.__call__

    def launch_fast(self, *args, **kwargs):
        launches.append(set(langs(self.fn)))
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    def call_fast(self, *args, **kwargs):
        if not launches:
            return call(self, *args, **kwargs)
        if not langs(self.fn) <= launches[-1]:  # e.g. tl.reduce's combine fn (it sees triton.language.core):
            launches[-1] |= langs(self.fn)  # patched now, and nothing restores it before the launch ends
            return call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    ti.GridExecutor.__call__, ti.InterpretedFunction.__call__ = launch_fast, call_fast


_skip_nested_lang_patches()

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def offline():
    """run(*argv, timeout=600) -> stdout: Python with argv ("-m", "tik_evo.cli", "bench", SUITE and its flags, or
    "-c", code) in the repository root, without the interpreter, as an offline sm_90a compile needs the real
    compiler; a non-zero exit fails the test with the end of stderr."""
    def run(*argv: str, timeout: int = 600) -> str:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=timeout)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout
    return run
