"""Shared test setup: kernels run under Triton's CPU interpreter with the exact-dot fix installed."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tik_evo import interp  # noqa: E402

interp.install()
