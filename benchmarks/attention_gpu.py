"""Measure the attention family on a GPU: `python3 benchmarks/attention_gpu.py --out results.json`.

A thin entry point around `kernels/attention/bench.py` (the same code `tik-evo bench attention` runs) that works
from a bare checkout with only torch, triton and numpy installed.
"""

import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
try:
    import tik_evo  # noqa: F401
except ImportError:  # the engine package needs more than this machine has: load only the modules we use
    pkg = types.ModuleType("tik_evo")
    pkg.__path__ = [str(ROOT / "tik_evo")]
    sys.modules["tik_evo"] = pkg

from tik_evo_kernels.attention.bench import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
