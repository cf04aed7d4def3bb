"""The shared RMSNorm backward kernel (kernels/norm_backward.py) against fp64 autograd, under the interpreter:
narrow rows several to a tile (QK norm's heads), wide rows one to a tile, rows not filling the last tile, none."""

import pytest
import torch

from tik_evo import checks
from tik_evo_kernels import norm_backward
from tik_evo_kernels.norm_backward import rms_backward


@pytest.fixture(params=[{"PREFETCH": True, "DW_IN_TILE": True}, {"PREFETCH": False, "DW_IN_TILE": False},
                        {"PREFETCH": True, "DW_IN_TILE": False, "NUM_WARPS": 2},
                        {"PREFETCH": True, "DW_IN_TILE": True, "MIN_TILES_PER_PROGRAM": 3}],
                ids=["prefetch+dw_in_tile", "plain", "prefetch+2warps", "3 tiles a program"])
def schedule(request, monkeypatch):
    """The kernel's schedule knobs: none may change more than fp32 summation order. On the CPU a launch has at
    most 4 programs, so the shapes below take several steps per program (the prefetch's loop)."""
    monkeypatch.setattr(norm_backward, "KNOBS", {**norm_backward.KNOBS, **request.param})


@pytest.mark.parametrize("shape", [(37, 4, 128), (29, 1000), (3, 5000), (0, 64)])
def test_rms_backward_matches_fp64_autograd(shape, schedule):
    g = checks.generator(sum(shape))
    x = checks.randn(shape, g, torch.bfloat16, "cpu", scale=2.0)
    w = checks.randn(shape[-1:], g, torch.bfloat16, "cpu", scale=0.5) + 1.0
    gy = checks.randn(shape, g, torch.bfloat16, "cpu")
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
    y.backward(gy.double())
    gx, gw = rms_backward(x, w, gy, 1e-6)
    assert gx.shape == x.shape and gx.dtype == x.dtype and gw.shape == w.shape and gw.dtype == w.dtype
    if not x.numel():
        assert bool((gw == 0).all())
        return
    assert checks.reference("dx", gx, xd.grad, tol=1.6e-2).passed
    assert checks.reference("dw", gw, wd.grad, tol=1.6e-2).passed


def test_rms_backward_adds_the_residual_outputs_gradient(schedule):
    # add + RMSNorm: h = x + r feeds the norm and is an output itself; grad_x of h is the norm's plus grad_res.
    g = checks.generator(11)
    h = checks.randn((21, 300), g, torch.bfloat16, "cpu")
    w = checks.randn((300,), g, torch.bfloat16, "cpu") + 1.0
    gy, gres = checks.randn((21, 300), g, torch.bfloat16, "cpu"), checks.randn((21, 300), g, torch.bfloat16, "cpu")
    hd = h.double().requires_grad_()
    y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.autograd.backward([y, hd * 1.0], [gy.double(), gres.double()])
    gh, _ = rms_backward(h, w, gy, 1e-6, gres)
    assert checks.reference("dh", gh, hd.grad, tol=1.6e-2).passed
    without, _ = rms_backward(h, w, gy, 1e-6)
    assert not checks.reference("dh without grad_res", without, hd.grad, tol=1.6e-2).passed


def test_resident_programs_counts_what_limits_an_sm():
    from tik_evo_kernels.norm_backward import resident_programs

    assert resident_programs(118, 0, 8) == 2  # 118 registers round up to 120 a thread: 30720 a program
    assert resident_programs(80, 0, 8) == 3
    assert resident_programs(40, 0, 4) == 12
    assert resident_programs(40, 0, 16) == 3  # registers, not the 4 programs the warp limit allows
    assert resident_programs(16, 0, 1) == 32  # the block limit
    assert resident_programs(32, 4096, 1) == 32 and resident_programs(32, 100 << 10, 1) == 2  # shared memory
    assert resident_programs(255, 0, 32) == 1  # never none


def test_norm_backward_benchmark_smoke_runs_every_schedule(tmp_path):
    # `tik-evo bench norm-backward --smoke`: tiny shapes under the interpreter: every schedule ran on every shape and
    # agrees with the first schedule and with fp64 (speed under the interpreter means nothing); the module's knobs
    # are restored afterwards.
    import json


    before = dict(norm_backward.KNOBS)
    from tik_evo.cli import main

    out = tmp_path / "nb.json"
    assert main(["bench", "norm-backward", "--smoke", "--out", str(out)]) == 0
    assert before == norm_backward.KNOBS
    shapes = json.loads(out.read_text())["shapes"]
    assert len(shapes) == 3 and shapes[0]["schedules"][0]["dx_rel_l2_vs_fp64"] < 1e-2
    for row in shapes:
        assert len(row["schedules"]) == 2 and row["best"] is not None, row
        for e in row["schedules"]:
            assert "error" not in e and e["us"] > 0, e
            assert e["dx_rel_l2_vs_first"] < 1e-2 and e["dw_rel_l2_vs_first"] < 1e-4, e


