"""Which implementation backs each `tik_evo::` op: named kernel sets.

Every op takes a `kernels` string, the name of a registered set ({family: module}); "root" (the default) is every
family's root. The name travels in the op's arguments, so a compiled graph records which kernels it calls and two
models in one process may use different sets. `kernel_set(...)` builds and registers a set from what a user has:
named knob sets of a family (`tik-evo kernel FAMILY --list`), kernel files (`tik-evo kernel ... -o FILE`,
`tik-evo show RUN best -o FILE`), run directories (a search's best) or modules already imported.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

FAMILIES = ("embedding", "rmsnorm", "add_rmsnorm", "qk_rmsnorm", "linear", "rope", "kv_append", "attention",
            "silu_mul", "moe_routing", "logprob")

_SETS: dict[str, dict[str, ModuleType]] = {"root": {}}  # families missing from a set fall back to the root


def root(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise ValueError(f"tik_evo.ops: {family!r} is not a family ({', '.join(FAMILIES)})")
    return importlib.import_module(f"tik_evo_kernels.{family}.root")


def impl(kernels: str, family: str) -> ModuleType:
    """The module behind `family` in the set named `kernels`."""
    try:
        chosen = _SETS[kernels]
    except KeyError:
        raise ValueError(f"tik_evo.ops: no kernel set named {kernels!r} (registered: {', '.join(sorted(_SETS))}); "
                         "make one with tik_evo.ops.kernel_set(...)") from None
    return chosen.get(family) or root(family)


def register(name: str, impls: Mapping[str, ModuleType]) -> str:
    """Register {family: module} as the set `name` (replacing a set of that name; "root" cannot be replaced)."""
    if name == "root" and impls:
        raise ValueError("tik_evo.ops.register: the name 'root' is reserved for the families' roots")
    for family, module in impls.items():
        root(family)  # an unknown family is refused, naming it
        if not isinstance(module, ModuleType):
            raise TypeError(f"tik_evo.ops.register: {family}: expected a module, got {type(module).__name__}")
    _SETS[name] = dict(impls)
    return name


def registered() -> dict[str, dict[str, str]]:
    """{set name: {family: module name}} of every registered set, for records."""
    return {name: {f: m.__name__ for f, m in s.items()} for name, s in _SETS.items()}


def _load(family: str, spec: ModuleType | str | Path) -> tuple[ModuleType, str]:
    """(module, a stable description) of one family's choice: a module, a kernel file, a run directory (its best)
    or the name of one of the family's named knob sets."""
    from tik_evo.candidate import load_source

    if isinstance(spec, ModuleType):
        return spec, f"module:{spec.__name__}"
    path = Path(spec)
    if path.is_dir() or path.suffix == ".py" or path.exists():
        from tik_evo_kernels.files import KernelArgError, kernel_sources

        try:
            (src,) = kernel_sources([str(path)] if path.is_dir() else [], [] if path.is_dir() else
                                    [f"{family}={path}"], FAMILIES)
        except KernelArgError as e:
            raise ValueError(f"tik_evo.ops.kernel_set: {family}={spec}: {e}") from None
        if src.family != family:
            raise ValueError(f"tik_evo.ops.kernel_set: {family}={spec}: the run's family is {src.family!r}")
        digest = hashlib.sha1(src.source.encode()).hexdigest()[:12]
        return load_source(src.source, f"{family}_{src.stem}"), f"source:{digest}"
    from tik_evo.families import load_family
    from tik_evo.initialization import knob_changes, source_with

    fam = load_family(family)
    try:
        changes = knob_changes(fam, str(spec), {}, "tik_evo.ops.kernel_set", keys=(f"{family} set", f"{family} knobs"))
    except ValueError as e:  # ConfigError: the message names the family, the set and the sets there are
        raise ValueError(str(e)) from None
    return load_source(source_with(fam, changes), f"{family}_{spec}"), f"set:{spec}"


def kernel_set(kernels: Mapping[str, ModuleType | str | Path] | None = None, attention_set: str | None = None,
               name: str | None = None) -> str:
    """Register the roots with each family of `kernels` replaced ({family: module | kernel file | run directory |
    named set}) and attention as the named set `attention_set`; returns the set's name (`name`, else one derived
    from the choices, so the same choices give the same name and load once). A wrong family, file, knob or set name
    is refused, naming it."""
    choices = dict(kernels or {})
    if attention_set:
        if "attention" in choices:
            raise ValueError("tik_evo.ops.kernel_set: attention is given both in kernels and as attention_set")
        choices["attention"] = attention_set
    if not choices:
        return "root"
    impls, parts = {}, []
    for family in sorted(choices):
        root(family)
        impls[family], desc = _load(family, choices[family])
        parts.append(f"{family}={desc}")
    if name:  # a name of the caller's: registered anew (replacing a set of that name)
        return register(name, impls)
    name = "set_" + hashlib.sha1("|".join(parts).encode()).hexdigest()[:10]
    return name if name in _SETS else register(name, impls)
