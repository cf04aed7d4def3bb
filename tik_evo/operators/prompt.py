"""Build an LLM operator's prompt from the IR. The words live in template files under ``prompts/``
(string.Template); this module only gathers the facts: the parent's source, the family's numerical
requirements, the opportunity, the parent's audit evidence, what was tried along its lineage and, for a
merge, the second parent's changes. The ablation switches remove exactly their own section.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from tik_evo.records import Implementation, Opportunity
from tik_evo.run_state import RunState

PROMPTS = Path(__file__).parent / "prompts"
SCOPE_MEANING = {
    "full": "change only the full-sequence path's schedule; every row's arithmetic must stay as it is",
    "decode": "change only the decode path's schedule; every row's arithmetic must stay as it is",
    "joint": "change both paths together; any change to a row's arithmetic must be made identically in both",
}


def render(name: str, **values: Any) -> str:
    return Template((PROMPTS / name).read_text()).substitute(**{k: str(v) for k, v in values.items()})


@dataclass
class MergeInput:
    other: Implementation
    other_source: str
    other_parent: Implementation | None
    other_parent_source: str
    reason: str


def build_messages(ctx: Any, scope: str, merge: MergeInput | None = None) -> list[dict[str, str]]:
    """The chat messages for one action (``ctx`` is an operators.base.ActionContext)."""
    cfg, store, parent = ctx.cfg, ctx.store, ctx.parent
    state = store.state()
    fam = ctx.family
    requirements = evidence = lineage = merge_text = ""
    if cfg.ablation.numerical_requirements and fam.requirements().strip():
        requirements = render("requirements.md", requirements=fam.requirements().strip())
    if cfg.ablation.evidence and parent.audit:
        evidence = render("evidence.md", parent_id=parent.id, evidence=evidence_text(store, parent, state))
    tried = lineage_text(store, parent, state, cfg.llm.lineage_entries)
    if tried:
        lineage = render("lineage.md", lineage=tried)
    if merge is not None:
        diff = difflib.unified_diff(merge.other_parent_source.splitlines(), merge.other_source.splitlines(),
                                    merge.other_parent.id if merge.other_parent else "parent", merge.other.id,
                                    lineterm="")
        merge_text = render("merge.md", parent_id=parent.id, other_id=merge.other.id, other_reason=merge.reason,
                            other_parent=merge.other_parent.id if merge.other_parent else "-",
                            other_diff="\n".join(diff) or "(no difference)")
    title = (f"merge {merge.other.id} into {parent.id}" if merge else
             f"write a faster offspring of {parent.id}")
    user = render("task.md", title=title, family=fam.name, entry_points=", ".join(fam.entry_points),
                  scope=scope, scope_meaning=SCOPE_MEANING[scope],
                  opportunity=opportunity_text(ctx.opportunity, fam), requirements=requirements,
                  evidence=evidence, lineage=lineage, merge=merge_text, parent_id=parent.id,
                  parent_source=ctx.parent_source.rstrip("\n"),
                  answer_format=render(f"answer_{cfg.llm.answer}.md").rstrip("\n"))
    return [{"role": "system", "content": render("system.md").strip()}, {"role": "user", "content": user}]


def opportunity_text(opp: Opportunity | None, family: Any) -> str:
    if opp is None:
        return "(none: any change you judge worthwhile)"
    lines = [f"{opp.kind} ({opp.id}, from {opp.origin}): {opp.mechanism}", f"paths: {', '.join(opp.paths)}"]
    for name in opp.knobs:
        try:
            k = family.knob(name)
            lines.append(f"knob {name} ({k.role}; values {list(k.values)}): {k.doc}")
        except KeyError:
            lines.append(f"knob {name}")
    if opp.values:
        lines.append("this opportunity sets " + ", ".join(f"{n}={v!r}" for n, v in opp.values.items()))
    return "\n".join(lines)


def evidence_text(store: Any, impl: Implementation, state: RunState) -> str:
    audit = store.get(impl.audit)
    root, limits = state.root_latencies, state.limits
    checks = [c for s in audit.stages for c in s.get("checks", [])]
    failed = [c for c in checks if not c["passed"]]
    verdict = "passed" if audit.passed else f"FAILED {audit.failure_kind}"
    stages = ", ".join(s["name"] for s in audit.stages)
    lines = [f"audit {audit.id}: {verdict}; {len(checks) - len(failed)} of {len(checks)} checks passed ({stages})"]
    lines += [f"failed check {c['name']}: {str(c['details'])[:200]}" for c in failed[:5]]
    lines.append("per workload: latency, ratio to the root, slowdown limit (t <= limit x root)")
    for name, m in audit.measurements.items():
        t, r = m["median_s"], root.get(name)
        lim = limits.get(name, {}).get("limit")
        ratio = f"{t / r:.3f}x root" if r else "root n/a"
        ok = "" if not r or lim is None else ("ok" if t <= lim * r else "OVER LIMIT")
        lines.append(f"- {name} ({m.get('phase', '?')}): {t:.4g} s, {ratio}, limit {lim}x {ok}".rstrip())
    best, rootT = state.best_objective, state.root_objective
    if audit.objective is not None and best and rootT:
        lines.append(f"objective T = {audit.objective:.6g} (best {best:.6g}, root {rootT:.6g}); lower is better")
    return "\n".join(lines)


def ancestors(store: Any, impl: Implementation) -> list[Implementation]:
    """The implementation and its first-parent chain up to the root."""
    chain, seen = [impl], {impl.id}
    while chain[-1].parents and chain[-1].parents[0] not in seen:
        chain.append(store.get(chain[-1].parents[0]))
        seen.add(chain[-1].id)
    return chain


def lineage_text(store: Any, impl: Implementation, state: RunState, limit: int) -> str:
    line_ids = {i.id for i in ancestors(store, impl)}
    acts = [a for a in store.all("A") if a.parents and a.parents[0] in line_ids]
    if not acts:
        return ""
    decisions: dict[str, list[str]] = {}
    for d in store.all("D"):
        decisions.setdefault(d.impl, []).append(d.decision)
    lines = []
    for a in acts[-limit:]:
        what = a.rationale[:160] or _params_text(a.params)
        head = f"- {a.id} {a.operator} ({a.scope}) on {a.parents[0]}: {what}"
        lines.append(f"{head} -> {_outcome(store, a, decisions)}")
    return "\n".join(lines)


def _params_text(params: dict[str, Any]) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in params.items() if not k.startswith(("_", "llm.")))
    if knobs:
        return knobs
    return f"{params.get('llm.action', 'edit')} by {params.get('llm.model', '?')}" if "llm.model" in params else ""


def _outcome(store: Any, a: Any, decisions: dict[str, list[str]]) -> str:
    if a.outcome != "audited" or not a.offspring:
        detail = a.error.splitlines()[0][:160] if a.error else ""
        return f"{a.outcome or 'error'}{': ' + detail if detail else ''}"
    child = store.get(a.offspring)
    audit = store.get(child.audit) if child.audit else None
    if audit is None:
        return f"{child.id} {child.status}"
    if audit.failure_kind:
        return f"{child.id} FAILED {audit.failure_kind}: {audit.failure.splitlines()[0][:160] if audit.failure else ''}"
    parent = store.get(a.parents[0])
    vs = f"{audit.objective / parent.objective:.3f}x parent T" if parent.objective and audit.objective else ""
    return f"{child.id} verified, {vs}, {'/'.join(decisions.get(child.id, [child.status]))}"
