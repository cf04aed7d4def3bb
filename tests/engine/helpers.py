"""Test helpers: write campaigns into a temp dir."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


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


def lineage_store(path: Path):
    """A store whose root I0 (T = 2.0) is the best and the frontier's only member, for lineage decisions."""
    from tik_evo.records import Implementation
    from tik_evo.store import Store

    s = Store.create(path)
    with s.transaction() as t:
        t.put(Implementation(t.new_id("I"), "h0", [], "root", "best", objective=2.0))
        t.state.best, t.state.root, t.state.frontier, t.state.best_objective = "I0", "I0", ["I0"], 2.0
    return s
