"""tik_evo.ops under TRITON_INTERPRET=1 on the CPU: every op through torch.library.opcheck (schema, autograd
registration, fake kernel, AOT dispatch with dynamic shapes), the decode path's bits, torch.compile(fullgraph) of a
block built from the ops with the eager bits forward and backward, and kernel sets."""

import pytest
import torch
from torch.library import opcheck

import tik_evo.ops as T
from tik_evo_kernels.rope.family import rope_table

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::RuntimeWarning")
BF = torch.bfloat16
OPS = torch.ops.tik_evo
CHEAP = ("test_schema", "test_autograd_registration", "test_faketensor")
ALL = (*CHEAP, "test_aot_dispatch_dynamic")
# opcheck's dynamic-shape AOT test traces and runs forward and backward again (seconds under the interpreter): it is
# left out for the ops the compiled block below traces through AOTAutograd already, and for the grouped linear, whose
# backward kernel is the slowest to interpret (its fake kernels are checked all the same).
IN_BLOCK = {"rmsnorm", "linear", "rope", "attention_prefill", "silu_mul", "logprob", "linear_grouped"}


def r(*shape, grad=False, scale=1.0):
    return (torch.randn(*shape) * scale).to(BF).requires_grad_(grad)


def gain(n):
    return (1 + 0.1 * torch.randn(n)).to(BF).requires_grad_()


