"""The policy update on the unified kernels (CPU, the interpreter): `policy_logprobs` gives training_logprobs'
bits (so the rollout's), and its gradients, through each family's backward, agree with autograd of the same
model written in torch (`tik_evo_kernels.autograd.TorchOps`) to bf16 accuracy."""


import pytest
import torch

from tik_evo_kernels.autograd import KernelOps, RecordingRouting, TorchOps
from tik_evo_kernels.moe_decoder import MoEDecoder, MoEShape

LENS, PROMPTS = [9, 12, 7], [5, 8, 4]
GRAD_TOL = 4e-2  # relative L2 per parameter; measured 1.0-2.7% (bf16 activations on both sides)


def sequences(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).to(torch.int32) for n in LENS]


def gradients(m: MoEDecoder, seqs, advantages, ops) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = m.parameters()
    for p in params:
        p.requires_grad_(True)
        p.grad = None
    lp = m.policy_logprobs(seqs, PROMPTS, ops=ops)
    (torch.cat(lp) * advantages).sum().backward()  # a policy-gradient loss's shape: sum of log-prob x advantage
    grads = [p.grad for p in params]
    for p in params:
        p.requires_grad_(False)
        p.grad = None
    return lp, grads


# The per-expert launches on one layer: what they change (the experts' rows gathered and scattered per expert, the
# temperature) is within a layer; the two layers' composition is the other two cases'.
@pytest.mark.parametrize("shape, grouped, temperature", [
    (MoEShape(experts=0, intermediate=96), True, 1.0), (MoEShape(), True, 1.0), (MoEShape(layers=1), False, 0.7)],
    ids=["dense", "moe_grouped", "moe_per_expert_t0.7"])
def test_policy_logprobs_are_training_bits_and_gradients_match_torch(shape, grouped, temperature):
    m = MoEDecoder(shape, 1, "cpu", grouped_experts=grouped, temperature=temperature)
    seqs = sequences(3)
    train = m.training_logprobs(seqs, PROMPTS)
    adv = torch.randn(sum(LENS) - sum(PROMPTS), generator=torch.Generator().manual_seed(5))
    ours, ref = RecordingRouting(KernelOps(m.k, matmul_backward="kernel")), RecordingRouting(TorchOps())
    lp, g_ours = gradients(m, seqs, adv, ours)
    assert all(torch.equal(a, b.detach()) for a, b in zip(train, lp))  # the trainer's bits, with the graph
    assert m.ops is None and not any(p.requires_grad for p in m.parameters())  # the model is left as it was
    _, g_ref = gradients(m, seqs, adv, ref)
    assert len(ours.ids) == len(ref.ids) == (shape.layers if shape.experts else 0)
    assert all(torch.equal(a, b) for a, b in zip(ours.ids, ref.ids))  # the same experts on both sides
    names = [f"param {i} {tuple(p.shape)}" for i, p in enumerate(m.parameters())]
    for name, a, b in zip(names, g_ours, g_ref):
        assert a is not None and a.shape == b.shape and a.dtype == b.dtype, name
        rel = float((a.double() - b.double()).norm() / b.double().norm())
        assert b.double().norm() > 0 and rel < GRAD_TOL, (name, rel)


