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
