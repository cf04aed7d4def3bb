"""The optimization IR: records linking implementations, opportunities, actions, audits and decisions.

Every record is a plain dataclass stored as JSON; ids are short and typed by their first letter
(I = implementation, O = opportunity, A = action, U = audit, D = lineage decision).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 2  # 2: every value carries a checksum (store_integrity); schema 1 stores are still read

# Implementation statuses. Verified ones are best/active/archived; failed ones never become parents.
BEST, ACTIVE, ARCHIVED, FAILED, ABANDONED = "best", "active", "archived", "failed", "abandoned"
VERIFIED = (BEST, ACTIVE, ARCHIVED)


@dataclass
class Implementation:
    id: str
    source_hash: str
    parents: list[str]
    scope: str  # root | full | decode | joint
    status: str
    action: str | None = None
    audit: str | None = None
    knobs: dict[str, Any] | None = None
    objective: float | None = None  # T(I) = sum_j w_j t_j (or normalised), from its audit
    created: float = 0.0


@dataclass
class Opportunity:
    id: str
    kind: str
    mechanism: str
    paths: list[str]
    knobs: list[str] = field(default_factory=list)
    workloads: list[str] = field(default_factory=list)
    status: str = "pending"  # pending | consumed | withdrawn
    origin: str = "family"  # family | action:<id> | audit:<id> | split:<audit id> | seed:<warm-start point>
    repeatable: bool = False  # knob opportunities stay pending: each value is a new try
    values: dict[str, Any] = field(default_factory=dict)  # exact knob values to try (bundle splits)
    evidence: list[str] = field(default_factory=list)
    uses: int = 0
    created: float = 0.0


@dataclass
class Action:
    id: str
    opportunity: str | None
    parents: list[str]
    scope: str
    operator: str
    rationale: str = ""
    expected: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    trial: int | None = None
    offspring: str | None = None
    outcome: str = ""  # audited | duplicate | no-change | failed-to-apply | error
    error: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    started: float = 0.0
    finished: float = 0.0


@dataclass
class Audit:
    id: str
    impl: str
    stages: list[dict[str, Any]] = field(default_factory=list)
    measurements: dict[str, dict[str, Any]] = field(default_factory=dict)
    best_retimed: dict[str, dict[str, Any]] = field(default_factory=dict)
    objective: float | None = None
    best_objective_same_audit: float | None = None
    margin: float = 0.0
    passed: bool = False
    admissible: bool = False
    promoted: bool = False
    failure_kind: str | None = None
    failure: str = ""
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    timer: str = ""
    device: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Decision:
    id: str
    impl: str
    decision: str  # promote | continue | merge-later | archive | abandon | reactivate
    reason: str
    evidence: list[str] = field(default_factory=list)
    step: int = 0


KINDS: dict[str, type] = {"I": Implementation, "O": Opportunity, "A": Action, "U": Audit, "D": Decision}
TABLES = {"I": "implementation", "O": "opportunity", "A": "action", "U": "audit", "D": "decision"}


def to_dict(record: Any) -> dict[str, Any]:
    return dataclasses.asdict(record)


def from_dict(data: dict[str, Any]) -> Any:
    cls = KINDS[data["id"][0]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})
