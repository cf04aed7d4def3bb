"""Test helpers for kernel families (CPU, TRITON_INTERPRET=1).

`tik_evo.interp.install()` makes the interpreter's dot exact and its fp32 -> bf16 casts round to nearest
even like the GPU, so CPU checks that compare against torch's bf16 rounding are exact.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType, SimpleNamespace

from tik_evo import candidate

os.environ.setdefault("TRITON_INTERPRET", "1")


def setup() -> None:
    from tik_evo import interp

    interp.install()


def load_source(source: str, tag: str = "cand") -> ModuleType:
    """Import a candidate source from a real file (Triton needs one)."""
    return candidate.load_source(source, tag)


def root_with_knobs(family, changes: dict, declared_values: bool = True) -> str:
    """The root's source with ``changes`` written into KNOBS (each a knob of the root; with
    ``declared_values`` also one of the family's declared values)."""
    from tik_evo.knobs import read_knobs, write_knobs

    src = family.root_source()
    if not changes:
        return src
    knobs = read_knobs(src)
    for k, v in changes.items():
        assert k in knobs, k
        assert not declared_values or v in family.knob(k).values, (k, v)
    return write_knobs(src, {**knobs, **changes})


def load_with_knobs(family, **changes) -> ModuleType:
    return load_source(root_with_knobs(family, changes), family.name)


def hybrid(family, decode_knobs: dict, full_knobs: dict | None = None) -> ModuleType:
    """A deliberately mismatched candidate: the full path from one knob setting, decode from another."""
    full = load_with_knobs(family, **(full_knobs or {}))
    dec = load_with_knobs(family, **decode_knobs)
    for ep in family.entry_points:
        if ep.endswith("_decode"):
            setattr(full, ep, getattr(dec, ep))
    return full


def split_paths(full: ModuleType, decode: ModuleType) -> SimpleNamespace:
    """A candidate whose full-sequence entry points come from one module and decode ones from another."""
    ns = SimpleNamespace(**{k: getattr(full, k) for k in dir(full) if not k.startswith("_")})
    for k in dir(decode):
        if k.endswith("_decode"):
            setattr(ns, k, getattr(decode, k))
    return ns


def failures(family, impl, level="full", seeds=(0,), cases=None):
    """(name, kind, details) of every failed check over ``cases`` (default: the family's cases at ``level``)."""
    bad = []
    for case in cases or family.check_cases(level):
        for seed in seeds:
            for c in family.run_checks(impl, case, seed, "cpu"):
                if not c.passed:
                    bad.append((c.name, c.kind, c.details))
    return bad


def family(name: str):
    return importlib.import_module(f"tik_evo_kernels.{name}").FAMILY


def loader(fam):
    """`load(tag, source_edit, **knobs)` and `failures(impl, seeds, cases)` bound to one family (knob values
    outside the declared ones allowed: CPU tests scale contract knobs down to tiny shapes)."""

    def load(tag="root", source_edit=None, **knobs):
        src = root_with_knobs(fam, knobs, declared_values=False)
        if source_edit:
            src = source_edit(src)
        return load_source(src, f"{fam.name}_{tag}")

    return load, functools.partial(failures, fam)


def skips_normalisation(src: str) -> str:
    """An RMSNorm-like root with every row's `rstd = 1.0 / tl.sqrt(...)` made 1 (of the same shape): y = x * w, the
    same in both paths, finite and written. A cheat only the reference checks can catch."""
    import re

    out, n = re.subn(r"rstd = 1\.0 / tl\.sqrt\((.*)\)$", r"rstd = (\1) * 0.0 + 1.0", src, flags=re.M)
    assert n, "no rstd line to edit"
    return out
