"""The run's state: one JSON document in the store's `state` table, read and rewritten by every step's
transaction (docs/ir.md). The records say what happened; the state is where the search stands.

Stored as the dict of its fields, the form the engine has always written, so any run directory loads. Keys this
version does not know are kept and written back. The small documents inside (budgets, limits, history entries,
the queued moves) stay plain dicts, typed here as TypedDicts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypedDict

from tik_evo.records import SCHEMA_VERSION, TABLES


class Budgets(TypedDict):
    wall_s: float  # search wall time, the root's audit included
    tokens: int  # LLM tokens, prompt and completion
    usd: float  # LLM cost


class Limit(TypedDict):
    limit: float  # the campaign's slowdown limit: t_j <= limit_j * t_j(root)
    max_s: float  # that limit in seconds, against the root's time at initialization


class Finished(TypedDict):
    reason: str  # the stop condition, in words
    at: float  # epoch seconds


class Start(TypedDict):
    set: str | None  # the campaign's `start.set`: a named knob set of the family
    knobs: dict[str, Any]  # `start.knobs`, applied after the set


class Moves(TypedDict):
    of: str  # the best whose one-knob moves these are
    left: list[dict[str, Any]]  # moves still queued, as the sampler's fixed parameters
    skip: bool  # the next step goes to the other operators


class HistoryEntry(TypedDict, total=False):
    evaluation: int  # audited offspring so far (0: the root)
    impl: str
    objective: float | None  # its T; None if its audit failed
    best: float  # the best's T after this audit
    promoted: bool
    failed: bool
    admissible: bool  # within every slowdown limit


def _counters() -> dict[str, int]:
    return {kind: 0 for kind in TABLES}


def _budgets() -> Budgets:
    return {"wall_s": 0.0, "tokens": 0, "usd": 0.0}


@dataclass
class RunState:
    schema: int = SCHEMA_VERSION  # the store schema the run was created under
    # -- the run, fixed at initialization
    family: str | None = None  # kernel family name
    device: str | None = None  # "cuda", or "cpu" for the Triton interpreter
    device_facts: dict[str, Any] = field(default_factory=dict)  # campaign GPU, policy, actual GPU, torch version
    workloads: list[dict[str, Any]] = field(default_factory=list)  # the resolved workload specs, as audits get them
    weights: dict[str, float] = field(default_factory=dict)  # workload -> w_j in T = sum_j w_j t_j
    start: Start | None = None  # the campaign's start (None: the family's root as it is)
    started_at: float | None = None  # epoch seconds
    # -- the root and the best
    root: str | None = None  # the root implementation's id, once verified
    best: str | None = None  # the current best's id
    root_objective: float | None = None  # T(root)
    best_objective: float | None = None  # T(best), as judged when it was promoted
    root_latencies: dict[str, float] = field(default_factory=dict)  # workload -> the root's median seconds
    root_latencies_by_gpu: dict[str, dict[str, float]] = field(default_factory=dict)  # GPU index -> the same, per GPU
    limits: dict[str, Limit] = field(default_factory=dict)  # workload -> its slowdown limit
    # -- the lineage
    frontier: list[str] = field(default_factory=list)  # verified parents (best and active), lowest T first
    archive: list[str] = field(default_factory=list)  # verified, set aside, reactivatable
    pending_opportunities: list[str] = field(default_factory=list)  # opportunity ids the scheduler may pick
    kappa: int = 0  # offspring in a row that did not improve the best (κ)
    parent_streak: dict[str, int] = field(default_factory=dict)  # parent -> its offspring in a row without a new best
    sources: dict[str, str] = field(default_factory=dict)  # source hash -> implementation: no source audited twice
    history: list[HistoryEntry] = field(default_factory=list)  # one entry per audit: the best-so-far chart
    # -- progress and budgets
    step: int = 0  # loop steps recorded
    evaluations: int = 0  # audited offspring
    duplicates: int = 0  # proposals that audited nothing (a repeated source, no change, an operator failure)
    duplicates_in_a_row: int = 0  # the same, since the last audit (stops a search whose space is exhausted)
    failures_by_kind: dict[str, int] = field(default_factory=dict)  # failure kind (and over-limit, action) -> count
    budgets: Budgets = field(default_factory=_budgets)  # what the run has spent
    engine_overhead_s: list[float] = field(default_factory=list)  # store + scheduler seconds of the last steps
    moves: Moves | None = None  # search.neighbours: the best's one-knob moves queued ahead of the sampler
    finished: Finished | None = None  # why and when the search stopped; None while it runs or was interrupted
    # -- the store's bookkeeping
    counters: dict[str, int] = field(default_factory=_counters)  # record kind -> the next id's number
    events: int = 0  # events logged: the next event's sequence number
    other: dict[str, Any] = field(default_factory=dict)  # stored keys this version does not know, kept

    # -- the stored form ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _FIELDS}
        return {**self.other, **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        """The state from its stored dict; missing keys take their defaults (a run from before they existed)."""
        known = {k: v for k, v in data.items() if k in _FIELDS}
        return cls(**known, other={k: v for k, v in data.items() if k not in _FIELDS})

    # -- dict-style access by field name, for code written against the stored dict (benchmark scripts, tests) ---
    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            return getattr(self, key)
        return self.other[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in _FIELDS:
            raise KeyError(f"{key!r} is not a field of the run state")
        setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in _FIELDS else self.other.get(key, default)

    # -- updates the loop makes in several places ------------------------------------------------------------------
    def count_failure(self, kind: str) -> None:
        self.failures_by_kind[kind] = self.failures_by_kind.get(kind, 0) + 1


_FIELDS = tuple(f.name for f in dataclasses.fields(RunState) if f.name != "other")
