"""End to end: `tik-evo run campaigns/quickstart_llm.yaml` with knob and LLM operators, the LLM being the
scripted server (its answers turn the decode pipelining knob of whatever parent it is shown)."""

from __future__ import annotations

import re

from conftest import CAMPAIGN, FAST, answer, model_override

from tik_evo.cli import main
from tik_evo.store import Store


def turn_decode_stages(body: dict) -> dict:
    prompt = body["messages"][-1]["content"]
    n = int(re.findall(r'"DECODE_NUM_STAGES": (\d)', prompt)[-1])
    line = '    "DECODE_NUM_STAGES": {},'
    return {"content": answer((line.format(n), line.format(n % 3 + 1)), scope="decode"), "usage": (900, 60)}


def test_quickstart_llm_mixes_knob_and_llm(server, tmp_path, capsys):
    server.default = turn_decode_stages
    run_dir = tmp_path / "qs"
    rc = main(["run", str(CAMPAIGN), *FAST, f"store.path={run_dir}", model_override(server.url),
               "search.max_evaluations=2", "llm.backoff_s=0.05", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "evaluation budget used (2/2)" in out
    with Store.open_reader(run_dir) as store:
        actions = store.all("A")
        st = store.state()
    ops = {a.operator for a in actions}
    assert ops == {"knob", "llm"}, [(a.operator, a.outcome) for a in actions]
    llm = [a for a in actions if a.operator == "llm"]
    assert st["budgets"]["tokens"] == 960 * len(llm) == sum(sum(a.tokens.values()) for a in actions)
    assert len(server.requests) == len(llm)
    assert "operator llm" in out and "operator knob" in out
