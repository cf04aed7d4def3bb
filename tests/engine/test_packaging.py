"""pyproject.toml lists the packages by hand (the families are installed under the import name tik_evo_kernels, the
benchmark suites under tik_evo_bench): every package folder must be in the list, or a non-editable install would
leave it out."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_installed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == {"tik_evo_kernels": "kernels", "tik_evo_bench": "benchmarks"}
    listed = set(tool["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for top in ("tik_evo", "tui")
               for p in (ROOT / top).rglob("__init__.py")}
    families = (ROOT / "kernels").glob("*/__init__.py")
    folders |= {"tik_evo_kernels", *(f"tik_evo_kernels.{p.parent.name}" for p in families)}
    folders |= {"tik_evo_bench"} if (ROOT / "benchmarks" / "__init__.py").exists() else set()
    assert listed == folders and "tik_evo_bench" in listed
    assert not (ROOT / "kernels" / "__init__.py").exists()  # a regular package `kernels` here would hide another's
    assert not list((ROOT / "benchmarks").glob("*/__init__.py"))  # one package: subfolders would need listing
