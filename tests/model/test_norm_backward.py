"""The shared RMSNorm backward kernel (kernels/norm_backward.py) against fp64 autograd, under the interpreter:
narrow rows several to a tile (QK norm's heads), wide rows one to a tile, rows not filling the last tile, none."""

import pytest
import torch

from kernels.norm_backward import rms_backward
from tik_evo import checks


@pytest.mark.parametrize("shape", [(37, 4, 128), (29, 1000), (3, 5000), (0, 64)])
def test_rms_backward_matches_fp64_autograd(shape):
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


def test_rms_backward_adds_the_residual_outputs_gradient():
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


COMPILE = """
import json, sys
sys.path.insert(0, ".")
from benchmarks.sm90 import compile_sm90
from kernels.moe_combine import _combine_bwd_kernel, _combine_kernel
from kernels.norm_backward import _rms_bwd_kernel
from kernels.silu_mul.root import _silu_mul_bwd_kernel
p = {"x_ptr": "*bf16", "w_ptr": "*bf16", "dy_ptr": "*bf16", "dres_ptr": "*bf16", "dx_ptr": "*bf16", "ws_ptr": "*fp32"}
sig = {**p, "n_rows": "i32", "H": "i32", "eps": "fp32"}
out = {f"rms{b}x{r}": compile_sm90(_rms_bwd_kernel, sig, {"ROWS": r, "BLOCK_H": b, "HAS_RES": True}, w, 3, set(p))
       for b, r, w in ((128, 32, 8), (4096, 1, 8))}
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
from kernels.embedding_backward import _run_sum_kernel
p = {"sorted_ptr": "*i64", "order_ptr": "*i64", "gy_ptr": "*bf16", "gt_ptr": "*bf16"}
out["embedding_bwd"] = compile_sm90(_run_sum_kernel, {**p, "n_tok": "i32", "H": "i32"}, {"BLOCK": 512, "RUN": 8}, 4, 1,
                                    {*p, "H"})
print(json.dumps(out))
"""


def test_policy_backward_kernels_compile_for_hopper_without_spills(offline):
    # No GPU in CI: the norm, SiLU-and-mul and embedding backward kernels and the MoE combine's compiled offline
    # for sm_90a (QK norm's 128-wide heads 32 rows to a tile, a 2560-wide hidden row alone; top 8 of a 2048-wide
    # hidden row): they must build, and not spill.
    import json

    reports = json.loads(offline("-c", COMPILE))
    for name, rep in reports.items():
        assert rep["spill_store_bytes"] == 0 and rep["LDG"] > 0, (name, rep)
    # the combine's gathered rows load as 16-byte vectors (H a multiple of 16, as Triton specializes it at launch):
    # 2 per slot and thread, plus each slot's position and weight
    assert reports["moe_combine"]["LDG"] == 8 * 2 + 8 * 2, reports["moe_combine"]
