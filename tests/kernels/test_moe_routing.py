"""moe_routing family under TRITON_INTERPRET=1 on the CPU: consistency structure, knob variants, backward, a caught
mismatch. The interpreter's dot is exact (tik_evo.interp), so a different division or tie rule in one path shows up."""

from pathlib import Path

import _family
import pytest

from kernels.moe_routing import FAMILY

load, failures = _family.loader(FAMILY)


def test_root_passes_all_cases():
    impl = load()
    assert failures(impl) == []
    assert failures(impl, seeds=(1,), cases=FAMILY.check_cases("small")) == []


@pytest.mark.parametrize("knobs", [
    {"BLOCK_T": 16, "NUM_WARPS": 4, "FULL_TILES_PER_PROGRAM": 4, "DECODE_TILES_PER_PROGRAM": 2},
    {"BLOCK_T": 8, "NUM_WARPS": 2, "FULL_NUM_STAGES": 2},
])
def test_knob_variants_pass(knobs):
    tag = "v" + str(abs(hash(tuple(sorted(knobs.items())))))
    assert failures(load(tag, **knobs)) == []


def test_reciprocal_in_one_path_is_caught():
    edit = lambda s: s.replace("p = e / s[:, None]", "p = e * (1.0 / s[:, None])")  # noqa: E731
    bad = failures(_family.split_paths(load("rf"), load("rd", source_edit=edit)))
    assert any(kind == "consistency" and name.startswith("decode == full") for name, kind, _ in bad), bad
    assert all(kind == "consistency" for _, kind, _ in bad)


def test_ties_to_higher_index_in_one_path_is_caught():
    edit = lambda s: s.replace("idx = tl.min(tl.where(work == v[:, None], cols[None, :], BLOCK_E), 1)",  # noqa: E731
                               "idx = tl.max(tl.where(work == v[:, None], cols[None, :], -1), 1)")
    bad = failures(_family.split_paths(load("tf"), load("td", source_edit=edit)), cases=FAMILY.check_cases("full")[:2])
    assert any(kind == "consistency" and "(ids)" in name for name, kind, _ in bad), bad


def test_workloads_validate():
    import yaml

    spec = yaml.safe_load((Path(__file__).parents[2] / "workloads" / "moe_routing_models.yaml").read_text())
    assert spec["family"] == "moe_routing"
    names = [w["name"] for w in spec["workloads"]]
    assert len(names) == len(set(names))
    for w in spec["workloads"]:
        FAMILY.validate_workload(w)
