"""`tik-evo bench`: the registry of suites (tik_evo_bench.SUITES, benchmarks/__init__.py) is what the command lists
and runs; every registered suite imports and describes its arguments on a CPU machine (`NAME --help`), GPU-only
ones included; the folder holds no path hacks and no file outside the registry's modules and shared helpers."""

import re
from pathlib import Path

import pytest

import tik_evo_bench
from tik_evo.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_no_name_or_list_prints_every_suite_with_its_device(capsys):
    for argv in (["bench"], ["bench", "--list"]):
        assert main(argv) == 0
        listed = capsys.readouterr().out.splitlines()[1:]
        assert [line.split()[0] for line in listed] == list(tik_evo_bench.SUITES)
        for line, suite in zip(listed, tik_evo_bench.SUITES.values()):
            assert line.split()[1] == ("GPU" if suite.gpu else "CPU") and suite.about in line


@pytest.mark.parametrize("name", list(tik_evo_bench.SUITES))
def test_every_suite_imports_and_parses_help_on_the_cpu(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", name, "--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith(f"usage: tik-evo bench {name}"), usage[:200]


def test_an_unknown_name_is_refused_naming_the_suites(capsys):
    assert main(["bench", "no_such_suite"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'no_such_suite' is not a suite" in err and "model-graphs" in err
    assert main(["bench", "rmsnorm"]) == 2  # a family without a bench of its own: sent to `bench ops`
    assert "tik-evo bench ops --families rmsnorm" in " ".join(capsys.readouterr().err.split())


def test_the_folder_is_the_registry_its_helpers_and_no_path_edits():
    modules = {s.module.removeprefix("tik_evo_bench.") for s in tik_evo_bench.SUITES.values()
               if s.module.startswith("tik_evo_bench.")}
    files = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    assert files == modules | {"__init__", "common"}
    for path in (ROOT / "benchmarks").rglob("*.py"):
        assert not re.search(r"sys\.path\.(insert|append)", path.read_text()), path
    assert not (ROOT / "benchmarks" / "variants").exists()  # knob sets live in kernels/<family>/sets.yaml


def test_the_shared_header_names_date_device_and_versions(tmp_path):
    import torch
    import triton

    from tik_evo_bench.common import header, write_json

    h = header()
    assert set(h) == {"date", "gpu", "torch", "triton"} and re.match(r"\d{4}-\d\d-\d\dT", h["date"])
    assert (h["torch"], h["triton"]) == (torch.__version__, triton.__version__)
    assert header(gpu="cpu (interpreter)")["gpu"] == "cpu (interpreter)"
    path = write_json(tmp_path / "new" / "x.json", {"a": 1, **h})
    assert path.read_text().startswith('{\n "a": 1')


def test_no_test_loads_or_imports_a_benchmark():
    # a test reaches a suite through `tik-evo bench NAME`; library code it needs lives in tik_evo / tik_evo_kernels
    importing = set()
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        assert not re.search(r"\"benchmarks\" / f?\"(?!__init__)[\w{}]+\.py|benchmarks/\w+\.py", text), path
        if re.search(r"import tik_evo_bench|from tik_evo_bench", text):
            importing.add(path.name)
    assert not importing, importing


def test_audit_pick_takes_the_family_before_a_bare_set_name():
    from tik_evo_bench.audit_gpu import pick

    assert pick("attention:a, b,rmsnorm:root") == {"attention:a", "attention:b", "rmsnorm:root"}
    with pytest.raises(SystemExit, match="no family"):
        pick("a,attention:b")


def test_audit_throughput_counts_offspring_after_the_root(tmp_path, capsys):
    import json

    def audit(impl, seconds, kind=None, held=None):
        dev = {"gpu_lock": {"acquired_at": 0.0, "released_at": held}} if held else {}
        return {"type": "audit", "id": f"U{impl[1:]}", "impl": impl, "seconds": seconds, "failure_kind": kind,
                "device": dev, "stages": [{"name": "small", "seconds": 2.0}]}

    state = {"type": "state", "root": "I0", "budgets": {"wall_s": 130.0}, "root_objective": 7.0,
             "best_objective": 7.0}
    base, fast = tmp_path / "base.jsonl", tmp_path / "fast.jsonl"
    base.write_text("\n".join(json.dumps(r) for r in (state, audit("I0", 10.0), audit("I1", 30.0))))
    fast.write_text("\n".join(json.dumps(r) for r in (state, audit("I0", 10.0), audit("I1", 5.0, "screened", 4.0),
                                                         audit("I2", 20.0, None, 18.0), audit("I3", 5.0, "screened"))))
    out = tmp_path / "t.json"
    assert main(["bench", "audit-throughput", f"base={base}", f"fast={fast}", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["base"]["offspring"] == 1 and runs["base"]["offspring_per_min"] == pytest.approx(0.5)
    assert runs["fast"]["offspring"] == 3 and runs["fast"]["failures_by_kind"] == {"screened": 2, "verified": 1}
    assert runs["fast"]["gpu_held_s"] == pytest.approx(22.0) and "fast 3.00x" in out.with_suffix(".md").read_text()
    (tmp_path / "bad.jsonl").write_text(json.dumps({"type": "audit"}))
    assert main(["bench", "audit-throughput", f"x={tmp_path / 'bad.jsonl'}", "--out", str(out)]) == 2
    assert "no state record" in capsys.readouterr().out
