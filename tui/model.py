"""What the TUI shows, computed from one store snapshot: no Textual here, so it is testable on its own.

Every number on screen comes from this module, so the panes agree with each other (a frontier row and the
detail pane show the same speed-up because they call the same function).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tik_evo.lineage import root_latencies
from tik_evo.records import VERIFIED
from tik_evo.run_state import RunState

INTERP_TIMER = "wall-interpreter"
INTERP_NOTE = "Triton interpreter: CPU wall clock, not GPU time"
STATUS_STYLE = {"best": "bold green", "active": "cyan", "archived": "yellow", "failed": "red",
                "abandoned": "magenta", "pending": "cyan", "consumed": "dim", "withdrawn": "magenta"}


def path_of(phase: str | None) -> str:
    # Families name their phases differently (full/decode, prefill/train_forward/decode); only decode is
    # special to the search, so every other phase counts toward the "full" path.
    return "decode" if phase == "decode" else "full"


def median(m: Any) -> float | None:
    """A latency from a measurement dict or a bare float (root_latencies may hold either)."""
    if isinstance(m, dict):
        m = m.get("median_s")
    return float(m) if isinstance(m, (int, float)) else None


def fmt_s(t: float | None) -> str:
    if t is None:
        return "—"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs"


def fmt_x(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}×"


@dataclass
class RunConfig:
    """The few budget/threshold numbers the TUI needs from RUN_DIR/config.yaml (missing keys stay None)."""

    kappa_threshold: float | None = None
    max_evaluations: float | None = None
    wall_time_s: float | None = None
    max_tokens: float | None = None
    max_usd: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> RunConfig:
        path = Path(run_dir) / "config.yaml"
        if not path.exists():
            return cls()
        import yaml  # the resolved config is plain YAML; OmegaConf is not needed to read it

        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError:
            return cls()
        search, llm = raw.get("search") or {}, raw.get("llm") or {}
        # llm.max_tokens / llm.max_usd are run budgets where 0 means unlimited (tik_evo/config.py).
        return cls(search.get("kappa_threshold"), search.get("max_evaluations"), search.get("wall_time_s"),
                   _positive(llm.get("max_tokens")), _positive(llm.get("max_usd")), raw)


def _positive(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) and x > 0 else None


@dataclass
class WorkloadRow:
    name: str
    path: str
    latency: float | None
    vs_root: float | None  # speed-up over the root on this workload
    of_limit: float | None  # latency / allowed maximum; > 1 breaks the no-regression limit
    vs_parent: float | None  # speed-up over the primary parent
    timer: str


class RunView:
    """One consistent view of a run: the snapshot plus derived tables."""

    def __init__(self, snap: dict[str, Any], config: RunConfig | None = None):
        self.state: RunState = snap["state"]
        self.config = config or RunConfig()
        self.impls = {r.id: r for r in snap["I"]}
        self.opps = {r.id: r for r in snap["O"]}
        self.actions = {r.id: r for r in snap["A"]}
        self.audits = {r.id: r for r in snap["U"]}
        self.decisions = list(snap["D"])
        self.root_id: str | None = self.state.root or next((i.id for i in snap["I"] if not i.parents), None)
        self.weights: dict[str, float] = self.state.weights

    # -- lookups ---------------------------------------------------------------------------------------------
    def audit_of(self, impl_id: str | None) -> Any:
        impl = self.impls.get(impl_id or "")
        return self.audits.get(impl.audit or "") if impl else None

    def action_of(self, impl_id: str | None) -> Any:
        impl = self.impls.get(impl_id or "")
        return self.actions.get(impl.action or "") if impl else None

    def operator_of(self, impl_id: str) -> str:
        action = self.action_of(impl_id)
        return action.operator if action else ("root" if impl_id == self.root_id else "—")

    def is_interp(self, audit: Any) -> bool:
        if audit is None:
            return False
        return audit.timer == INTERP_TIMER or any(
            m.get("timer") == INTERP_TIMER for m in audit.measurements.values() if isinstance(m, dict))

    @property
    def any_interp(self) -> bool:
        return any(self.is_interp(a) for a in self.audits.values())

    def impl_for_ref(self, ref: str) -> str | None:
        """The implementation an evidence/origin reference points at (I…, U…, A…, action:A3, audit:U4)."""
        ref = ref.split(":", 1)[-1].strip()
        if ref in self.impls:
            return ref
        if ref in self.audits:
            return self.audits[ref].impl
        if ref in self.actions:
            return self.actions[ref].offspring or (self.actions[ref].parents or [None])[0]
        return None

    # -- latencies and speed-ups -------------------------------------------------------------------------------
    def latency(self, impl_id: str | None, workload: str) -> float | None:
        audit = self.audit_of(impl_id)
        return median(audit.measurements.get(workload)) if audit else None

    def root_latency(self, workload: str, impl_id: str | None = None) -> float | None:
        """The root's time on `workload`, as timed on the GPU that audited `impl_id` (concurrent audits time the
        root on each of their GPUs), else at initialization."""
        audit = self.audit_of(impl_id) if impl_id else None
        gpu = audit.device.get("gpu_index") if audit else None
        t = median((root_latencies(self.state, gpu) if self.state.root_latencies else {}).get(workload))
        return t if t is not None else self.latency(self.root_id, workload)

    def workload_paths(self) -> dict[str, str]:
        """workload -> full|decode, from any audit's measurement phase (the limits table as a fallback)."""
        out: dict[str, str] = {}
        for audit in self.audits.values():
            for w, m in audit.measurements.items():
                if isinstance(m, dict) and "phase" in m:
                    out.setdefault(w, path_of(m["phase"]))
        for w in self.state.limits:
            out.setdefault(w, path_of("decode" if "decode" in w else "full"))
        return out

    def speedup(self, impl_id: str) -> float | None:
        impl = self.impls.get(impl_id)
        root_obj = self.state.root_objective
        if root_obj is None and self.root_id in self.impls:
            root_obj = self.impls[self.root_id].objective
        if impl and impl.objective and root_obj:
            return root_obj / impl.objective
        return self._weighted(impl_id, None)

    def path_speedups(self, impl_id: str) -> dict[str, float | None]:
        return {p: self._weighted(impl_id, p) for p in ("full", "decode")}

    def _weighted(self, impl_id: str, path: str | None) -> float | None:
        # Speed-up on a path is sum w*t_root / sum w*t over that path's workloads; a missing timing on
        # any of them leaves the ratio undefined rather than quietly biased.
        num = den = 0.0
        for w, p in self.workload_paths().items():
            if path is not None and p != path:
                continue
            t, r = self.latency(impl_id, w), self.root_latency(w, impl_id)
            if t is None or r is None:
                return None
            wt = float(self.weights.get(w, 1.0))
            num, den = num + wt * r, den + wt * t
        return num / den if den else None

    def workload_rows(self, impl_id: str) -> list[WorkloadRow]:
        audit, impl = self.audit_of(impl_id), self.impls.get(impl_id)
        if audit is None or impl is None:
            return []
        limits = self.state.limits
        parent = impl.parents[0] if impl.parents else None
        rows = []
        for w, m in audit.measurements.items():
            t = median(m)
            r, pt = self.root_latency(w, impl_id), self.latency(parent, w)
            max_s = (limits.get(w) or {}).get("max_s") or (audit.limits.get(w) or {}).get("max_s")
            if max_s is None and r is not None and (limits.get(w) or {}).get("limit"):
                max_s = r * limits[w]["limit"]
            rows.append(WorkloadRow(
                w, path_of(m.get("phase") if isinstance(m, dict) else None), t,
                r / t if r and t else None, t / max_s if t and max_s else None,
                pt / t if pt and t else None,
                (m.get("timer") if isinstance(m, dict) else None) or audit.timer or "?"))
        return rows

    # -- panes ------------------------------------------------------------------------------------------------
    def frontier(self) -> list[Any]:
        """Verified implementations, best objective first (unmeasured ones last)."""
        rows = [i for i in self.impls.values() if i.status in VERIFIED]
        return sorted(rows, key=lambda i: (i.objective is None, i.objective or 0.0, int(i.id[1:])))

    def history(self) -> list[tuple[float | None, bool]]:
        """(best-so-far speed-up, promoted here?) per evaluation.

        The run state's history is authoritative; the audits' promoted flags are the fallback for stores
        written without it.
        """
        root_obj = self.state.root_objective
        hist = self.state.history
        if root_obj and hist and all(isinstance(h, dict) and "best" in h for h in hist):
            return [(root_obj / h["best"] if h.get("best") else None,
                     bool(h.get("promoted")) and h.get("impl") != self.root_id) for h in hist]
        out: list[tuple[float | None, bool]] = []
        best: float | None = None
        for audit in sorted(self.audits.values(), key=lambda a: int(a.id[1:])):
            promoted = bool(audit.promoted) or (best is None and audit.impl == self.root_id)
            if promoted:
                best = self.speedup(audit.impl) or best
            out.append((best, promoted and audit.impl != self.root_id))
        return out

    def children(self) -> dict[str | None, list[str]]:
        """Primary parent -> offspring ids; a merge shows under its first parent and names the others."""
        kids: dict[str | None, list[str]] = {}
        for impl in sorted(self.impls.values(), key=lambda i: int(i.id[1:])):
            parent = impl.parents[0] if impl.parents and impl.parents[0] in self.impls else None
            kids.setdefault(parent, []).append(impl.id)
        return kids

    def diff(self, impl_id: str, source: Any) -> str:
        """Unified diff of the source against the primary parent's (``source`` maps a hash to text)."""
        impl = self.impls[impl_id]
        new = source(impl.source_hash)
        parent = self.impls.get(impl.parents[0]) if impl.parents else None
        if parent is None:
            return new
        old = source(parent.source_hash)
        lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     fromfile=f"{parent.id}", tofile=f"{impl.id}", n=2)
        return "".join(lines) or "(source identical to the parent's)"
