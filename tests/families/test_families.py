"""Every family and every campaign, statically: what `tik-evo check` verifies, for all of them."""

from pathlib import Path

import pytest

from tik_evo.cli import check_family, main
from tik_evo.families import available, load_family
from tik_evo.knobs import read_knobs

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = sorted((ROOT / "campaigns").glob("*.yaml"))


@pytest.mark.parametrize("name", available())
def test_family_root_and_knob_space(name):
    family = load_family(name)
    assert check_family(family) == []
    knobs = read_knobs(family.root_source())
    assert set(knobs) == {k.name for k in family.knobs}
    assert all(k.role in ("contract", "full", "decode") for k in family.knobs)
    assert family.requirements().strip(), "numerical requirements in words are missing"
    assert family.opportunities(), "no initial opportunities"


@pytest.mark.parametrize("campaign", CAMPAIGNS, ids=lambda p: p.stem)
def test_campaign_checks(campaign):
    assert main(["check", str(campaign)]) == 0


def test_every_family_has_a_campaign():
    kernels = {line.split(":", 1)[1].strip() for c in CAMPAIGNS for line in c.read_text().splitlines()
               if line.startswith("kernel:")}
    assert set(available()) <= kernels


# The root of every family through the engine's whole audit (subprocess, checks, benches, fresh inputs) on its
# CPU workload set. Attention is left out here: its audit takes minutes under the interpreter, and
# tests/families/test_attention.py covers its benches.
AUDITED = [n for n in available() if n != "attention" and (ROOT / "workloads" / f"{n}_cpu.yaml").exists()]


@pytest.mark.slow
@pytest.mark.parametrize("name", AUDITED)
def test_root_passes_the_engine_audit(tmp_path, name):
    from tik_evo.audit import AuditJob, run_audit
    from tik_evo.store import source_hash
    from tik_evo.workloads import load_workload_set

    family = load_family(name)
    workloads = load_workload_set(ROOT / "workloads" / f"{name}_cpu.yaml", family)
    src = family.root_source()
    out = run_audit(tmp_path, AuditJob(family, src, source_hash(src), "I0", workloads, [0],
                                       {"timeout_s": 600, "interpreter_reps": 1}, "cpu"))
    assert out.passed, out.failure
    assert set(out.measurements) == {w["name"] for w in workloads}
    assert all(m["timer"] == "wall-interpreter" for m in out.measurements.values())
    fresh = [c for s in out.stages for c in s["checks"] if c["kind"] == "fresh"]
    assert fresh and all(c["passed"] for c in fresh)


def test_kernel_command_writes_a_root_with_a_named_set_and_knobs(tmp_path, capsys):
    family = load_family("attention")
    target = tmp_path / "attention.py"
    # Knob values are read as the knob declares them: 'off' stays a string, 'false' is a bool, '24' an int.
    assert main(["kernel", "attention", "--set", "hopper_bn128_tree_s512", "FULL_WS_BANDS=off",
                 "DECODE_FINISH_SINGLE=false", "FULL_WS_LOADER_REGS=24", "-o", str(target)]) == 0
    knobs = read_knobs(target.read_text())
    want = {**read_knobs(family.root_source()), **family.named_sets()["hopper_bn128_tree_s512"],
            "FULL_WS_BANDS": "off", "DECODE_FINISH_SINGLE": False, "FULL_WS_LOADER_REGS": 24}
    assert knobs == want
    # Without a set or knobs: the root itself, on standard output.
    capsys.readouterr()
    assert main(["kernel", "rmsnorm"]) == 0
    assert capsys.readouterr().out == load_family("rmsnorm").root_source()


@pytest.mark.parametrize("args, message", [
    (["attention", "BLOCK_N=96"], "BLOCK_N='96' is not one of [32, 64, 128]"),
    (["attention", "NOPE=1"], "has no knob 'NOPE'"),
    (["attention", "BLOCK_N"], "'BLOCK_N' is not KNOB=VALUE"),
    (["attention", "--set", "nope"], "key '--set': 'nope' is not a named set"),
    (["attentio"], "unknown kernel family 'attentio'"),
])
def test_kernel_command_names_what_is_wrong(tmp_path, capsys, args, message):
    target = tmp_path / "k.py"
    assert main(["kernel", *args, "-o", str(target)]) == 2
    assert _unwrapped(message) in _unwrapped(capsys.readouterr().err) and not target.exists()


def _unwrapped(text: str) -> str:
    """Text without whitespace: the error console wraps long lines, at spaces and after hyphens."""
    return "".join(text.split())


def test_kernel_command_names_an_unwritable_output(tmp_path, capsys):
    target = tmp_path / "missing-dir" / "k.py"
    assert main(["kernel", "attention", "-o", str(target)]) == 2
    assert _unwrapped(f"-o {target}: No such file or directory") in _unwrapped(capsys.readouterr().err)


def test_kernel_command_lists_sets_and_knobs(capsys):
    assert main(["kernel", "attention", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "hopper_bn128_tree_s512: " in listing and "  BLOCK_N (contract): [32, 64, 128]" in listing
