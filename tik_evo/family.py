"""The kernel-family contract: everything operator-specific the engine needs, behind one small interface.

A family lives in ``kernels/<name>/`` and exports ``FAMILY``, an instance of a :class:`Family` subclass.
The engine never imports a kernel directly: it hands the family a loaded candidate module and asks for
checks and timeable benchmarks. A candidate is one complete source file that defines the family's entry
points and reads its tunables from a module-level ``KNOBS`` dict (see :mod:`tik_evo.knobs`).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

Role = Literal["contract", "full", "decode"]


@dataclass(frozen=True)
class Knob:
    """A tunable read from the candidate's ``KNOBS`` dict.

    ``contract`` knobs change the numerics of both paths (they are one entry used by both paths, so a change
    is always joint); ``full`` and ``decode`` knobs change only that path's schedule.
    """

    name: str
    values: tuple[Any, ...]
    role: Role
    doc: str = ""
    # The knob matters only while each named knob holds one of the listed values (and is itself in effect):
    # ((knob, (value, ...)), ...). Out of effect, a change of it compiles to the same kernels: the knob operator
    # keeps the parent's value and one-knob moves skip it.
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@dataclass(frozen=True)
class EntryPoint:
    """One function a candidate file defines, as the audit calls it from another process.

    The judge never imports a candidate: it sends each call's tensors through shared buffers, so it must know
    which arguments the call may write (``writes``: outputs and in-place caches; every other tensor argument
    must come back bit-unchanged) and which outputs production calls leave out (``optional``, e.g. the fp32 side
    output: the audit repeats such calls without them and compares the other outputs bit for bit).
    ``params`` is the positional order of the root's signature; ``required`` False marks an entry point a file
    may lack (a backward, a packed variant); ``returns`` that the function returns tensors instead of (or
    beside) writing them; ``updates`` the written tensors that are also read (a KV cache appended to): the audit
    poisons every other written tensor before a timed region, never these.
    """

    name: str
    params: tuple[str, ...]
    writes: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    required: bool = True
    returns: bool = False
    updates: tuple[str, ...] = ()
    # A gradient: need not be bit-exact between paths (not graph-replayed against its eager call); see `Backward`.
    backward: bool = False

    def __post_init__(self) -> None:
        unknown = [p for p in (*self.writes, *self.optional, *self.updates) if p not in self.params]
        if unknown:
            raise ValueError(f"entry point {self.name}: {unknown} not among its params {list(self.params)}")


def Backward(name: str, params: tuple[str, ...], **kw: Any) -> EntryPoint:  # noqa: N802 - reads as a declaration
    """A backward entry point: the policy update's gradients."""
    return EntryPoint(name, params, backward=True, **kw)


@dataclass(frozen=True)
class OpportunitySpec:
    """A mechanism worth trying (not a patch). ``knobs`` lists the knobs the knob operator may turn for it."""

    kind: str
    mechanism: str
    paths: tuple[str, ...] = ("full", "decode")
    knobs: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ()  # empty: all
    # Knobs of `knobs` the opportunity sets to one value (the mechanism itself, e.g. a switch), the others being
    # sampled around it; a tuple of (name, value) pairs, so the spec stays hashable.
    values: tuple[tuple[str, Any], ...] = ()


@dataclass
class Check:
    """One check's outcome with the evidence a person (or an LLM operator) needs to act on it."""

    name: str
    passed: bool
    kind: str  # "consistency" | "reference" | "finite" | "written" | "fresh" | ...
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "kind": self.kind, "details": self.details}


@dataclass
class Bench:
    """A prepared workload: ``run()`` executes the phase once on device-resident inputs.

    ``verify()`` recomputes on fresh inputs and checks against the reference, so a candidate cannot cache
    results across the timed runs. ``outputs`` are poisoned (NaN) by the engine before verification.
    ``bytes_moved``/``flops`` let reports show achieved bandwidth/throughput.
    """

    run: Callable[[], None]
    verify: Callable[[], list[Check]]
    bytes_moved: int = 0
    flops: int = 0
    graph_friendly: bool = False  # decode-sized launches: time as CUDA-graph replays


