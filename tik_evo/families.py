"""Family registry: a family is the package ``tik_evo_kernels.<name>`` (the folder ``kernels/<name>``) exporting
``FAMILY``."""

from __future__ import annotations

import importlib

from tik_evo import KERNELS_DIR
from tik_evo.family import Family


class FamilyError(ValueError):
    pass


def available() -> list[str]:
    return sorted(p.parent.name for p in KERNELS_DIR.glob("*/__init__.py"))


def load_family(name: str) -> Family:
    if name not in available():
        raise FamilyError(f"unknown kernel family {name!r}; available: {', '.join(available())}")
    module = importlib.import_module(f"tik_evo_kernels.{name}")
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise FamilyError(f"kernels/{name}/__init__.py must define FAMILY, an instance of tik_evo.family.Family")
    return family
