"""Hugging Face transformers models on the unified kernels (`pip install "tik-evo[hf]"`).

    import tik_evo.hf as hf
    model = hf.load("path/to/checkpoint")                # from_pretrained in bfloat16, then apply
    hf.apply(model, kernels={"rope": "rope_kernel.py"}, attention_set="hopper")   # or patch a model you have
    roll = hf.generate(model, prompt_ids, prompt_mask, temperature=0.8, max_new_tokens=256)
    lp = hf.token_logprobs(model, roll.sequences, roll.attention_mask, temperature=0.8)
    assert torch.equal(roll.generated(lp), roll.logprobs)  # rollout and training forward agree bit for bit

Supported: Llama 3, Qwen2 / Qwen2.5, Qwen3 and Qwen3-MoE (`patch.SUPPORTED`); another model is refused with
`UnsupportedModelError` naming its class and what is missing. What is replaced: `patch.py`; the attention
function: `attention.py`; the log-probs both ways: `logprobs.py`. transformers is imported only when used.
"""

from __future__ import annotations

from pathlib import Path

from tik_evo.hf.logprobs import Rollout, generate, position_ids, token_logprobs
from tik_evo.hf.patch import SUPPORTED, UnsupportedModelError

__all__ = ["SUPPORTED", "Rollout", "UnsupportedModelError", "apply", "generate", "load", "position_ids",
           "token_logprobs"]


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError('tik_evo.hf needs transformers: pip install "tik-evo[hf]"') from None
    return transformers


def apply(model, kernels=None, attention_set: str | None = None, name: str | None = None):
    """Patch a transformers causal LM in place to run on the unified kernels; returns the model.

    kernels: which implementation backs each family: None (the roots), the name of a set registered with
    `tik_evo.ops.kernel_set`, or {family: kernel file | run directory | named set | module}. attention_set: a
    named set of the attention family (`tik-evo kernel attention --list`). The rollout and the trainer must use
    the same choices (their contract knobs decide the bits)."""
    _transformers()
    import tik_evo.ops as ops
    from tik_evo.hf import attention, patch

    patch.check(model)
    chosen = kernels if isinstance(kernels, str) else ops.kernel_set(kernels, attention_set, name)
    if isinstance(kernels, str):
        ops.impl(chosen, "attention")  # an unknown set name is refused here, naming the registered ones
    attention.register()
    patch.patch(model, chosen)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attention.NAME)
    else:
        model.config._attn_implementation = attention.NAME
    return model


def load(path: str | Path, kernels=None, attention_set: str | None = None, device: str | None = None, **kwargs):
    """`AutoModelForCausalLM.from_pretrained(path)` in bfloat16 (kwargs pass through), moved to `device` if given,
    then `apply`. Hub names work where the hub is reachable; a local directory (save_pretrained) always."""
    import torch

    transformers = _transformers()
    kwargs.setdefault("dtype", torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if device is not None:
        model = model.to(device)
    return apply(model, kernels=kernels, attention_set=attention_set)
