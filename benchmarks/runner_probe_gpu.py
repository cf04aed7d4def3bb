"""Probe: can a sandboxed runner map the judge's CUDA arena and run a root call? One line per sandbox mode.

    python3 benchmarks/runner_probe_gpu.py
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe(mode: str) -> None:
    import torch

    from tik_evo.families import load_family
    from tik_evo.remote import Runner, connect

    runner = Runner.fork("cuda", mode)
    print(mode, "sandbox:", {k: v for k, v in runner.sandbox.items() if k in ("missing", "network", "readonly_files")},
          flush=True)
    try:
        fam = load_family("rmsnorm")
        impl = connect(runner, fam, fam.root_source())
        x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        impl.rmsnorm_decode(x, w, 1e-6, out)
        print(mode, "call ok", float(out.float().abs().sum()), impl.take_checks(), flush=True)
    except Exception:
        traceback.print_exc()
    finally:
        runner.close()


if __name__ == "__main__":
    for m in sys.argv[1:] or ["off", "auto"]:
        import os

        pid = os.fork()
        if pid == 0:
            probe(m)
            os._exit(0)
        print(m, "exit", os.waitpid(pid, 0)[1], flush=True)
