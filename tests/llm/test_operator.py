"""The LLM operator against the scripted server over real HTTP (litellm is not mocked); no audits here."""

from __future__ import annotations

import io
import time

import pytest
from conftest import answer
from optuna.trial import FixedTrial

from tik_evo.families import load_family
from tik_evo.operators.base import ActionContext
from tik_evo.operators.llm import LLMOperator
from tik_evo.operators.prompt import build_messages

GOOD = ('    "DECODE_NUM_STAGES": 1,', '    "DECODE_NUM_STAGES": 2,')
TRIAL = {"llm.model_u": 0.5, "llm.scope": "decode", "llm.action": "edit"}


def context(store, cfg, params=TRIAL):
    parent = store.get("I0")
    return ActionContext(load_family("rmsnorm"), parent, store.source(parent.source_hash), store.get("O4"),
                         cfg, store, FixedTrial(dict(params)))


def user_prompt(store, cfg):
    return build_messages(context(store, cfg), "decode")[1]["content"]


def test_prompt_sections_and_each_ablation(run_copy, server):
    _, store, cfg = run_copy(server)
    base = user_prompt(store, cfg)
    for needle in ("Numerical requirements", "bit-identical whichever entry point", "Audit evidence for the parent I0",
                   "decode.B3xH1024 (decode)", "1.000x root", "decode_schedule", "DECODE_NUM_STAGES",
                   "Requested scope: **decode**", "<<<<<<< SEARCH", 'KNOBS = {'):
        assert needle in base, needle
    sections = {"ablation.numerical_requirements=false": "Numerical requirements",
                "ablation.evidence=false": "Audit evidence"}
    for override, gone in sections.items():
        text = user_prompt(store, _cfg(cfg, override))
        assert gone not in text
        other = next(v for k, v in sections.items() if k != override)
        assert other in text  # each switch removes only its own section
    # The lineage switches do not touch the prompt; they change decisions and parent choice (lineage.py).
    for override in ("ablation.lineage_management=false", "ablation.branch_exploration=false"):
        assert user_prompt(store, _cfg(cfg, override)) == base


def _cfg(cfg, override):
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))


def test_malformed_edit_is_failed_action_and_shows_in_lineage(run_copy, server):
    search, store, _ = run_copy(server)
    server.push({"content": answer(("KNOBS = {'NOT': 'THERE'}", "x"))}, {"content": "no edits at all"})
    search.step(store.state())
    a = store.get("A0")
    assert a.outcome == "failed-to-apply" and "SEARCH text not found" in a.error and a.offspring is None
    assert a.tokens == {"prompt": 100, "completion": 20}
    search.step(store.state())
    assert "neither SEARCH/REPLACE" in store.get("A1").error
    # The second prompt tells the model what already failed from this parent.
    prompt = server.requests[1]["messages"][1]["content"]
    assert "A0 llm" in prompt and "failed-to-apply: answer of openai/scripted" in prompt
    # The key came from the environment variable named in the config, over HTTP.
    assert server.requests[0]["_auth"] == "Bearer sk-local-test"
    assert server.requests[0]["temperature"] == 0.3
    assert store.state()["evaluations"] == 0


def test_429_then_success(run_copy, server):
    _, store, cfg = run_copy(server)
    server.push({"status": 429, "content": "slow down", "retry_after": "0.6"},
                {"content": answer(GOOD), "usage": (300, 40)})
    t0 = time.time()
    prop = LLMOperator().propose(context(store, cfg))
    assert time.time() - t0 >= 0.6  # the server's Retry-After beats the 0.05 s backoff
    assert prop.error == "" and '"DECODE_NUM_STAGES": 2' in prop.source and prop.scope == "decode"
    rec = prop.params["llm.attempts"][0]
    assert rec["retries"] == 1 and rec["errors"][0].startswith("rate-limit")
    assert prop.tokens == {"prompt": 300, "completion": 40} and len(server.requests) == 2


def test_500_storm_bounded_then_run_goes_on(run_copy, server):
    search, store, _ = run_copy(server, "llm.max_retries=2")
    server.push(*[{"status": 500, "content": "boom"}] * 3, {"status": 503}, {"content": answer(("nope", "x"))})
    search.step(store.state())
    assert len(server.requests) == 3  # one call + max_retries, never more
    a = store.get("A0")
    assert a.outcome == "failed-to-apply" and "LLM call failed" in a.error and "3 attempts failed" in a.error
    assert a.params["llm.attempts"][0]["retries"] == 2
    search.step(store.state())  # the run goes on: the next step calls again
    assert len(server.requests) == 5 and store.get("A1").outcome == "failed-to-apply"


