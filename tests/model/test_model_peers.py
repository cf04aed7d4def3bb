"""benchmarks/model_peers.py, the model-level baseline (cuBLAS, SDPA, torch ops behind the families' entry
points): the MoE decoder runs on it, its rollout agrees with its own training forward to bf16 accuracy (so the
paged-cache append and masked decode attention are right), and it computes the same model as the kernels."""

from pathlib import Path

import torch

from kernels.moe_decoder import MoEDecoder, MoEShape
from tik_evo.candidate import load_module

PEERS = load_module(Path(__file__).resolve().parents[2] / "benchmarks" / "model_peers.py", "model_peers")
LENS, PROMPTS = [9, 12, 7], [5, 8, 4]


def sequences(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).to(torch.int32) for n in LENS]


def close(a, b, atol):
    return all(torch.allclose(x, y, rtol=0, atol=atol) for x, y in zip(a, b))


def test_torch_peers_compute_the_kernels_model():
    shape, seqs = MoEShape(experts=0, intermediate=96), sequences(3)
    ours = MoEDecoder(shape, 1, "cpu").training_logprobs(seqs, PROMPTS)
    peer = MoEDecoder(shape, 1, "cpu", impls=PEERS.torch_impls())
    train = peer.training_logprobs(seqs, PROMPTS)
    assert close(train, ours, 0.2), (train, ours)
    assert close(peer.rollout_logprobs(seqs, PROMPTS), train, 0.2)


def test_torch_peers_run_the_moe_model():
    m = MoEDecoder(MoEShape(), 0, "cpu", impls=PEERS.torch_impls())
    seqs = sequences(4)
    train, rollout = m.training_logprobs(seqs, PROMPTS), m.rollout_logprobs(seqs, PROMPTS)
    assert m.expert_rows == (2 * sum(LENS) - len(LENS)) * 2 * 2
    assert close(rollout, train, 0.3), (rollout, train)
