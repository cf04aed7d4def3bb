"""add_rmsnorm family under TRITON_INTERPRET=1 on the CPU: consistency structure, knobs, a caught mismatch."""

import _family as R
import pytest

R.setup()
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
FAM = R.family("add_rmsnorm")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"BLOCK_H": 512, "NUM_WARPS": 4},
    {"BLOCK_H": 1024, "FULL_ROWS_PER_PROGRAM": 4, "DECODE_ROWS_PER_PROGRAM": 2},
    {"BLOCK_H": 0, "FULL_ROWS_PER_PROGRAM": 8, "FULL_NUM_STAGES": 2},
    {"DECODE_WEIGHT_LOAD": "early", "FULL_ROWS_PER_PROGRAM": 2},
    {"FULL_WEIGHT_LOAD": "early", "DECODE_ROWS_PER_PROGRAM": 2},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_contract_mismatch_is_caught():
    # Full path reduces the whole row at once, decode in 512-wide chunks: row sums differ in the last bits.
    bad = R.failures(FAM, R.hybrid(FAM, {"BLOCK_H": 512}, {"BLOCK_H": 0}))
    assert any(kind == "consistency" and "decode" in name for name, kind, _ in bad)
    assert not any(kind == "reference" for name, kind, _ in bad)


def test_bench_runs_and_verifies():
    b = FAM.make_bench(R.load_with_knobs(FAM), {"name": "t", "phase": "decode", "batch": 3, "hidden": 200}, 0, "cpu")
    b.run()
    assert all(c.passed for c in b.verify())


@pytest.mark.parametrize("phase", ["decode", "full"])
def test_fresh_verify_catches_a_path_that_skips_the_normalisation(phase):
    # Fresh rows over four decades of scale (x and residual alike): y = h * w is off by orders of magnitude.
    root = R.load_with_knobs(FAM)
    cheat = R.load_source(R.skips_normalisation(FAM.root_source()), "add_rms_cheat")
    impl = R.split_paths(root, cheat) if phase == "decode" else R.split_paths(cheat, root)
    wl = {"name": "t", "phase": phase, "batch": 8, "tokens": 8, "hidden": 4099}
    for candidate, passes in ((root, True), (impl, False)):
        bench = FAM.make_bench(candidate, wl, 0, "cpu")
        bench.run()
        failed = [c.name for c in bench.verify() if not c.passed]
        assert failed == ([] if passes else ["fresh inputs vs fp64"])
    spread = [c for c in FAM.check_cases("full") if c.get("spread")]
    assert spread and any(kind == "reference" for _, kind, _ in R.failures(FAM, cheat, cases=spread))