def test_server_that_never_answers_times_out(run_copy, server):
    _, store, cfg = run_copy(server, "llm.timeout_s=1", "llm.total_timeout_s=2.5", "llm.max_retries=5")
    server.push(*[{"hang": 30}] * 6)
    t0 = time.time()
    prop = LLMOperator().propose(context(store, cfg))
    assert time.time() - t0 < 6  # bounded by total_timeout_s (plus one call's slack)
    assert prop.source is None and "LLM call failed" in prop.error
    assert any(e.startswith("timeout") for e in prop.params["llm.attempts"][0]["errors"])


def test_repair_attempt_after_compile_error(run_copy, server):
    _, store, cfg = run_copy(server)
    broken = ('    "DECODE_NUM_STAGES": 1,', '    "DECODE_NUM_STAGES": (2,')
    fix = ('    "DECODE_NUM_STAGES": (2,', '    "DECODE_NUM_STAGES": 2,')
    server.push({"content": answer(broken), "usage": (1000, 50)}, {"content": answer(fix), "usage": (1200, 30)})
    prop = LLMOperator().propose(context(store, cfg))
    assert prop.error == "" and '"DECODE_NUM_STAGES": 2,' in prop.source
    first, second = prop.params["llm.attempts"]
    assert "SyntaxError" in first["error"] and second["attempt"] == 2 and "error" not in second
    assert prop.tokens == {"prompt": 2200, "completion": 80}
    assert "did not produce a loadable candidate" in server.requests[1]["messages"][-1]["content"]
    # Only one repair: a second broken answer is a failed action.
    server.push({"content": answer(broken)}, {"content": answer(('    "DECODE_NUM_STAGES": (2,', "import os"))})
    prop = LLMOperator().propose(context(store, cfg))
    assert prop.source is None and "attempt 2" in prop.error and len(prop.params["llm.attempts"]) == 2


@pytest.mark.parametrize("model,extra,expect", [
    ("openai/gpt-4o-mini", [], "litellm"),  # a priced model: litellm's bundled price map
    ("openai/scripted", ["llm.models[0].input_usd_per_mtok=3", "llm.models[0].output_usd_per_mtok=15"], 3e-6),
    ("openai/scripted", [], 0.0),  # an unknown local model costs nothing
])
def test_token_and_cost_sums_and_status(run_copy, server, model, extra, expect):
    import litellm

    from tik_evo.report import operator_accounting, status

    search, store, _ = run_copy(server, *extra, model=model)
    server.default = lambda body: {"content": answer(("nope", "x")), "usage": (1000, 100),
                                   "model": body["model"]}
    for _ in range(3):
        search.step(store.state())
    actions = store.all("A")
    per_call = sum(a.cost_usd for a in actions) / 3
    if expect == "litellm":
        want = litellm.model_cost["gpt-4o-mini"]
        assert per_call == pytest.approx(1000 * want["input_cost_per_token"] + 100 * want["output_cost_per_token"])
        assert per_call > 0
    else:
        assert per_call == pytest.approx(expect * 1000 + (15e-6 * 100 if expect else 0))
    b = store.state()["budgets"]
    assert b["tokens"] == 3300 and b["usd"] == pytest.approx(sum(a.cost_usd for a in actions))
    n, calls, p, c, _ = operator_accounting(actions)["llm"]
    assert (n, calls, p, c) == (3, 3, 3000, 300)
    from rich.console import Console

    console = Console(width=160, record=True, file=io.StringIO())
    console.print(status(store))
    text = console.export_text()
    assert "operator llm" in text and "3 actions, 3 LLM calls, tokens 3000 prompt + 300 completion" in text


def test_token_budget_stops_the_run(run_copy, server):
    search, store, _ = run_copy(server, "llm.max_tokens=250")
    server.default = lambda body: {"content": answer(("nope", "x")), "usage": (100, 20)}
    reason = search.run()
    assert reason == "token budget used (360/250)"
    assert len(store.all("A")) == 3 and store.state()["finished"]["reason"] == reason


def test_usd_budget_stops_the_run(run_copy, server):
    search, store, _ = run_copy(server, "llm.max_usd=0.01", "llm.models[0].input_usd_per_mtok=4")
    server.default = lambda body: {"content": answer(("nope", "x")), "usage": (1000, 10)}  # $0.004 per call
    assert search.run() == "USD budget used (0.01/0.01)"
    assert len(store.all("A")) == 3


def test_weighted_model_choice_and_file_answer_prompt(run_copy, server):
    from tik_evo.operators.client import LLMClient

    _, store, cfg = run_copy(server)
    two = _cfg(cfg, 'llm.models=[{model: openai/a, weight: 3}, {model: openai/b, weight: 1}]')
    client = LLMClient(two.llm)
    assert [client.pick(u).model for u in (0.0, 0.5, 0.74, 0.76, 0.999)] == ["openai/a"] * 3 + ["openai/b"] * 2
    text = user_prompt(store, _cfg(cfg, "llm.answer=file"))
    assert "complete new source file" in text and "<<<<<<< SEARCH" not in text