COMPILE = """
import json
from tik_evo.sm90 import compile_sm90
from tik_evo_kernels.moe_combine import _combine_bwd_kernel, _combine_kernel
from tik_evo_kernels.norm_backward import _rms_bwd_kernel
from tik_evo_kernels.silu_mul.root import _silu_mul_bwd_kernel
p = {"x_ptr": "*bf16", "w_ptr": "*bf16", "dy_ptr": "*bf16", "dres_ptr": "*bf16", "dx_ptr": "*bf16", "ws_ptr": "*fp32"}
sig = {**p, "n_rows": "i32", "H": "i32", "eps": "fp32"}
out = {f"rms{b}x{r}{'p' if pf else ''}": compile_sm90(
    _rms_bwd_kernel, sig, {"ROWS": r, "BLOCK_H": b, "HAS_RES": res, "PREFETCH": pf, "DW_IN_TILE": pf}, w, 3,
    set(p) | {"H"}) for b, r, w, res in ((128, 32, 8, False), (4096, 1, 8, True)) for pf in (False, True)}
sig = {"g_ptr": "*bf16", "u_ptr": "*bf16", "dy_ptr": "*bf16", "dg_ptr": "*bf16", "du_ptr": "*bf16", "I": "i32",
       "g_stride": "i32", "u_stride": "i32"}
out["silu"] = compile_sm90(_silu_mul_bwd_kernel, sig, {"BLOCK_I": 1024}, 4, 3, set(sig))
p = {"rows_ptr": "*bf16", "w_ptr": "*bf16", "pos_ptr": "*i64", "out_ptr": "*bf16"}
out["moe_combine"] = compile_sm90(_combine_kernel, {**p, "n_tok": "i32", "H": "i32"},
                                  {"TOP_K": 8, "ROWS": 1, "BLOCK_H": 2048, "HAS_W": True}, 4, 3, {*p, "H"})
p = {"rows_ptr": "*bf16", "w_ptr": "*bf16", "pos_ptr": "*i64", "gy_ptr": "*bf16", "grows_ptr": "*bf16",
     "gw_ptr": "*bf16"}
out["moe_combine_bwd"] = compile_sm90(_combine_bwd_kernel, {**p, "n_tok": "i32", "H": "i32"},
                                      {"TOP_K": 8, "K_PAD": 8, "ROWS": 1, "BLOCK_H": 2048}, 4, 3, {*p, "H"})
from tik_evo_kernels.embedding_backward import _run_sum_kernel
p = {"sorted_ptr": "*i64", "order_ptr": "*i64", "gy_ptr": "*bf16", "gt_ptr": "*bf16"}
out["embedding_bwd"] = compile_sm90(_run_sum_kernel, {**p, "n_tok": "i32", "H": "i32"}, {"BLOCK": 512, "RUN": 8}, 4, 1,
                                    {*p, "H"})
print(json.dumps(out))
"""


def test_policy_backward_kernels_compile_for_hopper_without_spills(offline):
    # No GPU in CI: the norm, SiLU-and-mul and embedding backward kernels and the MoE combine's compiled offline
    # for sm_90a (QK norm's 128-wide heads 32 rows to a tile, a 2560-wide add + norm row alone, each with and
    # without the prefetch; top 8 of a 2048-wide hidden row): they must build, and not spill.
    import json

    reports = json.loads(offline("-c", COMPILE))
    for name, rep in reports.items():
        assert rep["spill_store_bytes"] == 0 and rep["LDG"] > 0, (name, rep)
    # the combine's gathered rows load as 16-byte vectors (H a multiple of 16, as Triton specializes it at launch):
    # 2 per slot and thread, plus each slot's position and weight
    assert reports["moe_combine"]["LDG"] == 8 * 2 + 8 * 2, reports["moe_combine"]


OFFLINE = """
import json
from tik_evo_kernels.norm_backward import offline_schedules
before = {"PREFETCH": False, "DW_IN_TILE": False, "PROGRAMS_PER_SM": 4, "NUM_WARPS": 0, "MIN_TILES_PER_PROGRAM": 1}
rows = offline_schedules({"add+norm": (8192, 2560, True)}, [before, {**before, "PROGRAMS_PER_SM": 0}])
print(json.dumps(rows))
"""


def test_norm_backward_offline_report_counts_rounds_of_programs(offline):
    # `tik-evo bench norm-backward --offline` (tik_evo_kernels.norm_backward.offline_schedules): a schedule
    # compiled for sm_90a, with the residency it implies on an H200.
    # The grid sized to residency (PROGRAMS_PER_SM 0) never takes more than one round of programs.
    import json

    (row,) = json.loads(offline("-c", OFFLINE).splitlines()[-1])  # after the report's progress line
    before, sized = row["schedules"]
    for e in (before, sized):
        assert e["registers"] > 0 and e["spill_store_bytes"] == 0 and e["programs_an_sm_holds"] >= 1, e
    assert sized["rounds_of_programs"] == 1 and sized["programs"] == sized["programs_an_sm_holds"] * 132
    assert before["programs"] == min(row["tiles"], 4 * 132)
    assert before["rounds_of_programs"] == -(-before["programs"] // (before["programs_an_sm_holds"] * 132))
