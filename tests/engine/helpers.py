"""Test helpers: load a candidate source as a module, write campaigns into a temp dir."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load_source(text: str, tmp_path: Path) -> ModuleType:
    name = f"cand_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def write_campaign(tmp_path: Path, **sections) -> Path:
    """A quickstart-like campaign in tmp_path; keyword sections are merged over the defaults."""
    base = yaml.safe_load((ROOT / "campaigns" / "quickstart.yaml").read_text())
    base["workloads"]["file"] = str(ROOT / "workloads" / "rmsnorm_cpu.yaml")
    base["store"]["path"] = str(tmp_path / "run")
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key].update(value)
        else:
            base[key] = value
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(base))
    return path
