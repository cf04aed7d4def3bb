import os
from pathlib import Path

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


def test_another_package_named_kernels_does_not_hide_the_families(tmp_path):
    # Hugging Face's `kernels` (which transformers requires) takes the import name `kernels`; tik-evo's families
    # are `tik_evo_kernels`, so both import in one process, from the repository root too.
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'other'\n")
    code = ("import kernels, tik_evo_kernels.rmsnorm as r; from tik_evo.families import load_family; "
            "print(kernels.WHO, r.FAMILY is load_family('rmsnorm'))")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["other", "True"]
    # Run from a checkout without the install (no site-packages, no install finder): the name is mapped by tik_evo.
    code = "import tik_evo, tik_evo_kernels; print(*tik_evo_kernels.__path__)"
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=root, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0 and r.stdout.split() == [str(root / "kernels")], r.stderr[-2000:]


def test_gpu_policy_for_another_gpu():
    from omegaconf import OmegaConf

    from tik_evo.initialization import other_gpu

    cfg = OmegaConf.create({"source_file": "c.yaml"})
    with pytest.raises(ConfigError, match="c.yaml: key 'gpu.policy': msg"):
        other_gpu(cfg, "refuse", "msg", [], "")
    warnings: list[str] = []
    assert other_gpu(cfg, "interpret", "msg", warnings, "") and "interpreter" in warnings[-1]
    assert not other_gpu(cfg, "warn", "msg", warnings, "kept") and warnings[-1].endswith("(policy warn); kept")
