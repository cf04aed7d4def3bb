"""Implementations a benchmark times beside a family's root: the root with some knob changes, or a kernel file
(a run's best exported with `tik-evo kernel`), loaded as modules; the label each reports under; and each one's
time over the root's on the cells where both were timed back to back."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from tik_evo.knobs import read_knobs, write_knobs

KERNELS = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class KernelFile:
    """An extra implementation (a run's best, a kernel file): stands where a dict of knob changes to the root
    stands in `load`, `tag` and a benchmark's consistency checks."""

    label: str
    path: str


def tag(knobs: dict | KernelFile) -> str:
    """The label an implementation's rows carry: a file's label, `K=V,...` for knob changes, `root` for none."""
    if isinstance(knobs, KernelFile):
        return knobs.label
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "root"


def load(family: str, knobs: dict | KernelFile | None, cache: dict) -> ModuleType:
    """The family's root with some KNOBS entries replaced (or a KernelFile's source), imported from a real file
    (Triton needs one); `cache` keeps each implementation loaded once."""
    from_file = isinstance(knobs, KernelFile)
    key = (family, knobs.path) if from_file else (family, tuple(sorted((knobs or {}).items())))
    if key not in cache:
        if from_file:
            src = Path(knobs.path).read_text()
        else:
            fam = importlib.import_module(f"tik_evo_kernels.{family}").FAMILY
            fam.check_knobs(knobs or {}, f"{family} variant {knobs}")
            src = (KERNELS / family / "root.py").read_text()
            if knobs:
                src = write_knobs(src, {**read_knobs(src), **knobs})
        name = f"bench_{family}_{len(cache)}"
        path = Path(tempfile.gettempdir()) / f"{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        cache[key] = mod
    return cache[key]


def with_root(files: list[KernelFile]) -> list:
    """The root ({}) and a family's extra implementations, to time back to back on a cell; [] without extras."""
    return [{}, *files] if files else []


def gmean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def vs_root(rows: list[dict], files: list[KernelFile]) -> dict[str, dict]:
    """Each file's time over the root's on every cell where both were timed (rows `{"workload", "impl", "time_us"}`
    with impl `label` or `root`, a linear row's "full:" / "decode:" prefix ignored), and their geometric mean."""
    times: dict = {}  # impl -> workload -> us
    for r in rows:
        impl = r["impl"].removeprefix("full:").removeprefix("decode:")
        times.setdefault(impl, {})[r["workload"]] = r["time_us"]
    root = times.get("root", {})
    out = {}
    for f in files:
        ratios = {wl: us / root[wl] for wl, us in times.get(f.label, {}).items() if wl in root}
        out[f.label] = {"path": f.path, "vs_root": ratios, "gmean_vs_root": gmean(ratios.values()) if ratios else None}
    return out
