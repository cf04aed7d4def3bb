"""Family registry: a family is the package ``kernels.<name>`` exporting ``FAMILY``."""

from __future__ import annotations

import importlib
from pathlib import Path

from tik_evo.family import Family

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


class FamilyError(ValueError):
    pass


def available() -> list[str]:
    return sorted(p.parent.name for p in KERNELS_DIR.glob("*/__init__.py"))


def load_family(name: str) -> Family:
    if name not in available():
        raise FamilyError(f"unknown kernel family {name!r}; available: {', '.join(available())}")
    module = importlib.import_module(f"kernels.{name}")
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise FamilyError(f"kernels/{name}/__init__.py must define FAMILY, an instance of tik_evo.family.Family")
    return family
