"""Keys come from the environment, never from a campaign."""

from __future__ import annotations

import pytest
from conftest import CAMPAIGN

from tik_evo.config import ConfigError, load_campaign


def test_campaign_with_api_key_is_refused(tmp_path):
    text = CAMPAIGN.read_text().replace("weight: 1.0, temperature: 0.7}", "weight: 1.0, api_key: sk-123}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("../workloads", str(CAMPAIGN.parent.parent / "workloads")))
    with pytest.raises(ConfigError, match=r"llm\.models\[0\]\.api_key.*environment"):
        load_campaign(bad)


def test_override_with_secret_is_refused():
    with pytest.raises(ConfigError, match="command-line override.*credentials"):
        load_campaign(CAMPAIGN, ["llm.secret=abc"])


def test_models_weights_and_key_env_accepted():
    cfg = load_campaign(CAMPAIGN, ['llm.models=[{model: openai/a, weight: 2, api_key_env: MY_KEY}, {model: ollama/b}]',
                                   "llm.max_tokens=10"])
    assert cfg.llm.models[0].api_key_env == "MY_KEY" and cfg.llm.models[1].weight == 1.0
    with pytest.raises(ConfigError, match="weight"):
        load_campaign(CAMPAIGN, ['llm.models=[{model: openai/a, weight: 0}]'])
