"""Arm A's vendor stack (tik_evo/rl/vendor.py) on the CPU: a vendor call is kept only if its probe agrees with
torch's fp32 version forward and backward; a wrong or failing one is dropped with a note; the kept calls are the
ones the loop runs, the rollout's decode attention included."""

import torch
import torch.nn.functional as F

from tik_evo.rl.arms import ARMS
from tik_evo.rl.rollout import sdpa_decode
from tik_evo.rl.shapes import shape
from tik_evo.rl.task import AdditionTask
from tik_evo.rl.trainer import GRPOConfig, GRPOTrainer
from tik_evo.rl.vendor import VendorOps
from tik_evo_kernels.autograd import TorchOps
from tik_evo_kernels.moe_decoder import MoEDecoder

CALLS: list[str] = []


def counted(name, fn):
    def call(*args):
        CALLS.append(name)
        return fn(*args)
    return call


def rms_bf16(x, w, eps):  # RMSNorm in bf16 arithmetic: not torch's bits, within bf16 accuracy of them
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


def decode_fp32(q, kc, vc, live, lens, scale):
    return sdpa_decode(q, kc[live], vc[live], lens, scale, torch.float32)


def linear_logprob_fp32(x, w, targets, temperature):  # lm_head and log-prob in one call, as Liger's fused CE
    logits = (x.float() / temperature) @ w.float().t()
    return torch.log_softmax(logits, -1).gather(1, targets.long()[:, None])[:, 0]


def test_probe_keeps_agreeing_calls_and_drops_wrong_or_failing_ones():
    def boom(*_):
        raise TypeError("an API this code does not know")

    def decode_wrong(q, kc, vc, live, lens, scale):  # attends one row too many
        return decode_fp32(q, kc, vc, live, lens + 1, scale)

    ops = VendorOps("cpu", {
        "rmsnorm": counted("rmsnorm", rms_bf16),
        "silu_mul": lambda gate, up: (F.silu(gate.float()) + up.float()).to(gate.dtype),  # + for *: wrong
        "rope": boom,
        "attention_decode": [decode_wrong, counted("attention_decode", decode_fp32)],  # alternatives, in order
        "linear_logprob": [lambda x, w, t, temp: linear_logprob_fp32(x, w, t, 1.0),  # the temperature ignored
                           counted("linear_logprob", linear_logprob_fp32)],
    })
    assert set(ops.fast) == {"rmsnorm", "attention_decode", "linear_logprob"}
    notes = "\n".join(ops.notes)
    assert "rmsnorm (call): vendor" in notes and "attention_decode (call): vendor" in notes
    assert "attention_decode (decode_wrong): torch, the vendor call differs" in notes
    assert "silu_mul (<lambda>): torch, the vendor call differs from torch" in notes
    assert "rope (boom): torch, the vendor call failed: TypeError" in notes
    assert ops.native  # the rest: torch with bf16 matmuls
    # a step of arm A on these ops: the kept calls run in the rollout and the training forwards
    CALLS.clear()
    m = MoEDecoder(shape("tiny", 16), 0, "cpu")
    cfg = GRPOConfig(prompts=1, group=2, max_new=3, micro_batch=2)
    rec = GRPOTrainer(m, AdditionTask(digits=1), ARMS["A"], cfg, ops=(ops, ops)).step()
    assert rec["tokens"]["generated"] > 0
    assert CALLS.count("attention_decode") == rec["decode_steps"] * m.s.layers
    # the first layer's input norm, once a forward: the prefill, each decode step, the recompute, the update
    assert CALLS.count("rmsnorm") == 1 + rec["decode_steps"] + 1 + 1
    # the fused lm_head + log-prob in both training forwards (recompute, update), close to the two-call path
    assert CALLS.count("linear_logprob") == 2 and "linear_logprob (<lambda>): torch, the vendor call differs" in notes
    seqs, plens = [torch.tensor([3, 4, 5, 6, 7], dtype=torch.int32)], [2]
    fused = m.policy_logprobs(seqs, plens, ops=ops)[0]
    plain = m.policy_logprobs(seqs, plens, ops=TorchOps(native=True))[0]
    assert fused.shape == plain.shape == (3,) and torch.allclose(fused, plain, atol=0.05, rtol=0.02)
    assert VendorOps("cpu").notes == ["not on a GPU: no vendor kernels"] and not VendorOps("cpu").fast


def test_without_a_decode_call_the_rollout_uses_sdpa():
    ops = VendorOps("cpu", {})
    assert ops.attention_decode is None and isinstance(ops, TorchOps)


def test_flash_decode_in_place_gives_every_sequence_a_query_row(monkeypatch):
    # Flash's one-query path folds the GQA heads into query rows and so needs exactly one query row per sequence
    # (on an H100 an empty row for a finished sequence failed: "shape '[3, 2, 2, 128]' is invalid"). A CPU stand-in
    # for torch's varlen wrapper with that rule: the in-place decode must still agree with the fp32 decode.
    import torch.nn.attention.varlen as varlen

    from tik_evo.rl.vendor import _flash

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), seqused_k=None):
        n = cu_q.numel() - 1
        assert max_q == 1  # decode only
        if q.shape[1] != k.shape[1] and q.shape[0] != n:
            raise RuntimeError(f"shape '[{n}, 2, 2, 128]' is invalid for input of size {q.numel()}")
        out = torch.empty_like(q)
        for b in range(n):
            rows, used = slice(int(cu_q[b]), int(cu_q[b + 1])), int(seqused_k[b])
            keys = slice(int(cu_k[b]), int(cu_k[b]) + used)
            o = F.scaled_dot_product_attention(*(t[s].transpose(0, 1)[None].float() for t, s in
                                                 ((q, rows), (k, keys), (v, keys))), scale=scale, enable_gqa=True)
            out[rows] = o[0].transpose(0, 1).to(q.dtype)
        return out

    monkeypatch.setattr(varlen, "varlen_attn", fake_varlen)
    notes: list[str] = []
    in_place, gathered = _flash(notes)["attention_decode"]
    ops = VendorOps("cpu", {"attention_decode": [in_place, gathered]})
    assert "attention_decode (decode_in_place): vendor" in "\n".join(ops.notes), ops.notes
    g = torch.Generator().manual_seed(3)
    q = torch.randn((2, 4, 128), generator=g).to(torch.bfloat16)
    kc, vc = (torch.randn((4, 24, 2, 128), generator=g).to(torch.bfloat16) for _ in range(2))
    live, lens = torch.tensor([1, 3]), torch.tensor([5, 24], dtype=torch.int32)
    ref = decode_fp32(q, kc, vc, live, lens, 128 ** -0.5)
    got = in_place(q, kc, vc, live, lens, 128 ** -0.5)
    assert got.shape == ref.reshape(2, -1).shape
    assert float((got.float() - ref.reshape(2, -1).float()).norm() / ref.float().norm()) < 1e-2
