"""The policy update's glue kernels against the torch code they replaced, at the policy step's shapes
(tik-evo bench policy: Qwen3-30B-A3B's MoE layer at 8192 tokens, top 8 of 128 experts, hidden 2048; the
Qwen3 embedding table, 151936 x 2560):
- MoE combine, forward and backward (`kernels/moe_combine.py`) against the per-slot fp32 torch loop (forward
  under autograd, then its backward) that the model harness ran before;
- the dispatch's backward (slot-order sums) against autograd's index_add for x[src];
- the embedding table's gradient (`kernels/embedding_backward.py`) against index_add into an fp32 table;
- attention over the packed sequences (4 x 2048 tokens, 32 query / 4 KV heads of 128): one `prefill_packed`
  launch against a `prefill` launch per sequence on heads-first copies (and the copy back), as the harness did,
  and (GPU) torch's packed flash attention (`torch.nn.attention.varlen`, where this torch has it); its backward
  (with the recompute) through that varlen flash attention against SDPA per sequence, the fallback.
Each row: median ms (do_bench), the peak memory the call added (MB), and the result's relative L2 against an
fp32 torch reference (backward has no bitwise contract); the packed attention also counts the elements whose
bits differ from the per-sequence launches (its contract: none). Writes JSON.

    tik-evo bench policy-glue --out policy_glue.json
    tik-evo bench policy-glue --smoke --out x.json   # tiny shapes under the CPU interpreter
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from tik_evo.checks import rel_l2  # noqa: E402
from tik_evo_kernels.attention import root as attention  # noqa: E402
from tik_evo_kernels.embedding_backward import embedding_backward  # noqa: E402
from tik_evo_kernels.moe_combine import combine, combine_backward  # noqa: E402

SHAPES = {"tokens": 8192, "top_k": 8, "hidden": 2048, "vocab": 151936, "embed_hidden": 2560,
          "seq_lens": [2048] * 4, "q_heads": 32, "kv_heads": 4, "head_dim": 128}
SMOKE_SHAPES = {"tokens": 13, "top_k": 4, "hidden": 96, "vocab": 50, "embed_hidden": 40,
                "seq_lens": [9, 4], "q_heads": 2, "kv_heads": 1, "head_dim": 64}


ROUNDS = 3  # alternating readings of the attention backward's two ways (GPU)


def measure(fn, smoke: bool) -> dict:
    """Median ms and the peak memory one call adds above what is allocated before it (MB; CUDA only)."""
    if smoke:
        fn()
        t0 = time.perf_counter()
        fn()
        return {"ms": (time.perf_counter() - t0) * 1e3}
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    return {"ms": triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median"), "peak_extra_MB": peak}


def torch_loop(rows, weights, pos):
    """The harness's combine before the kernel: a per-slot fp32 multiply and add, then the cast."""
    y = torch.zeros((pos.shape[0], rows.shape[1]), device=rows.device, dtype=torch.float32)
    for slot in range(pos.shape[1]):
        y = y + weights[:, slot:slot + 1].float() * rows[pos[:, slot]].float()
    return y.to(torch.bfloat16)


