"""Helpers every suite shares: the header a results file starts with, and writing a results file.

A results file (JSON) names when and where it was measured: `header()` gives the date (UTC), the GPU (or the CPU
form a --smoke / --dry-run run took), and the torch and Triton versions. `write_json` writes a result to a path,
making its folder, in the layout every suite uses (indent 1).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any


def now() -> str:
    """The current UTC time to the second, ISO 8601: a results file's date."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def header(gpu: str | None = None, device: int | None = None) -> dict[str, Any]:
    """{"date", "gpu", "torch", "triton"}: `gpu` as given, else the name of CUDA device `device` (the current one
    by default), else "cpu" where there is no GPU."""
    import torch
    import triton

    if gpu is None:
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name() if device is None else torch.cuda.get_device_name(device)
        else:
            gpu = "cpu"
    return {"date": now(), "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def write_json(path: str | Path, data: Any) -> Path:
    """Write `data` as JSON to `path` (its folder made if missing); the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path
