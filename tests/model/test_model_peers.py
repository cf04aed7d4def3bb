"""tik_evo_kernels.peers (kernels/peers.py), the model-level baseline (cuBLAS, SDPA, torch ops behind the families'
entry points): the MoE decoder runs on it, its rollout agrees with its own training forward to bf16 accuracy (so the
paged-cache append and masked decode attention are right), and it computes the same model as the kernels."""


import torch

from tik_evo_kernels import peers
from tik_evo_kernels.moe_decoder import MoEDecoder, MoEShape

LENS, PROMPTS = [9, 12, 7], [5, 8, 4]


def sequences(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).to(torch.int32) for n in LENS]


def close(a, b, atol):
    return all(torch.allclose(x, y, rtol=0, atol=atol) for x, y in zip(a, b))


def test_torch_peers_compute_the_kernels_model():
    shape, seqs = MoEShape(experts=0, intermediate=96), sequences(3)
    ours = MoEDecoder(shape, 1, "cpu").training_logprobs(seqs, PROMPTS)
    peer = MoEDecoder(shape, 1, "cpu", impls=peers.torch_impls())
    train = peer.training_logprobs(seqs, PROMPTS)
    assert close(train, ours, 0.2), (train, ours)
    assert close(peer.rollout_logprobs(seqs, PROMPTS), train, 0.2)


def test_torch_peers_run_the_moe_model():
    m = MoEDecoder(MoEShape(), 0, "cpu", impls=peers.torch_impls())
    seqs = sequences(4)
    train, rollout = m.training_logprobs(seqs, PROMPTS), m.rollout_logprobs(seqs, PROMPTS)
    assert m.expert_rows == (2 * sum(LENS) - len(LENS)) * 2 * 2
    assert close(rollout, train, 0.3), (rollout, train)


def test_decode_step_measurement_counts_each_family_per_step():
    # `tik-evo bench model-speed`'s rollout measurement (tik_evo_kernels.measure) labels every decode-path kernel
    # call by family (the profiler sums kernel time under those labels); on the CPU only the labels and counts are
    # checkable. Per step of the default MoE shape (2 layers): qkv, o, router and three grouped expert projections
    # per layer, plus the lm_head; one attention, RoPE and routing call per layer.
    from tik_evo_kernels.measure import decode_step_us

    m = MoEDecoder(MoEShape(max_pos=32), 0, "cpu", impls=peers.torch_impls())
    d = decode_step_us(m, batch=3, prompt=5, steps=4, vocab=512)
    assert d["linear"]["calls_per_step"] == 2 * 6 + 1
    assert {f: d[f]["calls_per_step"] for f in ("attention", "rope", "moe_routing", "kv_append")} == \
        {"attention": 2, "rope": 2, "moe_routing": 2, "kv_append": 2}
    # the prefill's last rows are scored on the decode path too
    assert abs(d["logprob"]["calls_per_step"] - 5 / 4) < 1e-9
    assert m._op.__func__ is MoEDecoder._op  # the model is given back unwrapped
