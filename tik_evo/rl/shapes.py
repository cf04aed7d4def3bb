"""Model shapes the GRPO benchmark runs (`kernels/moe_decoder.py` MoEShape): Qwen3 widths at full depth, random
init, and two small ones. `max_pos` is set by the runner from the prompt and answer lengths. The Qwen3 models tie
lm_head to the embedding where this decoder keeps two tensors: the same FLOPs, one more weight in memory."""

from __future__ import annotations

from dataclasses import replace

from tik_evo_kernels.moe_decoder import MoEShape

QWEN3_VOCAB = 151936

SHAPES = {
    # the CPU tests' shape: one dense layer, the task's 14 symbols and 2 more
    "tiny": MoEShape(vocab=16, hidden=64, layers=1, q_heads=2, kv_heads=1, head_dim=32, experts=0, intermediate=64),
    # a model that can learn 3-digit addition in minutes on a GPU (reward parity runs)
    "small": MoEShape(vocab=64, hidden=256, layers=4, q_heads=4, kv_heads=2, head_dim=64, experts=0,
                      intermediate=768),
    "qwen3-0.6b-shape": MoEShape(vocab=QWEN3_VOCAB, hidden=1024, layers=28, q_heads=16, kv_heads=8, head_dim=128,
                                 experts=0, intermediate=3072),
    "qwen3-1.7b-shape": MoEShape(vocab=QWEN3_VOCAB, hidden=2048, layers=28, q_heads=16, kv_heads=8, head_dim=128,
                                 experts=0, intermediate=6144),
    "qwen3-4b-shape": MoEShape(vocab=QWEN3_VOCAB, hidden=2560, layers=36, q_heads=32, kv_heads=8, head_dim=128,
                               experts=0, intermediate=9728),
    "qwen3-30b-a3b-shape": MoEShape(vocab=QWEN3_VOCAB, hidden=2048, layers=48, q_heads=32, kv_heads=4, head_dim=128,
                                    experts=128, top_k=8, intermediate=768),
}


def shape(name: str, max_pos: int, layers: int | None = None) -> MoEShape:
    """The named shape with room for `max_pos` positions (and `layers` layers, where given)."""
    if name not in SHAPES:
        raise ValueError(f"model {name!r}: expected one of {', '.join(SHAPES)}")
    s = SHAPES[name]
    return replace(s, max_pos=max_pos, layers=layers or s.layers)
