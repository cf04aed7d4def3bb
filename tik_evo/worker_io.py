"""What crosses between the engine and an audit's judge (:mod:`tik_evo.worker`), as files in RUN/audits/<id>/:
the job the engine writes (job.json) and the result the judge rewrites after every stage (result.json).

Both are JSON (never pickle: the judge's directory is one a candidate's process could reach). This module
imports nothing heavy: the fork server and the judge load it before anything else.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class WorkerJob:
    """One audit as the judge receives it."""
    family: str  # the kernel family's name (the judge loads the family itself)
    run_dir: str  # the run directory: hidden from the candidate's runner, home of the Triton caches
    source: str  # the candidate's source text
    source_hash: str
    workloads: list[dict[str, Any]]  # the resolved workload specs, timed in this order
    seeds: list[int]  # correctness seeds: the small stage uses the first, the full stage all
    evaluate: dict[str, Any]  # the campaign's `evaluate` section
    device: str  # "cuda" | "cpu"
    result_path: str  # where the judge writes its WorkerResult
    best_source: str | None = None  # the current best's source as the IR holds it, re-timed after the candidate
    best_hash: str | None = None
    ancestors: list[str] = field(default_factory=list)  # source hashes whose compiled kernels the runner may read
    bench_seed: int = 0  # recorded with the job; timing inputs come from a secret seed the judge draws
    time: bool = True  # run the timing stages (False: checks only)
    screen: dict[str, Any] | None = None  # evaluate.screen's reference (tik_evo.screen.spec), None: no screen

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> WorkerJob:
        return cls(**json.loads(text))


@dataclass
class StageResult:
    """One stage of an audit, as the judge records it and the audit record keeps it (a dict in the IR)."""
    name: str  # static | import | small | full | graph | repeat | timing | best | outcome
    passed: bool
    seconds: float = 0.0
    checks: list[dict[str, Any]] = field(default_factory=list)  # Check.to_dict() of every check the stage made
    error: str = ""  # the traceback or message that stopped it, if any
    failure_kind: str = ""  # the kind its failure counts as ("" when it passed)
    other: dict[str, Any] = field(default_factory=dict)  # keys the judge added that this version does not name

    def to_dict(self) -> dict[str, Any]:
        return {**self.other, **{f: getattr(self, f) for f in _STAGE_FIELDS}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageResult:
        return cls(**{k: v for k, v in data.items() if k in _STAGE_FIELDS},
                   other={k: v for k, v in data.items() if k not in _STAGE_FIELDS})


_STAGE_FIELDS = tuple(f.name for f in dataclasses.fields(StageResult) if f.name != "other")


@dataclass
class WorkerResult:
    """The judge's result file: read back by the engine once the judge has exited (or been killed: then it
    holds the stages finished before that)."""
    stages: list[StageResult] = field(default_factory=list)
    measurements: dict[str, dict[str, Any]] = field(default_factory=dict)  # workload -> the candidate's timing
    best_retimed: dict[str, dict[str, Any]] = field(default_factory=dict)  # workload -> the best's, same audit
    device: dict[str, Any] = field(default_factory=dict)  # GPU, versions, check processes
    sandbox: dict[str, Any] = field(default_factory=dict)  # what the runner's sandbox enforced
    done: bool = False  # the judge got through every stage (it stops at the first that fails)
    other: dict[str, Any] = field(default_factory=dict)  # what else the judge recorded (drawn cases, ...)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerResult:
        names = {f.name for f in dataclasses.fields(cls)} - {"stages", "other"}
        return cls([StageResult.from_dict(s) for s in data.get("stages", [])],
                   **{k: v for k, v in data.items() if k in names},
                   other={k: v for k, v in data.items() if k not in names and k != "stages"})

    @classmethod
    def read(cls, path: Path) -> WorkerResult:
        """The result at `path`; an empty one if the judge wrote none (it died before its first stage)."""
        return cls.from_dict(read_json(path))


def read_json(path: Path) -> dict[str, Any]:
    """A result file's contents; {} if it is missing or unreadable (its writer died first)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
