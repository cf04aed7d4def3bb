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


def test_installs_keep_a_gpu_users_torch():
    """`pip install -e .` (and its extras, hf among them) must accept the torch and Triton a GPU machine already has
    (torch 2.11, Triton 3.6) as well as the CPU pin, so pip never replaces them; only the core names them."""
    requirements = pytest.importorskip("packaging.requirements")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {r.name: r.specifier for r in map(requirements.Requirement, project["dependencies"])}
    assert set(core) >= {"torch", "triton"}
    pins = dict(line.split("==") for line in (ROOT / "constraints" / "cpu.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    for name, versions in {"torch": ("2.11.0", pins["torch"]), "triton": ("3.6.0", pins["triton"])}.items():
        assert all(core[name].contains(v) for v in versions), (name, str(core[name]), versions)
    for extra, reqs in project["optional-dependencies"].items():
        named = {requirements.Requirement(r).name for r in reqs}
        assert not named & {"torch", "triton"}, f"extra {extra} names torch or triton"
