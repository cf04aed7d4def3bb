"""The LLM operator: any model litellm knows (config only), prompted from the IR, answering with
search/replace edits or a whole file. One action may make two attempts: when the first answer does not
compile or fails the static scan, the model is asked once more with the error (the repair attempt); both
attempts' tokens and cost are charged to the action and listed in its params.

Merge actions take the parent (the best) and an implementation recorded as "merge-later" by lineage
management, and ask for a source combining both; the second parent is returned in Proposal.parents.
"""

from __future__ import annotations

import time
from typing import Any

from tik_evo import staticscan
from tik_evo.operators.base import ActionContext, Operator, Proposal
from tik_evo.operators.client import CallFailed, LLMClient
from tik_evo.operators.edits import EditError, apply_answer, parse_answer
from tik_evo.operators.prompt import MergeInput, build_messages, render
from tik_evo.records import VERIFIED, Opportunity

SCOPES = ("full", "decode", "joint")


class LLMOperator(Operator):
    name = "llm"
    accepts_follow_ups = True  # the scheduler also offers it opportunities proposed during the run

    def __init__(self) -> None:
        self._client: LLMClient | None = None

    def usable(self, opportunity: Opportunity) -> bool:
        return True

    def client(self, cfg: Any) -> LLMClient:
        if self._client is None:
            self._client = LLMClient(cfg.llm)
        return self._client

    def propose(self, ctx: ActionContext) -> Proposal:
        cfg = ctx.cfg.llm
        client = self.client(ctx.cfg)
        # Conditional parameters of the static space: sampled only when the scheduler chose this operator.
        # A stepped float keeps the space enumerable for the bruteforce sampler.
        model = client.pick(ctx.trial.suggest_float("llm.model_u", 0.0, 1.0, step=0.05))
        sampled = ctx.trial.suggest_categorical("llm.scope", list(SCOPES))
        scope = requested_scope(sampled, ctx.opportunity)
        kind = ctx.trial.suggest_categorical("llm.action", ["edit", "merge"]) if cfg.merge else "edit"
        merge = merge_input(ctx) if kind == "merge" else None
        params: dict[str, Any] = {"llm.model": model.model, "llm.scope": scope, "llm.sampled_scope": sampled,
                                  "llm.action": "merge" if merge else "edit"}
        if kind == "merge" and merge is None:
            params["llm.note"] = "merge sampled, but merges go into the best and none is pending for it; edited"
        messages = build_messages(ctx, scope, merge)
        attempts: list[dict[str, Any]] = []
        prop = Proposal(None, scope, params=params, parents=[merge.other.id] if merge else [])
        base = ctx.parent_source
        deadline = time.monotonic() + cfg.total_timeout_s
        for attempt in (1, 2):
            try:
                reply = client.complete(model, messages, deadline)
            except CallFailed as e:
                attempts.append({"attempt": attempt, **e.record})
                _charge(prop, attempts)
                prop.error = f"LLM call failed ({model.model}): {e}"
                return prop
            attempts.append({"attempt": attempt, **reply.record})
            _charge(prop, attempts)
            ans = parse_answer(reply.text)
            try:
                source, how = apply_answer(base, ans)
            except EditError as e:
                prop.error = f"answer of {model.model} (attempt {attempt}) did not apply: {e}"
                attempts[-1]["error"] = str(e)
                return prop
            attempts[-1].update(applied=how, notes=ans.notes)
            problem = load_problem(source, ctx)
            if problem is None:
                break
            attempts[-1]["error"] = problem
            if attempt == 2 or not cfg.repair:
                prop.error = f"answer of {model.model} does not load (attempt {attempt}): {problem}"
                return prop
            # The repair attempt: the same conversation, plus the error and the broken candidate.
            messages = [*messages, {"role": "assistant", "content": reply.text},
                        {"role": "user", "content": render("repair.md", error=problem, candidate=source)}]
            base = source
        if source == ctx.parent_source:
            prop.error = "no-change"
            return prop
        prop.source = source
        prop.scope = ans.scope or scope
        if ans.scope and ans.scope != scope:
            params["llm.declared_scope"] = ans.scope
        prop.rationale = ans.rationale or f"{params['llm.action']} by {model.model} (no rationale given)"
        prop.expected = ans.expected
        prop.follow_ups = ans.follow_ups
        return prop


def requested_scope(sampled: str, opportunity: Opportunity | None) -> str:
    """An opportunity about one path keeps a one-path request on that path (joint stays joint)."""
    if opportunity is not None and len(opportunity.paths) == 1 and sampled != "joint":
        return opportunity.paths[0]
    return sampled


def _charge(prop: Proposal, attempts: list[dict[str, Any]]) -> None:
    prop.tokens = {"prompt": sum(a.get("prompt_tokens", 0) for a in attempts),
                   "completion": sum(a.get("completion_tokens", 0) for a in attempts)}
    prop.cost_usd = sum(a.get("cost_usd", 0.0) for a in attempts)
    prop.params["llm.attempts"] = attempts


def load_problem(source: str, ctx: ActionContext) -> str | None:
    """Why ``source`` cannot become a candidate (compile error or static-scan refusal), or None."""
    try:
        compile(source, "candidate.py", "exec")
    except SyntaxError as e:
        return f"SyntaxError line {e.lineno}: {e.msg}"
    fam = ctx.family
    bad = [c for c in staticscan.scan(source, fam.entry_points, tuple(k.name for k in fam.knobs)) if not c.passed]
    return "; ".join(f"{c.name}: {c.details}" for c in bad) or None


def merge_input(ctx: ActionContext) -> MergeInput | None:
    """The most recent merge-later implementation still verified, when the parent is the best."""
    store = ctx.store
    if ctx.parent.id != store.state().best:
        return None  # a merge combines into the best; other parents simply get an edit
    done = {a.parents[1] for a in store.all("A")
            if a.params.get("llm.action") == "merge" and a.parents[:1] == [ctx.parent.id] and len(a.parents) > 1}
    for d in reversed(store.all("D")):
        if d.decision != "merge-later" or d.impl == ctx.parent.id or d.impl in done:
            continue
        other = store.get(d.impl)
        if other.status not in VERIFIED or ctx.parent.id in other.parents:
            continue
        op = store.get(other.parents[0]) if other.parents else None
        return MergeInput(other, store.source(other.source_hash), op,
                          store.source(op.source_hash) if op else "", d.reason)
    return None
