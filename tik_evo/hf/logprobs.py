"""Log-probs of sampled tokens at a temperature, both ways: recorded while `generate` samples (`generate`), and from
one training forward of the finished sequences (`token_logprobs`). On a patched model the two are equal bit for
bit, token for token, whatever padding each batch puts around a sequence and whichever step a sequence finishes at.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _kernels(model) -> str:
    kernels = getattr(model, "_tik_evo_kernels", None)
    if kernels is None:
        raise ValueError(f"{type(model).__name__} is not patched: call tik_evo.hf.apply(model) first")
    return kernels


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position within its sequence, as `generate` numbers them (padding: 0)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   temperature: float = 1.0, entropy: bool = False):
    """One training forward: log p(input_ids[:, t] | input_ids[:, :t]) under softmax(logits / temperature) for
    t = 1 .. S - 1, fp32 [B, S - 1], differentiable in the model's parameters (0 where the target or its context
    token is padding). Each row holds one sequence; attention_mask marks its tokens (left or right padding).
    With `entropy`, also each position's entropy ([B, S - 1])."""
    import tik_evo.ops as ops

    kernels = _kernels(model)
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"token_logprobs: input_ids {tuple(input_ids.shape)}: expected [batch, tokens >= 2]")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                use_cache=False)
    lp, ent = ops.logprob(out.logits[:, :-1], input_ids[:, 1:], float(temperature), False, kernels)
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    lp = lp.masked_fill(~valid, 0.0)
    return (lp, ent.masked_fill(~valid, 0.0)) if entropy else lp


@dataclass
class Rollout:
    """What `generate` returns. sequences [B, P + N]: the prompts as given (padding included), then the sampled
    tokens (pad_token_id after a sequence's EOS); logprobs [B, N] fp32: each sampled token's log-prob, recorded
    at sampling (0 past a sequence's end); mask [B, N] bool: the tokens sampled, EOS included; attention_mask
    [B, P + N]: the tokens of each sequence, for the training forward (`token_logprobs`)."""

    sequences: torch.Tensor
    logprobs: torch.Tensor
    mask: torch.Tensor
    attention_mask: torch.Tensor

    def generated(self, logprobs: torch.Tensor) -> torch.Tensor:
        """The sampled tokens' entries, [B, N] like `self.logprobs`, of `token_logprobs(model, self.sequences,
        self.attention_mask, ...)` ([B, P + N - 1]: the token at column P + t is column P + t - 1's target)."""
        prompt = self.sequences.shape[1] - self.mask.shape[1]
        return logprobs[:, prompt - 1:].masked_fill(~self.mask, 0.0)


def _recorder(score):
    """A stopping criterion that never stops anything: after each sampling step it takes the step's raw logits
    (a hook on lm_head keeps the last position's bf16 output) and the token just sampled, and records
    score(logits, tokens), the tokens' log-probs."""
    from transformers import StoppingCriteria

    class Record(StoppingCriteria):
        def __init__(self):
            self.logits, self.steps = None, []

        def hook(self, module, args, output):
            self.logits = output[:, -1].detach()

        def __call__(self, input_ids, scores, **kwargs):
            self.steps.append(score(self.logits, input_ids[:, -1]))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return Record()


def kernel_score(kernels: str, temperature: float):
    """score(logits, tokens) through the logprob family's decode path: what a rollout records."""
    import tik_evo.ops as ops

    return lambda logits, tokens: ops.logprob(logits, tokens, temperature, True, kernels)[0]


def generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0,
             max_new_tokens: int = 32, cache_implementation: str | None = "static", score=None,
             **kwargs) -> Rollout:
    """`model.generate` sampling at `temperature` (top-k and top-p off unless given in kwargs: the recorded
    log-probs are those of softmax(logits / temperature)), recording each sampled token's log-prob as it goes.
    Prompts are left-padded (attention_mask 0 on padding). A static cache by default; `disable_compile=True`
    unless given (transformers would otherwise compile the decode step on a GPU). `score(logits, tokens)` records
    something else than the kernels' log-probs (a benchmark's control on an unpatched model)."""
    if score is None:
        score = kernel_score(_kernels(model), float(temperature))
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    rec = _recorder(score)
    handle = model.lm_head.register_forward_hook(rec.hook)
    cfg = model.generation_config
    eos = kwargs.pop("eos_token_id", cfg.eos_token_id)
    pad = kwargs.pop("pad_token_id", cfg.pad_token_id)
    pad = pad if pad is not None else (eos[0] if isinstance(eos, (list, tuple)) else eos)
    options = {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0,
               "disable_compile": True, **kwargs}
    if cache_implementation:
        options["cache_implementation"] = cache_implementation
    try:
        seqs = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                              eos_token_id=eos, pad_token_id=pad, stopping_criteria=[rec], **options)
    finally:
        handle.remove()
    if not isinstance(seqs, torch.Tensor):
        seqs = seqs.sequences
    prompt = input_ids.shape[1]
    new = seqs[:, prompt:]
    lp = torch.stack(rec.steps, 1)[:, :new.shape[1]]
    eos_ids = torch.tensor([] if eos is None else ([eos] if isinstance(eos, int) else list(eos)), device=new.device)
    is_eos = torch.isin(new, eos_ids).int()
    mask = (is_eos.cumsum(1) - is_eos) == 0  # no EOS before: sampled, EOS included
    return Rollout(seqs, lp.masked_fill(~mask, 0.0), mask,
                   torch.cat([attention_mask.to(mask.dtype), mask], 1).to(attention_mask.dtype))

