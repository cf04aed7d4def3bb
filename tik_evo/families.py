"""Family registry: a family is the package ``kernels.<name>`` exporting ``FAMILY``."""

from __future__ import annotations

import importlib
import sys
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
    try:
        module = importlib.import_module(f"kernels.{name}")
    except ModuleNotFoundError as e:
        raise FamilyError(_shadowed() or str(e)) from e
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise FamilyError(f"kernels/{name}/__init__.py must define FAMILY, an instance of tik_evo.family.Family")
    return family


def _shadowed() -> str:
    """Why `kernels.<family>` cannot be imported when another package named `kernels` comes first (Hugging Face's
    `kernels`, which transformers 5 requires, is one), or "" when that is not the cause."""
    found = sys.modules.get("kernels")
    paths = [Path(p).resolve() for p in getattr(found, "__path__", None) or []]
    if found is None or KERNELS_DIR in paths:
        return ""
    where = ", ".join(map(str, paths)) or getattr(found, "__file__", None) or "another module"
    return (f"the package `kernels` imported here is {where}, not tik-evo's {KERNELS_DIR}: another installed "
            "package has the same import name (Hugging Face's `kernels`, which transformers 5 requires, is one). "
            "Install tik-evo editable (`pip install -e`), whose finder resolves the families past it; see the "
            "README's set-up")
