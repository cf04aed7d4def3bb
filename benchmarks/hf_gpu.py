"""transformers models patched by tik_evo.hf, at full depth with random weights: rollout vs training log-prob bits,
the training forward's time against the same model with Liger-Kernel's patch and as transformers runs it (SDPA),
and torch.compile(fullgraph=True) with the eager bits. Writes JSON.

    tik-evo bench hf --out results/model/hf_DATE.json          # Qwen3-0.6B- and Qwen2.5-0.5B-shaped models
    tik-evo bench hf --models qwen3 --layers 8 --batches 1     # shallower, one batch
    tik-evo bench hf --smoke --out x.json                      # the code paths on the CPU (interpreter, tiny)

1. Bits: `tik_evo.hf.generate` samples at --temperature for --batches batches of --batch left-padded prompts of
   different lengths (static cache), recording each sampled token's log-prob; a set of EOS tokens (--eos-fraction of
   the vocabulary) makes sequences finish at different steps. `token_logprobs` then runs one training forward over
   the finished sequences; every recorded log-prob is compared with it bit for bit. The control: the unpatched
   model (SDPA, cuBLAS) recording torch's log-softmax of its generate logits against its own training forward.
2. Speed: the training forward (--train-batch x --train-len tokens -> log-probs at the temperature), without and
   with backward, CUDA events, median of --reps after warm-up, the models interleaved: patched; Liger-Kernel's
   patch (RoPE, RMSNorm, SwiGLU; log-probs by torch's log-softmax, as its fused linear cross-entropy gives a loss,
   not per-token log-probs) if liger_kernel imports; transformers with SDPA.
3. torch.compile(fullgraph=True) of the patched training forward (inductor): its log-probs against eager's.

Needs transformers (the hf extra) and, for the Liger column, liger_kernel; neither is imported before main runs.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import traceback
from functools import partial

if "--smoke" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from tik_evo.profiling import profile_call
from tik_evo_bench.common import header, write_json

# Published shapes of the two models (their config.json values), depth settable with --layers.
SHAPES = {
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
    "qwen2.5": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
}
SMOKE = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64)


def build(name: str, layers: int | None, smoke: bool, seed: int, device: str):
    import transformers

    cls, cfg_cls, shape = SHAPES[name]
    shape = {**shape, **(SMOKE if smoke else {})}
    if smoke and "head_dim" in shape:
        shape["head_dim"] = 32
    elif smoke:  # Qwen2.5-0.5B's group of 7 query heads per KV head, at its head width of 64
        shape.update(hidden_size=448, num_attention_heads=7)
    if layers:
        shape["num_hidden_layers"] = layers
    config = getattr(transformers, cfg_cls)(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(config).to(device, torch.bfloat16).eval()
    return model, shape


def eos_set(vocab: int, fraction: float) -> list[int]:
    """Token ids 2 .. that end a sequence: enough of them that sequences end at different steps."""
    return list(range(2, 2 + max(1, int(vocab * fraction))))


def prompts(batch: int, longest: int, vocab: int, device: str, g: torch.Generator):
    """Left-padded prompts, lengths spread from half the longest to the longest."""
    lengths = torch.linspace(max(1, longest // 2), longest, batch).round().long()
    ids = torch.randint(200 % vocab, vocab, (batch, longest), generator=g)
    mask = (torch.arange(longest)[None, :] >= (longest - lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def differing(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> int:
    return int((a.view(torch.int32) != b.view(torch.int32))[mask].sum())


def torch_logprobs(model, ids, mask, temperature):
    """transformers' training forward and torch's fp32 log-softmax at the temperature (the control, the peers)."""
    from tik_evo.hf import position_ids

    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float() / temperature, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp.masked_fill(~(mask[:, 1:].bool() & mask[:, :-1].bool()), 0.0)


def bits(patched, plain, args, shape, device) -> dict:
    import tik_evo.hf as hf

    eos = eos_set(shape["vocab_size"], args.eos_fraction)
    g = torch.Generator().manual_seed(args.seed)
    out = {"tokens": 0, "differing": 0, "control_tokens": 0, "control_differing": 0, "lengths": [], "batches": 0}
    T = args.temperature
    for _ in range(args.batches):
        ids, mask = prompts(args.batch, args.prompt_len, shape["vocab_size"], device, g)
        with torch.no_grad():
            torch.manual_seed(args.seed + out["batches"])
            roll = hf.generate(patched, ids, mask, temperature=T, max_new_tokens=args.max_new, eos_token_id=eos)
            lp = roll.generated(hf.token_logprobs(patched, roll.sequences, roll.attention_mask, T))
            out["tokens"] += int(roll.mask.sum())
            out["differing"] += differing(lp, roll.logprobs, roll.mask)
            out["lengths"] += roll.mask.sum(1).tolist()
            score = lambda logits, tok: torch.log_softmax(logits.float() / T, -1).gather(-1, tok[:, None])[:, 0]  # noqa: E731
            torch.manual_seed(args.seed + out["batches"])
            ctrl = hf.generate(plain, ids, mask, temperature=T, max_new_tokens=args.max_new, eos_token_id=eos,
                               score=score)
            clp = ctrl.generated(torch_logprobs(plain, ctrl.sequences, ctrl.attention_mask, T))
            out["control_tokens"] += int(ctrl.mask.sum())
            out["control_differing"] += differing(clp, ctrl.logprobs.float(), ctrl.mask)
        out["batches"] += 1
    out["distinct_lengths"] = len(set(out["lengths"]))
    return out


def timed(fn, reps: int, device: str) -> float:
    """Median ms of fn() over reps (CUDA events on a GPU, the wall clock on the CPU)."""
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def liger_patch(name: str, model):
    """Liger-Kernel on `model` (RoPE, RMSNorm, SwiGLU; no fused cross-entropy: log-probs are needed), and the
    modeling module whose rotary function it replaces process-wide (so the plain model can be given its own back
    while it runs); or the reason it is unavailable."""
    try:
        import liger_kernel
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2, apply_liger_kernel_to_qwen3
    except Exception as e:  # noqa: BLE001 - any import failure means no Liger column, said in the JSON
        return None, f"liger_kernel not importable: {e!r:.200}"
    import importlib

    arch = "qwen3" if name == "qwen3" else "qwen2"
    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    original = module.apply_rotary_pos_emb
    patch = apply_liger_kernel_to_qwen3 if name == "qwen3" else apply_liger_kernel_to_qwen2
    patch(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model)
    liger_rope, module.apply_rotary_pos_emb = module.apply_rotary_pos_emb, original  # the plain model's, until timed
    return (module, original, liger_rope), getattr(liger_kernel, "__version__", "unknown")


def speed(patched, plain, liger, rotary, args, shape, device) -> dict:
    import tik_evo.hf as hf

    g = torch.Generator().manual_seed(args.seed + 100)
    ids = torch.randint(2 + int(shape["vocab_size"] * args.eos_fraction), shape["vocab_size"],
                        (args.train_batch, args.train_len), generator=g).to(device)
    mask = torch.ones_like(ids)
    T = args.temperature

    def rope_for(which):
        if rotary is not None:
            module, original, liger_fn = rotary
            module.apply_rotary_pos_emb = liger_fn if which == "liger" else original

    runs = {"tik_evo": lambda: hf.token_logprobs(patched, ids, mask, T),
            "transformers_sdpa": lambda: torch_logprobs(plain, ids, mask, T)}
    if liger is not None:
        runs["liger"] = lambda: torch_logprobs(liger, ids, mask, T)
    out: dict = {"train_batch": args.train_batch, "train_len": args.train_len, "forward_ms": {},
                 "forward_backward_ms": {}}
    models = {"tik_evo": patched, "transformers_sdpa": plain, "liger": liger}
    for which, fn in runs.items():  # warm-up: compiles each model's forward and backward kernels before any timing
        rope_for(which)
        with torch.no_grad():
            fn()
        models[which].zero_grad(set_to_none=True)
        fn().sum().backward()
    samples: dict = {k: [] for k in runs}
    samples_bwd: dict = {k: [] for k in runs}
    for _ in range(args.rounds):  # interleaved rounds: drift in clocks or temperature touches every model alike
        for which, fn in runs.items():
            rope_for(which)
            with torch.no_grad():
                samples[which].append(timed(fn, args.reps, device))

            def step(fn=fn, which=which):
                models[which].zero_grad(set_to_none=True)
                fn().sum().backward()
            samples_bwd[which].append(timed(step, max(1, args.reps // 2), device))
    if args.profile:
        out["profile"] = {}
        for which, fn in runs.items():
            rope_for(which)

            def step(fn=fn, which=which):
                models[which].zero_grad(set_to_none=True)
                fn().sum().backward()
            out["profile"][which] = profile_call(step, device)
    rope_for("plain")
    for which in runs:
        out["forward_ms"][which] = statistics.median(samples[which])
        out["forward_backward_ms"][which] = statistics.median(samples_bwd[which])
    return out


def compiled(patched, args, shape, device) -> dict:
    import tik_evo.hf as hf

    g = torch.Generator().manual_seed(args.seed + 200)
    n = min(args.train_len, 256)
    ids = torch.randint(3, shape["vocab_size"], (2, n), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[1, : n // 3] = 0
    fn = lambda i, m: hf.token_logprobs(patched, i, m, args.temperature)  # noqa: E731
    try:
        with torch.no_grad():
            eager = fn(ids, mask)
            t0 = time.perf_counter()
            f = torch.compile(fn, backend=args.compile_backend, fullgraph=True)
            out = f(ids, mask)
            seconds = time.perf_counter() - t0
        return {"ok": True, "backend": args.compile_backend, "fullgraph": True, "compile_s": seconds,
                "bit_equal": bool(torch.equal(eager, out)), "tokens": int(mask[:, 1:].sum())}
    except Exception as e:  # noqa: BLE001 - reported, the rest of the suite goes on
        return {"ok": False, "backend": args.compile_backend, "error": repr(e)[:500],
                "trace": traceback.format_exc()[-2000:]}


SUMMARY = {
    "bits": lambda b: (f"{b['differing']} of {b['tokens']} log-probs differ between generate and the training "
                       f"forward (control, unpatched: {b['control_differing']} of {b['control_tokens']}); "
                       f"{b['distinct_lengths']} distinct lengths"),
    "speed": lambda s: f"forward ms {s['forward_ms']}, forward+backward ms {s['forward_backward_ms']}",
    "compile": lambda c: f"ok {c.get('ok')} bit_equal {c.get('bit_equal')} {c.get('error', '')[:300]}",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tik-evo bench hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen3,qwen2.5", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="layers (0: the model's full depth)")
    ap.add_argument("--batches", type=int, default=2, help="generate batches for the bit comparison")
    ap.add_argument("--batch", type=int, default=64, help="sequences per generate batch")
    ap.add_argument("--prompt-len", type=int, default=64, help="the longest prompt (others down to half)")
    ap.add_argument("--max-new", type=int, default=192, help="tokens sampled at most per sequence")
    ap.add_argument("--eos-fraction", type=float, default=0.004,
                    help="share of the vocabulary that ends a sequence (sequences then end at different steps)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the models")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--profile", action="store_true",
                    help="record one forward+backward of each column under torch.profiler: wall against kernel "
                         "time, the top kernels and host ops")
    ap.add_argument("--no-liger", action="store_true", help="skip the Liger-Kernel column")
    ap.add_argument("--attention-set", default="", help="a named set of the attention family for the patch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny one-layer models")
    ap.add_argument("--out", default="", help="JSON path")
    args = ap.parse_args(argv)
    try:
        import transformers
    except ImportError:
        print('error: tik-evo bench hf needs transformers: pip install "tik-evo[hf]"')
        return 2
    import tik_evo.hf as hf

    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        print(f"error: --models {','.join(unknown)}: not one of {', '.join(SHAPES)}")
        return 2
    if args.smoke:
        args.batches, args.batch, args.prompt_len, args.max_new, args.eos_fraction = 1, 3, 3, 2, 0.05
        args.train_batch, args.train_len, args.reps, args.rounds = 1, 8, 1, 1
        args.compile_backend, args.no_liger = "aot_eager", True
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        print("error: no CUDA GPU: run on a GPU, or --smoke for the code paths on the CPU")
        return 2
    result = {**header(gpu="cpu (interpreter)" if args.smoke else None), "transformers": transformers.__version__,
              "smoke": args.smoke, "args": vars(args), "models": {}}
    for name in names:
        t0 = time.perf_counter()
        plain, shape = build(name, args.layers, args.smoke, args.seed, device)
        patched = hf.apply(copy.deepcopy(plain), attention_set=args.attention_set or None)
        liger, note, rotary = None, "skipped (--no-liger)", None
        if not args.no_liger:
            liger = copy.deepcopy(plain)
            rotary, note = liger_patch(name, liger)
            if rotary is None:
                liger = None
        entry = {"shape": shape, "liger": note}
        result["models"][name] = entry
        for part, fn in (("bits", partial(bits, patched, plain, args, shape, device)),
                         ("speed", partial(speed, patched, plain, liger, rotary, args, shape, device)),
                         ("compile", partial(compiled, patched, args, shape, device))):
            try:
                entry[part] = fn()
            except Exception as e:  # noqa: BLE001 - recorded; the other parts and models still run
                entry[part] = {"error": repr(e)[:500], "trace": traceback.format_exc()[-3000:]}
                print(f"{name}: {part} failed: {e!r:.300}")
            else:
                print(f"{name}: {part} " + SUMMARY[part](entry[part]))
            if args.out:  # rewritten after each part: a run cut short keeps what it measured
                write_json(args.out, result)
        entry["seconds"] = time.perf_counter() - t0
        del plain, patched, liger
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        print(f"wrote {write_json(args.out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
