"""Workload sets: YAML files under ``workloads/`` naming shapes a family can run, with weights and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from tik_evo.config import ConfigError, workloads_path
from tik_evo.family import Family

RESERVED = ("name", "phase", "weight", "limit")


def load_workload_set(path: Path, family: Family) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"{path}: workload set not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("workloads"), list) or not data["workloads"]:
        raise ConfigError(f"{path}: key 'workloads': expected a non-empty list of workload entries")
    if data.get("family") != family.name:
        raise ConfigError(f"{path}: key 'family': {data.get('family')!r} but the campaign's kernel is {family.name!r}")
    seen: set[str] = set()
    out = []
    for i, w in enumerate(data["workloads"]):
        where = f"{path}: workloads[{i}]"
        if not isinstance(w, dict) or not isinstance(w.get("name"), str):
            raise ConfigError(f"{where}: key 'name': every workload needs a string name")
        if w["name"] in seen:
            raise ConfigError(f"{where}: key 'name': duplicate workload {w['name']!r}")
        seen.add(w["name"])
        try:
            family.validate_workload(w)
        except ValueError as e:
            raise ConfigError(f"{where} ({w['name']}): {e}") from e
        for key in ("weight", "limit"):
            if key in w and not (isinstance(w[key], (int, float)) and w[key] > 0):
                raise ConfigError(f"{where} ({w['name']}): key {key!r}: must be a positive number, got {w[key]!r}")
        out.append(dict(w))
    return out


def resolve_workloads(cfg: DictConfig, family: Family) -> list[dict[str, Any]]:
    """The campaign's workloads with weight and limit filled in from defaults and overrides."""
    path = workloads_path(cfg)
    items = load_workload_set(path, family)
    names = {w["name"] for w in items}
    overrides = OmegaConf.to_container(cfg.workloads.overrides, resolve=True) or {}
    for name in list(overrides) + list(cfg.workloads.only):
        if name not in names:
            raise ConfigError(f"{cfg.source_file}: key 'workloads': workload {name!r} is not in {path}")
    if cfg.workloads.only:
        items = [w for w in items if w["name"] in set(cfg.workloads.only)]
    for w in items:
        o = overrides.get(w["name"], {})
        unknown = set(o) - {"weight", "limit"}
        if unknown:
            raise ConfigError(f"{cfg.source_file}: key 'workloads.overrides.{w['name']}': unknown {sorted(unknown)}")
        w["weight"] = float(o.get("weight", w.get("weight", cfg.workloads.default_weight)))
        w["limit"] = float(o.get("limit", w.get("limit", cfg.workloads.default_limit)))
    return items
