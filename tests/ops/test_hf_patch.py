"""tik_evo.hf under TRITON_INTERPRET=1 on the CPU, on tiny transformers models with random weights: the log-probs
`generate` records while sampling (static cache, left-padded prompts, sequences ending at different steps) equal
bit for bit those of a later training forward of the same sequences; a checkpoint saved with save_pretrained
(safetensors) loads patched; unsupported models are refused naming their class and what is missing."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tik_evo.hf as hf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::RuntimeWarning",
                                        "ignore::UserWarning")
# Eight of the 64 tokens end a sequence, so in a few steps some sequences finish and others go on.
EOS = [3, 9, 17, 22, 30, 41, 50, 60]
TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, eos_token_id=EOS, pad_token_id=0, bos_token_id=1)


def tiny(cls, config_cls, seed=0, **extra):
    torch.manual_seed(seed)
    model = cls(config_cls(**{**TINY, **extra})).to(torch.bfloat16).eval()
    with torch.no_grad():  # weights larger than the init's, so the tokens drawn vary
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0, 0.3)
    return model


def prompts(batch=3, length=3, seed=1):
    """Left-padded prompts of different lengths (as generate pads them)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 64, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, :b] = 0  # row b has b padding tokens
    return ids.masked_fill(mask == 0, 0), mask


def reference_logprobs(model, ids, mask, temperature):
    """token_logprobs' values from the model as transformers runs it (before the patch; fp32 softmax)."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=hf.position_ids(mask)).logits.float()
    lp = torch.log_softmax(logits[:, :-1] / temperature, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp.masked_fill(~(mask[:, 1:].bool() & mask[:, :-1].bool()), 0.0)


def close_to_transformers(patched, reference):
    """The kernels compute what transformers computes, to bf16 rounding (they round differently: fp32 RoPE tables,
    fp32 accumulation across fused steps)."""
    err = (patched - reference).abs()
    assert err.max() < 0.1 and err.mean() < 0.02, (err.max(), err.mean())


def rollout_equals_training(model, new_tokens=4, temperature=0.7, seed=3):
    """(the rollout, the training forward's log-probs of its sampled tokens)."""
    ids, mask = prompts()
    torch.manual_seed(seed)
    with torch.no_grad():
        roll = hf.generate(model, ids, mask, temperature=temperature, max_new_tokens=new_tokens)
        lp = hf.token_logprobs(model, roll.sequences, roll.attention_mask, temperature=temperature)
    return roll, roll.generated(lp)


def test_qwen3_moe_rollout_log_probs_equal_the_training_forward():
    # Qwen3's attention (per-head QK norm) and its sparse MoE block; the dense MLP is Qwen2's and Llama's
    model = tiny(transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig, head_dim=32, num_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=32, num_hidden_layers=1)
    assert type(model.model.layers[0].mlp).__name__ == "Qwen3MoeSparseMoeBlock"
    ids, mask = prompts(length=5)
    reference = reference_logprobs(model, ids, mask, 0.7)
    hf.apply(model)
    with torch.no_grad():
        close_to_transformers(hf.token_logprobs(model, ids, mask, 0.7), reference)
    roll, trained = rollout_equals_training(model, new_tokens=3)
    lengths = roll.mask.sum(1).tolist()
    assert len(set(lengths)) > 1 and min(lengths) < roll.mask.shape[1], lengths  # ends at different steps
    assert torch.equal(trained, roll.logprobs)
    assert roll.logprobs[roll.mask].lt(0).all()


def test_qwen25_checkpoint_loads_patched_and_rollout_equals_training(tmp_path):
    """Qwen2.5: QKV bias and tied embeddings; saved with save_pretrained (safetensors), loaded by tik_evo.hf.load."""
    model = tiny(transformers.Qwen2ForCausalLM, transformers.Qwen2Config, seed=4, tie_word_embeddings=True)
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    ids, mask = prompts(length=5)
    reference = reference_logprobs(model, ids, mask, 0.7)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = hf.load(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # still tied
    assert loaded.config._attn_implementation == "tik_evo" and loaded.dtype == torch.bfloat16
    roll, trained = rollout_equals_training(loaded, new_tokens=3, seed=5)
    assert torch.equal(trained, roll.logprobs)
    with torch.no_grad():
        close_to_transformers(hf.token_logprobs(loaded, ids, mask, 0.7), reference)


def test_llama3_patched_forward_is_padding_blind_and_close_to_transformers():
    """Llama 3 (llama3 RoPE scaling): a sequence's log-probs are the same alone and left-padded in a batch beside a
    longer one, and close to transformers' own forward."""
    model = tiny(transformers.LlamaForCausalLM, transformers.LlamaConfig, seed=6,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    seq = torch.randint(4, 64, (1, 5))
    batch = torch.cat([torch.cat([torch.zeros(1, 2, dtype=seq.dtype), seq], 1), torch.randint(4, 64, (1, 7))])
    mask = torch.ones_like(batch)
    mask[0, :2] = 0
    reference = reference_logprobs(model, batch, mask, 1.0)
    hf.apply(model)
    with torch.no_grad():
        alone = hf.token_logprobs(model, seq)
        padded = hf.token_logprobs(model, batch, mask)
        hotter = hf.token_logprobs(model, seq, temperature=1.3)
    assert torch.equal(padded[0, 2:], alone[0])
    close_to_transformers(padded, reference)
    assert not torch.equal(hotter, alone)  # the comparisons can fail: the temperature reaches the bits


def test_unsupported_models_are_refused_naming_the_class_and_what_is_missing():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(hf.UnsupportedModelError, match=r"GPT2LMHeadModel \(model_type 'gpt2'\) is not supported"):
        hf.apply(gpt2)
    qwen = tiny(transformers.Qwen3ForCausalLM, transformers.Qwen3Config, head_dim=32)
    with pytest.raises(hf.UnsupportedModelError, match="Qwen3ForCausalLM: parameters of dtype .*bfloat16"):
        hf.apply(qwen.float())
    qwen = qwen.to(torch.bfloat16)
    del qwen.model.layers[0].mlp.up_proj
    with pytest.raises(hf.UnsupportedModelError, match="layer 0's mlp .*has no up_proj"):
        hf.apply(qwen)
    with pytest.raises(ValueError, match="is not patched"):
        hf.token_logprobs(qwen, torch.ones(1, 3, dtype=torch.long))
