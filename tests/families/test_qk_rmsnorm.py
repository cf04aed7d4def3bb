"""qk_rmsnorm family under TRITON_INTERPRET=1 on the CPU: consistency structure, knobs, a caught mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("qk_rmsnorm")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"HEADS_PER_TILE": 4, "NUM_WARPS": 2},
    {"HEADS_PER_TILE": 32, "FULL_TILES_PER_PROGRAM": 4, "DECODE_TILES_PER_PROGRAM": 2},
    {"CAST_BEFORE_WEIGHT": True, "HEADS_PER_TILE": 2},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_contract_mismatch_is_caught():
    bad = R.failures(FAM, R.hybrid(FAM, {"CAST_BEFORE_WEIGHT": True}, {"CAST_BEFORE_WEIGHT": False}))
    assert any(kind == "consistency" and "decode" in name and "fp32" in name for name, kind, _ in bad)


def test_bench_runs_and_verifies():
    w = {"name": "t", "phase": "full", "tokens": 5, "q_heads": 4, "kv_heads": 2, "head_dim": 128}
    b = FAM.make_bench(R.load_with_knobs(FAM), w, 0, "cpu")
    b.run()
    assert all(c.passed for c in b.verify())


@pytest.mark.parametrize("phase", ["decode", "full"])
def test_fresh_verify_catches_a_path_that_skips_the_normalisation(phase):
    # Fresh (token, head) rows over four decades of scale: y = x * w is off by orders of magnitude.
    root = R.load_with_knobs(FAM)
    cheat = R.load_source(R.skips_normalisation(FAM.root_source()), "qk_cheat")
    impl = R.split_paths(root, cheat) if phase == "decode" else R.split_paths(cheat, root)
    wl = {"name": "t", "phase": phase, "batch": 5, "tokens": 5, "q_heads": 12, "kv_heads": 2, "head_dim": 128}
    for candidate, passes in ((root, True), (impl, False)):
        bench = FAM.make_bench(candidate, wl, 0, "cpu")
        bench.run()
        failed = [c.name for c in bench.verify() if not c.passed]
        assert failed == ([] if passes else ["fresh q vs fp64", "fresh k vs fp64"])
    spread = [c for c in FAM.check_cases("full") if c.get("spread")]
    assert spread and any(kind == "reference" for _, kind, _ in R.failures(FAM, cheat, cases=spread))