def _cases():
    torch.manual_seed(0)
    cos, sin = rope_table(16, 32, 1e6, None, "cpu")
    ids = torch.tensor([0, 2, 1, 2, 3, 1]).view(2, 3)  # token 2 twice: routed rows sorted by expert
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(6)
    starts = torch.tensor([0, 1, 3, 5, 6], dtype=torch.int32)
    return {
        "rmsnorm": (OPS.rmsnorm, (r(2, 3, 64, grad=True), gain(64), 1e-6)),
        "add_rmsnorm": (OPS.add_rmsnorm, (r(3, 64, grad=True), r(3, 64, grad=True), gain(64), 1e-6)),
        "qk_rmsnorm": (OPS.qk_rmsnorm, (r(3, 4, 32, grad=True), r(3, 2, 32, grad=True), gain(32), gain(32), 1e-6)),
        "rope": (OPS.rope, (r(3, 4, 32, grad=True), r(3, 2, 32, grad=True), cos, sin,
                            torch.tensor([0, 5, 2], dtype=torch.int32))),
        "silu_mul": (OPS.silu_mul, (r(3, 64, grad=True), r(3, 64, grad=True))),
        "embedding": (OPS.embedding, (torch.tensor([[1, 2, 1]]), r(8, 64, grad=True))),
        "linear": (OPS.linear, (r(2, 3, 64, grad=True), r(32, 64, grad=True, scale=0.1), r(32, grad=True))),
        "linear_grouped": (OPS.linear_grouped, (r(6, 64, grad=True), r(4, 32, 64, grad=True, scale=0.1), starts)),
        "logprob": (OPS.logprob, (r(3, 128, grad=True, scale=3.0), torch.tensor([1, 5, 7]), 0.7)),
        "moe_routing": (OPS.moe_routing, (r(4, 8, grad=True), 2)),
        "moe_dispatch": (OPS.moe_dispatch, (r(3, 64, grad=True), order // 2, pos.view(3, 2))),
        "moe_combine": (OPS.moe_combine, (r(6, 64, grad=True), r(3, 2, grad=True), pos.view(3, 2))),
        "attention_prefill": (OPS.attention_prefill, (r(1, 2, 5, 32, grad=True), r(1, 1, 5, 32, grad=True),
                                                      r(1, 1, 5, 32, grad=True), 0.125)),
        "attention_packed": (OPS.attention_packed, (r(7, 2, 32, grad=True), r(7, 1, 32, grad=True),
                                                    r(7, 1, 32, grad=True), torch.tensor([0, 3, 3, 7],
                                                                                         dtype=torch.int32), 4, 0.125)),
        "attention_decode": (OPS.attention_decode, (r(2, 2, 1, 32), r(2, 1, 6, 32), r(2, 1, 6, 32),
                                                    torch.tensor([6, 2], dtype=torch.int32), 0.125)),
        "attention_decode_paged": (OPS.attention_decode_paged, (r(2, 2, 1, 32), r(5, 3, 1, 32), r(5, 3, 1, 32),
                                                                torch.tensor([[4, 1], [0, 2]], dtype=torch.int32),
                                                                torch.tensor([6, 2], dtype=torch.int32), 0.125)),
        "kv_append_slots": (OPS.kv_append_slots, (r(3, 1, 32), r(3, 1, 32), torch.zeros(4, 4, 1, 32, dtype=BF),
                                                  torch.zeros(4, 4, 1, 32, dtype=BF),
                                                  torch.tensor([9, -1, 2], dtype=torch.int64))),
        "kv_append": (OPS.kv_append, (r(5, 1, 32), r(5, 1, 32), torch.zeros(4, 4, 1, 32, dtype=BF),
                                      torch.zeros(4, 4, 1, 32, dtype=BF), torch.tensor([[2, 0], [1, 3]],
                                                                                       dtype=torch.int32),
                                      torch.tensor([0, 3, 5], dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                      3)),
        "kv_append_decode": (OPS.kv_append_decode, (r(2, 1, 32), r(2, 1, 32), torch.zeros(4, 4, 1, 32, dtype=BF),
                                                    torch.zeros(4, 4, 1, 32, dtype=BF),
                                                    torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
                                                    torch.tensor([5, 1], dtype=torch.int32))),
    }


CASES = _cases()


def test_every_forward_op_has_a_case():
    assert set(CASES) == set(T.OPS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name):
    op, args = CASES[name]
    tests = CHEAP if name in IN_BLOCK else ALL
    assert opcheck(op, args, test_utils=tests) == {t: "SUCCESS" for t in tests}


def test_mutating_ops_declare_their_writes():
    """kv_append writes the caches it is given (declared), and nothing else."""
    op, args = CASES["kv_append"]
    k_cache, v_cache = torch.zeros(4, 4, 1, 32, dtype=BF), torch.zeros(4, 4, 1, 32, dtype=BF)
    args = (*args[:2], k_cache, v_cache, *args[4:])
    op(*args)
    assert k_cache.abs().sum() > 0 and v_cache.abs().sum() > 0
    assert [a.name for a in op.default._schema.arguments if a.alias_info and a.alias_info.is_write] == \
        ["k_cache", "v_cache"]


def test_decode_path_gives_the_full_paths_bits():
    torch.manual_seed(1)
    x, w = r(5, 64), gain(64).detach()
    assert torch.equal(T.rmsnorm(x, w, 1e-6), T.rmsnorm(x, w, 1e-6, decode=True))
    wl = r(32, 64, scale=0.1)
    assert torch.equal(T.linear(x, wl), T.linear(x, wl, decode=True))
    q, k, v = r(1, 2, 7, 32), r(1, 1, 7, 32), r(1, 1, 7, 32)
    full = T.attention_prefill(q, k, v, 0.125)
    step = T.attention_decode(q[:, :, 4:5].contiguous(), k, v, torch.tensor([5], dtype=torch.int32), 0.125)
    assert torch.equal(step[:, :, 0], full[:, :, 4])
    # The same cache in pages of 4 rows, dealt out of order (page 2 then page 0), read through the block table.
    kp, vp = (torch.zeros(3, 4, 1, 32, dtype=BF) for _ in range(2))
    slots = torch.tensor([8, 9, 10, 11, 0, 1, 2])
    T.kv_append_slots(k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous(), kp, vp, slots)
    paged = T.attention_decode_paged(q[:, :, 4:5].contiguous(), kp, vp, torch.tensor([[2, 0]], dtype=torch.int32),
                                     torch.tensor([5], dtype=torch.int32), 0.125)
    assert torch.equal(paged, step)


class Block(torch.nn.Module):
    """A decoder layer in miniature on the ops: norm, projection, RoPE, attention, SiLU MLP, log-prob."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.norm = torch.nn.Parameter(gain(64).detach())
        self.wqkv = torch.nn.Parameter(r(128, 64, scale=0.2))
        self.wo = torch.nn.Parameter(r(64, 64, scale=0.2))
        self.wg, self.wu = torch.nn.Parameter(r(64, 64, scale=0.2)), torch.nn.Parameter(r(64, 64, scale=0.2))
        self.lm = torch.nn.Parameter(r(128, 64, scale=0.5))
        self.cos, self.sin = rope_table(16, 32, 1e6, None, "cpu")

    def forward(self, x, pos, targets):
        h = T.rmsnorm(x, self.norm, 1e-6)
        q, k, v = T.linear(h, self.wqkv).split([64, 32, 32], -1)
        q, k = T.rope(q.reshape(-1, 2, 32), k.reshape(-1, 1, 32), self.cos, self.sin, pos)
        o = T.attention_prefill(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                v.reshape(-1, 1, 32).transpose(0, 1)[None], 32 ** -0.5)
        x = x + T.linear(o[0].transpose(0, 1).reshape(-1, 64), self.wo)
        x = x + T.silu_mul(T.linear(x, self.wg), T.linear(x, self.wu))
        return T.logprob(T.linear(x, self.lm), targets, 0.8)[0]


def test_compile_fullgraph_keeps_the_bits_forward_and_backward():
    block = Block()
    x, pos, targets = r(6, 64), torch.arange(6, dtype=torch.int32), torch.randint(0, 128, (6,))

    def run(f):
        block.zero_grad()
        lp = f(x, pos, targets)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in block.parameters()]

    eager_lp, eager_grads = run(block)
    compiled_lp, compiled_grads = run(torch.compile(block, backend="aot_eager", fullgraph=True))
    assert torch.equal(eager_lp, compiled_lp)
    assert all(torch.equal(a, b) for a, b in zip(eager_grads, compiled_grads))


def test_kernel_sets():
    assert T.kernel_set() == "root" and T.impl("root", "rmsnorm").__name__ == "tik_evo_kernels.rmsnorm.root"
    name = T.kernel_set(attention_set="nosplit")
    assert name == T.kernel_set({"attention": "nosplit"}) and T.impl(name, "attention").KNOBS != \
        T.impl("root", "attention").KNOBS
    assert T.impl(name, "rmsnorm") is T.impl("root", "rmsnorm")  # families not given stay the root
    q, k, v = r(1, 2, 5, 32), r(1, 1, 5, 32), r(1, 1, 5, 32)
    assert T.attention_prefill(q, k, v, 0.125, kernels=name).shape == q.shape
    with pytest.raises(ValueError, match="no kernel set named 'nope'"):
        T.rmsnorm(q, gain(32).detach(), 1e-6, kernels="nope")
    with pytest.raises(ValueError, match="'nope' is not a named set of family 'attention'"):
        T.kernel_set(attention_set="nope")
    with pytest.raises(ValueError, match="'rotary' is not a family"):
        T.kernel_set({"rotary": "x"})
