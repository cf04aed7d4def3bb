"""logprob family under TRITON_INTERPRET=1 on the CPU: consistency structure, knob variants, backward, a caught
mismatch. The interpreter's dot is exact (tik_evo.interp), so a different vocabulary chunk in one path shows up."""

from pathlib import Path

import _family
import pytest

from tik_evo_kernels.logprob import FAMILY

load, failures = _family.loader(FAMILY)


def test_root_passes_all_cases():
    impl = load()
    assert failures(impl) == []
    assert failures(impl, seeds=(1,), cases=FAMILY.check_cases("small")) == []


@pytest.mark.parametrize("knobs", [
    {"VOCAB_SPLIT": 8192, "VOCAB_CHUNK": 1024, "NUM_WARPS": 8, "DECODE_SPLIT_PARALLEL": True},
    {"VOCAB_SPLIT": 8192, "VOCAB_CHUNK": 2048, "FULL_SPLIT_PARALLEL": True, "DECODE_SPLIT_PARALLEL": False},
    {"SOFTMAX_FORM": "exp"},  # the previous formula
    {"SOFTMAX_FORM": "exp", "VOCAB_SPLIT": 8192, "VOCAB_CHUNK": 1024},
    {"SOFTMAX_FORM": "exp2", "VOCAB_SPLIT": 0, "VOCAB_CHUNK": 512},  # many full chunks, rescales, one tail
    # Prefetch in one path only (a schedule knob): full and decode must still agree; with splits of one chunk
    # the prefetch loop has no iterations, and vocabularies below a chunk have no full chunk at all.
    {"VOCAB_SPLIT": 0, "VOCAB_CHUNK": 512, "FULL_PREFETCH": True},
    {"VOCAB_SPLIT": 1024, "VOCAB_CHUNK": 1024, "DECODE_PREFETCH": True, "DECODE_SPLIT_PARALLEL": False},
])
def test_knob_variants_pass(knobs):
    tag = "v" + str(abs(hash(tuple(sorted(knobs.items())))))
    assert failures(load(tag, **knobs)) == []


@pytest.mark.parametrize("full_knobs,decode_knobs", [
    ({"VOCAB_CHUNK": 2048}, {"VOCAB_CHUNK": 1024}),
    ({"VOCAB_SPLIT": 0}, {"VOCAB_SPLIT": 2048}),
    ({"SOFTMAX_FORM": "exp2"}, {"SOFTMAX_FORM": "exp"}),
])
def test_contract_mismatch_is_caught(full_knobs, decode_knobs):
    impl = _family.split_paths(load("mf", **full_knobs), load("md", **decode_knobs))
    case = [c for c in FAMILY.check_cases("full") if c["vocab"] > 4000]
    bad = failures(impl, cases=case)
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad
    assert all(kind == "consistency" for _, kind, _ in bad)


def test_temperature_divides_in_both_paths():
    # Multiplying by a reciprocal in one path is a mismatch the checks must catch.
    edit = lambda s: s.replace("z = z / temperature", "z = z * (1.0 / temperature)")  # noqa: E731
    impl = _family.split_paths(load("tf"), load("td", source_edit=edit))
    case = [c for c in FAMILY.check_cases("full") if c["temperature"] != 1.0][:1]
    bad = failures(impl, cases=case)
    assert any(kind == "consistency" for _, kind, _ in bad), bad


def test_workloads_validate():
    import yaml

    spec = yaml.safe_load((Path(__file__).parents[2] / "workloads" / "logprob_models.yaml").read_text())
    assert spec["family"] == "logprob"
    names = [w["name"] for w in spec["workloads"]]
    assert len(names) == len(set(names))
    for w in spec["workloads"]:
        FAMILY.validate_workload(w)
