"""Ablation sweeps by config overrides: `tik-evo sweep CAMPAIGN ablation.evidence=true,false search.seed=0,1`
runs every combination of the comma-separated values (one run directory each) and compares them."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from rich.table import Table

from tik_evo.store import Store

_LIST = re.compile(r"^\[.*\]$")


def axes(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split overrides into fixed ones and sweep axes (values with commas, outside a [list])."""
    fixed, swept = [], {}
    for o in overrides:
        key, _, value = o.partition("=")
        if "," in value and not _LIST.match(value.strip()):
            swept[key] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            fixed.append(o)
    return fixed, swept


def combinations(swept: dict[str, list[str]]) -> list[dict[str, str]]:
    keys = list(swept)
    return [dict(zip(keys, values)) for values in itertools.product(*(swept[k] for k in keys))]


def run_name(combo: dict[str, str]) -> str:
    return ",".join(f"{k.split('.')[-1]}={v}" for k, v in combo.items()) or "base"


def summary(run_dir: Path) -> dict[str, Any]:
    with Store.open_reader(run_dir) as store:
        st = store.state()
    best, root = st.get("best_objective"), st.get("root_objective")
    return {"run": str(run_dir), "evaluations": st["evaluations"], "kappa": st["kappa"],
            "speedup": (root / best) if best and root else None, "best": st.get("best"),
            "failures": sum(st["failures_by_kind"].values()), "tokens": st["budgets"]["tokens"],
            "usd": st["budgets"]["usd"], "wall_s": st["budgets"]["wall_s"],
            "finished": (st.get("finished") or {}).get("reason")}


def table(rows: list[dict[str, Any]], labels: list[str]) -> Table:
    t = Table(title="speed-up = T(root) / T(best), each run on its own timings; * = not finished")
    for col in ("run", "evals", "speed-up", "best", "κ", "fails", "tokens", "USD", "wall s"):
        t.add_column(col, no_wrap=col != "run", overflow="fold")
    for label, r in zip(labels, rows):
        t.add_row(label + ("" if r["finished"] else " *"), str(r["evaluations"]),
                  f"{r['speedup']:.3f}x" if r["speedup"] else "-", str(r["best"]), str(r["kappa"]),
                  str(r["failures"]), str(r["tokens"]), f"{r['usd']:.2f}", f"{r['wall_s']:.0f}")
    return t


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]], combos: list[dict[str, str]]) -> Path:
    path = sweep_dir / "sweep.json"
    path.write_text(json.dumps([{"overrides": c, **r} for c, r in zip(combos, rows)], indent=1))
    return path