def test_each_call_backpropagates_like_torch():
    # Per call, on inputs of its own: the gradient of every differentiable input, against TorchOps' autograd.
    from tik_evo_kernels.rope.family import rope_table

    g = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)

    cos, sin = rope_table(40, 32, 1e4, None, "cpu")
    pos = torch.tensor([0, 5, 17, 3, 39, 8, 2], dtype=torch.int32)
    starts = torch.tensor([0, 2, 2, 7], dtype=torch.int32)  # an expert without rows
    perm = torch.randperm(14, generator=torch.Generator().manual_seed(1))  # pos: token t's slot k is row perm[2 t + k]
    cases = {
        "linear": ((rnd(7, 48), rnd(20, 48, scale=0.2)), ()),
        "linear_grouped": ((rnd(7, 48), rnd(3, 20, 48, scale=0.2)), (starts,)),
        "embedding": ((rnd(30, 16),), (torch.tensor([3, 3, 0, 29, 7], dtype=torch.int32),)),
        "rmsnorm": ((rnd(7, 48), rnd(48, scale=0.1) + 1), (1e-6,)),
        "add_rmsnorm": ((rnd(7, 48), rnd(7, 48), rnd(48, scale=0.1) + 1), (1e-6,)),
        "qk_rmsnorm": ((rnd(7, 4, 32), rnd(7, 2, 32), rnd(32, scale=0.1) + 1, rnd(32, scale=0.1) + 1), (1e-6,)),
        "rope": ((rnd(7, 4, 32), rnd(7, 2, 32)), (cos, sin, pos)),
        "silu_mul": ((rnd(7, 48), rnd(7, 48)), ()),
        "moe_routing": ((rnd(7, 8, scale=2.0),), (2,)),
        "logprob": ((rnd(7, 96, scale=3.0),), (torch.randint(0, 96, (7,), generator=g).to(torch.int32), 0.7)),
        "attention": ((rnd(1, 4, 9, 32), rnd(1, 2, 9, 32), rnd(1, 2, 9, 32)), (32 ** -0.5,)),
        # the MoE glue: 7 tokens, top 2, rows in a shuffled (experts') order
        "moe_combine": ((rnd(14, 48), rnd(7, 2, scale=0.5)), (perm.view(7, 2),)),
        "moe_dispatch": ((rnd(7, 48),), (torch.argsort(perm) // 2, perm.view(7, 2))),
    }
    order = {"embedding": lambda d, c: (*c, *d), "linear_grouped": lambda d, c: (*d, *c)}
    kernels = KernelOps(MoEDecoder(MoEShape(), 0, "cpu").k, matmul_backward="kernel")  # every file's own backward
    for name, (diff, const) in cases.items():
        grads = []
        for ops in (kernels, TorchOps()):
            xs = [t.clone().requires_grad_() for t in diff]
            args = order.get(name, lambda d, c: (*d, *c))(xs, const)
            outs = getattr(ops, name)(*args)
            outs = [o for o in (outs if isinstance(outs, tuple) else (outs,)) if o.is_floating_point()]
            weights = [torch.randn(o.shape, generator=torch.Generator().manual_seed(9)) for o in outs]
            sum((o.float() * w).sum() for o, w in zip(outs, weights)).backward()
            grads.append([x.grad for x in xs])
        for i, (a, b) in enumerate(zip(*grads)):
            rel = float((a.double() - b.double()).norm() / b.double().norm())
            assert rel < GRAD_TOL, (name, i, rel)


def test_vendor_matmul_backward_gives_torchs_gradients():
    # KernelOps' default (matmul_backward "vendor"): the linear layers' gradients through torch's matmuls (the
    # grouped one falls back to the kernel file's off a Hopper GPU), the forward still the kernel's bits.
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn((7, 48), generator=g).to(torch.bfloat16), (torch.randn((20, 48), generator=g) * 0.2).to(
        torch.bfloat16)
    ws = (torch.randn((3, 20, 48), generator=g) * 0.2).to(torch.bfloat16)
    starts = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
    impls = MoEDecoder(MoEShape(), 0, "cpu").k
    for name, diff, const in (("linear", (x, w), ()), ("linear_grouped", (x, ws), (starts,))):
        outs, grads = [], []
        for ops in (KernelOps(impls), KernelOps(impls, matmul_backward="kernel"), TorchOps()):
            xs = [t.clone().requires_grad_() for t in diff]
            y = getattr(ops, name)(*xs, *const)
            y.float().sum().backward()
            outs.append(y.detach())
            grads.append([t.grad for t in xs])
        assert torch.equal(outs[0], outs[1]), name  # the forward is the kernel's either way
        for a, b in zip(grads[0], grads[2]):
            assert float((a.double() - b.double()).norm() / b.double().norm()) < GRAD_TOL, name
    with pytest.raises(ValueError, match="matmul_backward 'cublas'"):
        KernelOps(impls, matmul_backward="cublas")


def test_a_policy_step_profile_splits_by_family_and_direction():
    # `tik-evo bench policy`'s breakdown (tik_evo_kernels.measure): every call is labelled forward and backward
    # (on the CPU only the labels and counts are checkable). Dense, 2 layers, 3 sequences: qkv, o, gate, up, down
    # per layer plus the lm_head; one packed attention call per layer.
    from tik_evo_kernels import measure

    m = MoEDecoder(MoEShape(experts=0, intermediate=96), 1, "cpu")
    for p in m.parameters():
        p.requires_grad_(True)
    fams = measure.policy_breakdown(m, sequences(3), PROMPTS, "cpu", "kernel")["families"]
    calls = {k: v["calls"] for k, v in fams.items()}
    # its step timing runs ours and the torch trainer's model (native dtypes) alike; on the CPU it records no times.
    # Nine steps (three rounds of three): only the labels are checked, so on one layer and one short sequence.
    small = MoEDecoder(MoEShape(experts=0, intermediate=96, layers=1), 1, "cpu")
    for p in small.parameters():
        p.requires_grad_(True)
    steps = measure.policy_step_times(small, sequences(3)[:1], PROMPTS[:1], 1, "cpu", ["vendor", "kernel"])
    assert {k: v["ms_all"] for k, v in steps.items()} == {"unified": [], "unified_kernel_matmul_bwd": [], "torch": []}
    for direction in ("fwd", "bwd"):
        assert calls[f"linear.{direction}"] == 2 * 5 + 1
        assert calls[f"attention.{direction}"] == 2
        assert calls[f"logprob.{direction}"] == calls[f"embedding.{direction}"] == 1
        assert calls[f"add_rmsnorm.{direction}"] == 2 * 2


def test_policy_benchmark_names_a_wrong_matmul_backward(capsys):

    from tik_evo.cli import main

    assert main(["bench", "policy", "--smoke", "--matmul-backward", "vendor,cublas", "--out", "/dev/null"]) == 2
    assert "--matmul-backward 'vendor,cublas'" in capsys.readouterr().out