class Family(ABC):
    """Base class of every kernel family. Subclasses set the class attributes and implement the methods."""

    name: str
    entry_points: tuple[str, ...]  # the names a file must define (static scan); signatures below say how
    phases: tuple[str, ...]
    # Every function the audit may call, required or optional (see EntryPoint).
    signatures: tuple[EntryPoint, ...] = ()
    knobs: tuple[Knob, ...] = ()
    # Parameters a workload entry must carry besides name/phase/weight/limit, per phase.
    workload_params: dict[str, tuple[str, ...]] = {}

    @property
    def folder(self) -> Path:
        import inspect

        return Path(inspect.getfile(type(self))).parent

    @property
    def root_path(self) -> Path:
        return self.folder / "root.py"

    def root_source(self) -> str:
        return self.root_path.read_text()

    def requirements(self) -> str:
        """The numerical requirements in words (fed to LLM operators; an ablation withholds them)."""
        path = self.folder / "requirements.md"
        return path.read_text() if path.exists() else ""

    def opportunities(self) -> list[OpportunitySpec]:
        return []

    @property
    def sets_path(self) -> Path:
        return self.folder / "sets.yaml"

    def named_sets(self) -> dict[str, dict[str, Any]]:
        """Knob changes against the root, by name, that a campaign may start from (`start.set`): the family
        folder's sets.yaml (none without one). Read once per file; the same dict is returned each time."""
        path = self.sets_path
        return _read_sets(self, path) if path.exists() else {}

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(f"family {self.name!r} has no knob {name!r}")

    def check_knobs(self, changes: dict[str, Any], where: str) -> None:
        """Raise ``ValueError`` naming ``where``, the knob and the legal values for a change outside the space."""
        for name, value in changes.items():
            try:
                knob = self.knob(name)
            except KeyError as e:
                raise ValueError(f"{where}: {e.args[0]}") from None
            if value not in knob.values:
                raise ValueError(f"{where}: {name}={value!r} is not one of {list(knob.values)}")

    def in_effect(self, knobs: dict[str, Any]) -> set[str]:
        """The names in ``knobs`` that matter given the others' values (see ``Knob.when``). A condition on a knob
        absent from ``knobs`` holds (nothing to contradict it)."""
        declared = {k.name: k for k in self.knobs}
        memo: dict[str, bool] = {}

        def on(name: str) -> bool:
            if name not in memo:
                memo[name] = False  # a cycle reads as out of effect; condition_problems() reports it
                knob = declared.get(name)
                memo[name] = knob is None or all(
                    c not in knobs or (knobs[c] in values and on(c)) for c, values in knob.when)
            return memo[name]

        return {name for name in knobs if on(name)}

    def condition_problems(self) -> list[str]:
        """What is wrong with the knobs' `when` declarations: unknown knobs or values, cycles."""
        declared = {k.name: k for k in self.knobs}
        out = []
        for k in self.knobs:
            for c, values in k.when:
                if c not in declared:
                    out.append(f"knob {k.name}: `when` names unknown knob {c!r}")
                elif not values or any(v not in declared[c].values for v in values):
                    out.append(f"knob {k.name}: `when` {c} in {list(values)} is not within {list(declared[c].values)}")

        def cycle(name: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
            if name in seen:
                return (*seen, name)
            for c, _ in declared[name].when if name in declared else ():
                found = cycle(c, (*seen, name))
                if found:
                    return found
            return None

        for k in self.knobs:
            found = cycle(k.name, ())
            if found:
                out.append(f"knob {k.name}: `when` conditions form a cycle {' -> '.join(found)}")
                break
        return out

    def validate_workload(self, workload: dict[str, Any]) -> None:
        """Raise ``ValueError`` naming the key when a workload entry cannot be run by this family."""
        phase = workload.get("phase")
        if phase not in self.phases:
            raise ValueError(f"phase {phase!r} is not one of {list(self.phases)}")
        for key in self.workload_params.get(phase, ()):
            if key not in workload:
                raise ValueError(f"missing key {key!r} (phase {phase!r} needs {list(self.workload_params[phase])})")

    def signature(self, name: str) -> EntryPoint | None:
        for e in self.signatures:
            if e.name == name:
                return e
        return None

    def drawn_cases(self, rng: random.Random) -> list[dict[str, Any]]:
        """Check cases drawn afresh for each audit from ``rng`` (seeded by the judge, unseen by the candidate):
        odd sizes, one row, padded rows, extreme scales. They run after ``check_cases("full")`` in the full stage,
        so a candidate cannot be right only on the fixed shapes. Default: none."""
        return []

    @abstractmethod
    def check_cases(self, level: str) -> list[dict[str, Any]]:
        """Shapes to check at ``level`` "small" (fast gate) or "full" (every consistency case)."""

    @abstractmethod
    def run_checks(self, impl: ModuleType, case: dict[str, Any], seed: int, device: str) -> list[Check]:
        """Consistency (bitwise, bf16 and pre-cast fp32), reference accuracy, finiteness, written outputs."""

    @abstractmethod
    def make_bench(self, impl: ModuleType, workload: dict[str, Any], seed: int, device: str) -> Bench:
        """Prepare one workload for timing (fresh random inputs from ``seed``; never zeros)."""


_SETS: dict[Path, dict[str, dict[str, Any]]] = {}


def _read_sets(family: Family, path: Path) -> dict[str, dict[str, Any]]:
    """sets.yaml: `NAME: {about: TEXT, base: OTHER (optional, declared above), knobs: {KNOB: VALUE}}`; a set with a
    base is the base's knobs updated with its own. Every knob and value is checked against the family's space."""
    if path in _SETS:
        return _SETS[path]
    import yaml

    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of set names, got {type(raw).__name__}")
    sets: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        where = f"{path}: set {name!r}"
        if not isinstance(entry, dict) or set(entry) - {"about", "base", "knobs"}:
            raise ValueError(f"{where}: expected keys about/base/knobs, got {entry!r}")
        base = entry.get("base")
        if base is not None and base not in sets:
            raise ValueError(f"{where}: base {base!r} is not a set declared above it")
        own = entry.get("knobs") or {}
        if not isinstance(own, dict):
            raise ValueError(f"{where}: knobs must be a mapping, got {own!r}")
        family.check_knobs(own, where)
        sets[name] = {**(sets[base] if base else {}), **own}
    _SETS[path] = sets
    return sets
