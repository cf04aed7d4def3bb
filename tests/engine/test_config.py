import pytest

from tik_evo.config import ConfigError, load_campaign
from tik_evo.families import load_family
from tik_evo.workloads import resolve_workloads

from .helpers import ROOT, write_campaign


def test_quickstart_loads_and_overrides():
    cfg = load_campaign(ROOT / "campaigns" / "quickstart.yaml",
                        ["search.max_evaluations=20", "search.sampler=random", "evaluate.timeout_s=60",
                         "store.path=runs/x"])
    assert cfg.search.max_evaluations == 20 and cfg.search.sampler == "random"
    assert cfg.evaluate.timeout_s == 60 and cfg.store.path == "runs/x"


@pytest.mark.parametrize("sections,key", [
    ({"search": {"bogus": 1}}, "search.bogus"),
    ({"search": {"max_evaluations": "many"}}, "search.max_evaluations"),
    ({"search": {"sampler": "magic"}}, "search.sampler"),
    ({"gpu": {"policy": "maybe"}}, "gpu.policy"),
    ({"search": {"operators": ["knob", "nope"]}}, "search.operators"),
    ({"evaluate": {"timeout_s": 0}}, "evaluate.timeout_s"),
    ({"evaluate": {"graph_replay": "sometimes"}}, "evaluate.graph_replay"),
    ({"colour": "blue"}, "colour"),
])
def test_errors_name_file_and_key(tmp_path, sections, key):
    path = write_campaign(tmp_path, **sections)
    with pytest.raises(ConfigError) as e:
        load_campaign(path)
    assert str(path) in str(e.value) and key in str(e.value)


def test_graph_replay_takes_on_and_off_as_yaml_reads_them():
    for text, want in (("on", "on"), ("off", "off"), ("auto", "auto"), ("true", "on")):
        cfg = load_campaign(ROOT / "campaigns" / "quickstart.yaml", [f"evaluate.graph_replay={text}"])
        assert cfg.evaluate.graph_replay == want, text


def test_override_errors_name_the_key():
    with pytest.raises(ConfigError, match="search.max_evaluations"):
        load_campaign(ROOT / "campaigns" / "quickstart.yaml", ["search.max_evaluations=lots"])
    with pytest.raises(ConfigError, match="not of the form"):
        load_campaign(ROOT / "campaigns" / "quickstart.yaml", ["search.max_evaluations"])


def test_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="campaign file not found"):
        load_campaign(tmp_path / "nope.yaml")
    cfg = load_campaign(write_campaign(tmp_path, workloads={"file": "missing.yaml"}))
    with pytest.raises(ConfigError, match="missing.yaml.*not found"):
        resolve_workloads(cfg, load_family("rmsnorm"))


def test_bad_workload_entries(tmp_path):
    wl = tmp_path / "w.yaml"
    family = load_family("rmsnorm")
    cases = {
        "family: attention\nworkloads: [{name: a, phase: full, tokens: 1, hidden: 8}]": "key 'family'",
        "family: rmsnorm\nworkloads: [{name: a, phase: sideways, tokens: 1, hidden: 8}]": "phase 'sideways'",
        "family: rmsnorm\nworkloads: [{name: a, phase: full, hidden: 8}]": "missing key 'tokens'",
        "family: rmsnorm\nworkloads: [{name: a, phase: full, tokens: 1, hidden: 8, weight: -1}]": "key 'weight'",
        "family: rmsnorm\nworkloads: [{name: a, phase: full, tokens: 1, hidden: 8}, "
        "{name: a, phase: full, tokens: 2, hidden: 8}]": "duplicate workload 'a'",
    }
    for text, msg in cases.items():
        wl.write_text(text)
        cfg = load_campaign(write_campaign(tmp_path, workloads={"file": str(wl)}))
        with pytest.raises(ConfigError, match=msg) as e:
            resolve_workloads(cfg, family)
        assert str(wl) in str(e.value)


def test_overrides_and_defaults_applied(tmp_path):
    cfg = load_campaign(write_campaign(tmp_path, workloads={
        "default_limit": 1.2, "overrides": {"full.T12xH1024": {"weight": 3.0}}}))
    ws = {w["name"]: w for w in resolve_workloads(cfg, load_family("rmsnorm"))}
    assert ws["full.T12xH1024"]["weight"] == 3.0 and ws["full.T12xH1024"]["limit"] == 1.2
    assert ws["decode.B3xH1024"]["weight"] == 1.0
    cfg = load_campaign(write_campaign(tmp_path, workloads={"overrides": {"nope": {"weight": 2}}}))
    with pytest.raises(ConfigError, match="'nope' is not in"):
        resolve_workloads(cfg, load_family("rmsnorm"))


def test_unknown_kernel_is_named(tmp_path):
    from tik_evo.cli import main

    assert main(["check", str(write_campaign(tmp_path, kernel="warp_drive"))]) == 2


def test_a_foreign_package_named_kernels_is_named_when_families_cannot_be_imported(monkeypatch, tmp_path):
    # Another installed package may take the import name `kernels` (Hugging Face's, a dependency of transformers
    # 5); without the editable install's finder the families are then not found, and the error says why.
    import re
    import sys
    import types

    from tik_evo import families

    def package(folder):  # a stand-in for the package `kernels` found first, by where it lives
        module = types.ModuleType("kernels")
        module.__path__ = [str(folder)]
        return module

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    monkeypatch.setattr(families, "importlib", types.SimpleNamespace(import_module=missing))
    monkeypatch.setitem(sys.modules, "kernels", package(families.KERNELS_DIR))
    with pytest.raises(families.FamilyError, match="No module named 'kernels.rmsnorm'"):
        families.load_family("rmsnorm")  # tik-evo's own `kernels` is the one imported: the plain error
    foreign = tmp_path / "site-packages" / "kernels"
    monkeypatch.setitem(sys.modules, "kernels", package(foreign))
    expected = f"imported here is {re.escape(str(foreign.resolve()))}, not tik-evo's .*another installed"
    with pytest.raises(families.FamilyError, match=expected):
        families.load_family("rmsnorm")
