"""tik-evo: evolve faster GPU kernels whose full-sequence and decode paths agree bit for bit."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

# The kernel families live in the folder `kernels/`, imported as `tik_evo_kernels` so that they never take the name
# of another package (Hugging Face's `kernels`, which transformers requires). An install maps the name to the
# folder; run from a checkout without installing (PYTHONPATH=.), the name is mapped here.
KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


def _map_kernels() -> None:
    if "tik_evo_kernels" in sys.modules or importlib.util.find_spec("tik_evo_kernels") is not None:
        return
    spec = importlib.machinery.ModuleSpec("tik_evo_kernels", None, is_package=True)
    spec.submodule_search_locations = [str(KERNELS_DIR)]
    sys.modules["tik_evo_kernels"] = importlib.util.module_from_spec(spec)


_map_kernels()
