"""Fixtures for the LLM operator tests: a scripted OpenAI-compatible server on 127.0.0.1 and one audited
root run (the only root audit of the suite besides the end-to-end run), copied per test."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

# No network: litellm must use its bundled price map and never phone home.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["TIK_EVO_TEST_KEY"] = "sk-local-test"  # the key reaches the server from the environment only

pytest.importorskip("litellm")

from server import ScriptedServer

CAMPAIGN = ROOT / "campaigns" / "quickstart_llm.yaml"
ROOT_SOURCE = (ROOT / "kernels" / "rmsnorm" / "root.py").read_text()
# Interpreter audits are the slow part (tens of seconds each here): one tiny workload, one timing rep.
FAST = ["workloads.only=[decode.B3xH1024]", "evaluate.interpreter_reps=1", "evaluate.timeout_s=300"]


def model_override(url: str, model: str = "openai/scripted", extra: str = "") -> str:
    return (f'llm.models=[{{model: {model}, api_base: "{url}", api_key_env: TIK_EVO_TEST_KEY, '
            f'temperature: 0.3{extra}}}]')


def make_cfg(url: str, run_dir: Path, *overrides: str, model: str = "openai/scripted"):
    from tik_evo.config import load_campaign

    return load_campaign(CAMPAIGN, [*FAST, f"store.path={run_dir}", model_override(url, model),
                                    "search.operators=[llm]", "llm.timeout_s=5", "llm.total_timeout_s=20",
                                    "llm.backoff_s=0.05", "llm.max_retries=3", *overrides])


def answer(*edits: tuple[str, str], scope: str = "decode", rationale: str = "scripted change",
           follow_ups: list | None = None) -> str:
    meta = {"scope": scope, "rationale": rationale, "expected_effect": "decode a little faster",
            "follow_ups": follow_ups or []}
    body = "".join(f"<<<<<<< SEARCH\n{s}\n=======\n{r}\n>>>>>>> REPLACE\n" for s, r in edits)
    return f"Here is my change.\n```json\n{json.dumps(meta)}\n```\n{body}"


@pytest.fixture(scope="session")
def scripted():
    s = ScriptedServer().start()
    yield s
    s.stop()


@pytest.fixture
def server(scripted):
    scripted.reset()
    yield scripted
    scripted.reset()


@pytest.fixture(scope="session")
def root_run(tmp_path_factory, scripted) -> Path:
    """A run directory whose root has been audited and measured (closed; copy it with ``run_copy``)."""
    from tik_evo.families import load_family
    from tik_evo.initialization import initialize, resolve_device
    from tik_evo.store import Store
    from tik_evo.workloads import resolve_workloads

    run_dir = tmp_path_factory.mktemp("root") / "run"
    cfg = make_cfg(scripted.url, run_dir)
    family = load_family(cfg.kernel)
    device, facts, _ = resolve_device(cfg)
    store = Store.create(run_dir)
    try:
        initialize(store, cfg, family, resolve_workloads(cfg, family), device, facts, log=lambda m: None)
    finally:
        store.close()
    return run_dir


@pytest.fixture
def run_copy(root_run, tmp_path):
    """A fresh writable copy of the audited root run, and a helper to open it for search."""
    from tik_evo.families import load_family
    from tik_evo.store import Store

    dst = tmp_path / "run"
    shutil.copytree(root_run, dst)
    opened: list[Store] = []

    def open_search(server, *overrides: str, model: str = "openai/scripted"):
        from tik_evo.loop import Search

        cfg = make_cfg(server.url, dst, *overrides, model=model)
        store = Store.open_writer(dst)
        opened.append(store)
        return Search(store, cfg, load_family(cfg.kernel)), store, cfg

    yield open_search
    for s in opened:
        s.close()


def pytest_configure(config):
    # pydantic complains about litellm's own TypedDicts when it first builds their schemas; not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:.*ReadOnly.*:UserWarning")
