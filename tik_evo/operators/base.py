"""The operator interface: given a parent and an opportunity, write one complete offspring source."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from tik_evo.family import Family
from tik_evo.records import Implementation, Opportunity


@dataclass
class ActionContext:
    family: Family
    parent: Implementation
    parent_source: str
    opportunity: Opportunity | None
    cfg: DictConfig
    store: Any  # tik_evo.store.Store, read access for IR-guided operators
    trial: Any  # optuna.Trial: operators sample their own conditional parameters from it
    second_parent: Implementation | None = None  # merges
    second_source: str | None = None


@dataclass
class Proposal:
    source: str | None  # None: the operator could not produce an offspring (see error)
    scope: str  # full | decode | joint
    rationale: str = ""
    expected: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    follow_ups: list[dict[str, Any]] = field(default_factory=list)  # new opportunities: kind, mechanism, paths
    tokens: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    error: str = ""
    parents: list[str] = field(default_factory=list)  # extra parents (merges)


class Operator(ABC):
    name: str

    def usable(self, opportunity: Opportunity) -> bool:
        """Whether this operator can act on ``opportunity``."""
        return True

    @abstractmethod
    def propose(self, ctx: ActionContext) -> Proposal: ...

    def after_audit(self, ctx: ActionContext, proposal: Proposal, verdict: Any) -> list[dict[str, Any]]:
        """Opportunities to add once the offspring's verdict is known (same form as Proposal.follow_ups)."""
        return []
