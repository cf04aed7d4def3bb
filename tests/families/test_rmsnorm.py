"""rmsnorm family under TRITON_INTERPRET=1 on the CPU: consistency structure, knobs, caught mismatches."""

import _family as R
import pytest

R.setup()
FAM = R.family("rmsnorm")


def test_root_passes_all_cases_two_seeds():
    assert R.failures(FAM, R.load_with_knobs(FAM), seeds=(0, 1)) == []


@pytest.mark.parametrize("knobs", [
    {"BLOCK_H": 1024, "NUM_WARPS": 8},
    {"BLOCK_H": 128, "FULL_ROWS_PER_PROGRAM": 4, "DECODE_ROWS_PER_PROGRAM": 2},
    {"FULL_NUM_STAGES": 3, "DECODE_NUM_STAGES": 2, "FULL_ROWS_PER_PROGRAM": 8},
])
def test_knob_variants_pass(knobs):
    assert R.failures(FAM, R.load_with_knobs(FAM, **knobs)) == []


def test_reduction_width_differing_between_paths_is_caught():
    """Decode reducing in 128-wide chunks, full in 1024-wide ones: both accurate, the bits differ — and the
    fp32 pre-cast values show it even where the bf16 outputs agree."""
    bad = R.failures(FAM, R.hybrid(FAM, {"BLOCK_H": 128}, {"BLOCK_H": 1024}))
    consistency = [name for name, kind, _ in bad if kind == "consistency"]
    assert any("fp32" in name for name in consistency)
    assert all(kind == "consistency" for _, kind, _ in bad)  # accuracy checks still pass


def test_path_only_knobs_never_change_bits():
    a = R.load_with_knobs(FAM)
    b = R.load_with_knobs(FAM, FULL_ROWS_PER_PROGRAM=8, DECODE_ROWS_PER_PROGRAM=4, FULL_NUM_STAGES=3)
    import torch

    from tik_evo import checks

    x = checks.randn((29, 1000), checks.generator(3), torch.bfloat16, "cpu")
    w = checks.randn((1000,), checks.generator(4), torch.bfloat16, "cpu")
    outs = []
    for impl in (a, b):
        y, y32 = torch.empty_like(x), torch.empty(x.shape, dtype=torch.float32)
        impl.rmsnorm_full(x, w, 1e-6, y, y32)
        outs.append(y32)
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


def test_one_chunk_rows_get_the_chunked_loops_bits():
    # A row no wider than BLOCK_H is read once and kept in registers; the chunked loops with the same BLOCK_H
    # (forced by editing the branch away) must give the same bf16 and fp32 bits, and both paths pass.
    import torch

    from tik_evo import checks

    src = R.root_with_knobs(FAM, {"BLOCK_H": 1024})
    assert "if H <= BLOCK_H:" in src
    one, chunked = R.load_source(src, "one"), R.load_source(src.replace("if H <= BLOCK_H:", "if False:"), "chunked")
    x = checks.randn((13, 1000), checks.generator(5), torch.bfloat16, "cpu", scale=3.0)
    w = checks.randn((1000,), checks.generator(6), torch.bfloat16, "cpu")
    outs = []
    for impl in (one, chunked):
        y, y32 = torch.empty_like(x), torch.empty(x.shape, dtype=torch.float32)
        impl.rmsnorm_decode(x, w, 1e-6, y, y32)
        outs.append((y, y32))
    assert torch.equal(outs[0][0].view(torch.int16), outs[1][0].view(torch.int16))
    assert torch.equal(outs[0][1].view(torch.int32), outs[1][1].view(torch.int32))
    assert R.failures(FAM, R.load_with_knobs(FAM, BLOCK_H=4096, NUM_WARPS=8)) == []


def test_bench_runs_and_verifies():
    b = FAM.make_bench(R.load_with_knobs(FAM), {"name": "t", "phase": "decode", "batch": 3, "hidden": 700}, 0, "cpu")
    b.run()
    assert all(c.passed for c in b.verify())


def test_bench_sized_inputs_are_drawn_on_the_gpu_and_check_cases_on_the_cpu():
    import torch

    from tik_evo import checks

    big = checks.DEVICE_DRAW_NUMEL
    assert checks.draws_on_device(big, "cuda") and checks.draws_on_device(big, "cuda:1")
    assert not checks.draws_on_device(big - 1, "cuda") and not checks.draws_on_device(big, "cpu")
    # Below the line, and anywhere on the CPU: the seed's CPU stream, the same on every machine.
    want = (torch.randn((3, 5), generator=checks.generator(4), dtype=torch.float32) * 2).to(torch.bfloat16)
    assert torch.equal(checks.randn((3, 5), checks.generator(4), torch.bfloat16, "cpu", 2.0), want)


@pytest.mark.parametrize("phase", ["decode", "full"])
def test_fresh_verify_catches_a_path_that_skips_the_normalisation(phase):
    """The bench's fresh-input verify draws rows over four decades of scale: a path that returns x * w fails it
    by orders of magnitude. Unit-variance rows (rstd ~ 1 at this width) would have let it through."""
    import torch

    from tik_evo import checks
    from tik_evo_kernels.rmsnorm.family import EPS, reference

    root = R.load_with_knobs(FAM)
    cheat = R.load_source(R.skips_normalisation(FAM.root_source()), "rms_cheat")
    impl = R.split_paths(root, cheat) if phase == "decode" else R.split_paths(cheat, root)
    wl = {"name": "t", "phase": phase, "batch": 16, "tokens": 16, "hidden": 8191}
    bench = FAM.make_bench(root, wl, 0, "cpu")
    bench.run()
    assert all(c.passed for c in bench.verify())
    bench = FAM.make_bench(impl, wl, 0, "cpu")
    bench.run()
    bad = [c for c in bench.verify() if not c.passed]
    assert [c.name for c in bad] == ["fresh inputs vs fp64"] and bad[0].details["rel_l2"] > 1.0
    # What the verify drew before: unit-variance rows, on which the cheat stays within the bf16 tolerance.
    x = checks.randn((16, 8191), checks.generator(1), torch.bfloat16, "cpu")
    w = checks.randn((8191,), checks.generator(2), torch.bfloat16, "cpu", 0.5) + 1.0
    y = torch.empty_like(x)
    getattr(cheat, f"rmsnorm_{phase}")(x, w, EPS, y)
    assert checks.reference("unit rows", y, reference(x, w)).passed


def test_spread_check_case_catches_skipped_normalisation():
    # Both paths skipping it agree bit for bit; the fixed case with spread rows fails them on accuracy.
    spread = [c for c in FAM.check_cases("full") if c.get("spread")]
    assert spread
    bad = R.failures(FAM, R.load_source(R.skips_normalisation(FAM.root_source()), "rms_cheat"), cases=spread)
    assert bad and {kind for _, kind, _ in bad} == {"reference"}