def run(shapes: dict, device: str, smoke: bool) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    T, K, H = shapes["tokens"], shapes["top_k"], shapes["hidden"]
    rows = torch.randn((T * K, H), generator=g, device=device).to(torch.bfloat16)
    weights = torch.softmax(torch.randn((T, K), generator=g, device=device), -1).to(torch.bfloat16)
    pos = torch.randperm(T * K, generator=g, device=device).view(T, K)
    gy = torch.randn((T, H), generator=g, device=device).to(torch.bfloat16)
    out: dict = {"shapes": shapes, "cells": {}}

    def cell(name, fn, result, ref):
        try:
            m = measure(fn, smoke)
            m["rel_l2_vs_fp32"] = [rel_l2(a, b) for a, b in zip(result(), ref)]
            out["cells"][name] = m
        except Exception as e:  # noqa: BLE001 - one implementation's failure loses only its own row
            out["cells"][name] = {"error": repr(e)[:300]}
        print(name, out["cells"][name], flush=True)

    # combine: forward, and forward + backward (what a policy step runs per MoE layer)
    ref_y = (weights.float()[:, :, None] * rows.float()[pos]).sum(1)
    r32, w32 = rows.float().requires_grad_(), weights.float().requires_grad_()
    (w32[:, :, None] * r32[pos]).sum(1).backward(gy.float())
    cell("combine.fwd.kernel", lambda: combine(rows, weights, pos), lambda: [combine(rows, weights, pos)], [ref_y])
    cell("combine.fwd.torch_loop", lambda: torch_loop(rows, weights, pos), lambda: [torch_loop(rows, weights, pos)],
         [ref_y])

    def loop_fwd_bwd():
        r, w = rows.detach().requires_grad_(), weights.detach().requires_grad_()
        torch_loop(r, w, pos).backward(gy)
        return r.grad, w.grad

    cell("combine.fwd_bwd.kernel", lambda: (combine(rows, weights, pos), combine_backward(rows, weights, pos, gy)),
         lambda: combine_backward(rows, weights, pos, gy), [r32.grad, w32.grad])
    cell("combine.fwd_bwd.torch_loop", loop_fwd_bwd, loop_fwd_bwd, [r32.grad, w32.grad])

    # the dispatch's backward: each token's slots summed (rows = x[src], src[pos[t, k]] = t)
    src = torch.argsort(pos.flatten()) // K
    ref_gx = torch.zeros((T, H), device=device, dtype=torch.float64).index_add_(0, src, rows.double())

    def index_add():
        return torch.zeros((T, H), device=device, dtype=torch.bfloat16).index_add_(0, src, rows)

    cell("dispatch.bwd.kernel", lambda: combine(rows, None, pos), lambda: [combine(rows, None, pos)], [ref_gx])
    cell("dispatch.bwd.index_add", index_add, lambda: [index_add()], [ref_gx])

    # the embedding table's gradient
    V, E = shapes["vocab"], shapes["embed_hidden"]
    ids = torch.randint(0, V, (T,), generator=g, device=device, dtype=torch.int32)
    ids[: T // 8] = 7  # a frequent token: one long run
    gh = torch.randn((T, E), generator=g, device=device).to(torch.bfloat16)
    ref_gt = torch.zeros((V, E), device=device, dtype=torch.float32).index_add_(0, ids.long(), gh.float())

    def fp32_index_add():
        return torch.zeros((V, E), device=device, dtype=torch.float32).index_add_(0, ids.long(), gh.float()).to(
            torch.bfloat16)

    cell("embedding.bwd.kernel", lambda: embedding_backward(ids, gh, V), lambda: [embedding_backward(ids, gh, V)],
         [ref_gt])
    cell("embedding.bwd.fp32_index_add", fp32_index_add, lambda: [fp32_index_add()], [ref_gt])
    packed_attention(shapes, g, device, cell, out)
    return out


def packed_attention(shapes: dict, g: torch.Generator, device: str, cell, out: dict) -> None:
    lens, HQ, HKV, D = shapes["seq_lens"], shapes["q_heads"], shapes["kv_heads"], shapes["head_dim"]
    q, k, v = (torch.randn((sum(lens), h, D), generator=g, device=device).to(torch.bfloat16) for h in (HQ, HKV, HKV))
    bounds = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    scale = D ** -0.5
    ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        *(t[lo:hi].transpose(0, 1)[None].float() for t in (q, k, v)), is_causal=True, scale=scale,
        enable_gqa=HQ != HKV)[0].transpose(0, 1) for lo, hi in zip(bounds, bounds[1:])])

    def packed():
        o = torch.empty_like(q)
        attention.prefill_packed(q, k, v, cu, max(lens), scale, o)
        return o

    def per_sequence():
        o = torch.empty_like(q)
        for lo, hi in zip(bounds, bounds[1:]):
            qh, kh, vh = (t[lo:hi].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))
            oh = torch.empty_like(qh)
            attention.prefill(qh, kh, vh, scale, oh)
            o[lo:hi] = oh[0].transpose(0, 1)
        return o

    cell("attention.fwd.packed", packed, lambda: [packed()], [ref])
    cell("attention.fwd.per_sequence", per_sequence, lambda: [per_sequence()], [ref])
    if device == "cuda":  # the packed flash kernel a trainer would call (torch's varlen API, where it has one)
        from tik_evo_kernels.attention.autograd import varlen_flash

        def varlen():
            return varlen_flash(q, k, v, cu, max(lens), scale)
        cell("attention.fwd.torch_varlen", varlen, lambda: [varlen()], [ref])
    if "error" not in out["cells"]["attention.fwd.packed"]:
        out["cells"]["attention.fwd.packed"]["bits_differing_vs_per_sequence"] = int(
            (packed().view(torch.int16) != per_sequence().view(torch.int16)).sum())
    packed_attention_backward(q, k, v, bounds, scale, g, device, cell, out["cells"])


def packed_attention_backward(q, k, v, bounds: list[int], scale: float, g: torch.Generator, device: str,
                              cell, out_cells: dict) -> None:
    """The packed attention's backward (recompute included) as the policy step runs it: torch's varlen flash
    (GPU) against SDPA per sequence on heads-first copies, gradients against fp32 SDPA per sequence; on a GPU
    each is timed ROUNDS times, alternating, and keeps the median."""
    from tik_evo_kernels.attention import autograd as attn_grad

    gy = torch.randn(q.shape, generator=g, device=device).to(torch.bfloat16)
    ref = attn_grad._per_sequence_grads(q.float(), k.float(), v.float(), bounds, scale, gy.float())

    def sdpa():
        return attn_grad._per_sequence_grads(q, k, v, bounds, scale, gy)
    cell("attention.bwd.sdpa_per_sequence", sdpa, sdpa, ref)
    if device == "cuda":
        def varlen():
            grads = attn_grad._varlen_grads(q, k, v, bounds, scale, gy)
            if grads is None:
                raise RuntimeError("torch's varlen flash attention failed (see the warning)")
            return grads
        cell("attention.bwd.torch_varlen", varlen, varlen, ref)
        for _ in range(ROUNDS - 1):  # the two again, alternating: one reading each can catch a slow moment
            for name, fn in (("attention.bwd.sdpa_per_sequence", sdpa), ("attention.bwd.torch_varlen", varlen)):
                c = out_cells[name]
                if "error" not in c:
                    c.setdefault("ms_rounds", [c["ms"]]).append(measure(fn, False)["ms"])
                    c["ms"] = statistics.median(c["ms_rounds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="policy_glue.json")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (the code, not speed)")
    args = ap.parse_args(argv)
    if args.smoke:
        from tik_evo import interp
        interp.install()
    elif not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU (--smoke runs its code on the CPU; tests/model/ has the checks)")
        return 2
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.smoke
              else "cpu (interpreter)", "torch": torch.__version__, "triton": triton.__version__, "smoke": args.smoke,
              **run(SMOKE_SHAPES if args.smoke else SHAPES, "cpu" if args.smoke else "cuda", args.smoke)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
