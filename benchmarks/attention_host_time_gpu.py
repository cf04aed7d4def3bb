"""Host time per attention call on a GPU: how long Python takes to launch one prefill or decode, against torch SDPA.

    tik-evo bench attention-host-time [--variants root,hopper_ws_s512] [--seqs 512,1024] --out F.json

Each entry point runs N times back to back on a small shape whose GPU time is far below its host time, then
synchronises once: wall time / N is the host time per call. CUDA-graph replays of the same call give its GPU
time. A profile (cProfile, the top functions by own time) says where the host time goes. Every call of ours runs
twice, with the family's fast launches (`FAST_LAUNCH`, the default) and with Triton's own launch path; the two
outputs must be equal bit for bit (`same_bits`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
from tik_evo.timing import graph_replay_us  # noqa: E402
from tik_evo_kernels.attention.bench import VARIANTS, load_variant  # noqa: E402
from tik_evo_kernels.attention.bench import eager_us as host_us  # noqa: E402  (calls back to back, one sync)

HQ, HKV, D = 32, 8, 128


def events_us(fn, flush: bool, reps: int = 100) -> float:
    """Median CUDA-event time of one call, each call after an L2 flush (as triton.testing.do_bench, which the
    family's bench uses) or back to back."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    times = []
    for _ in range(reps):
        if flush:
            cache.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in times)[reps // 2] * 1e3


def profile_top(fn, n: int, top: int = 14) -> list[str]:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    return [line for line in s.getvalue().splitlines() if line.strip()][-top - 1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default="root,hopper_ws_s512,hopper_bn128_tree_s512")
    ap.add_argument("--seqs", default="512,1024", help="prefill lengths (batch 1)")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    scale = 1.0 / math.sqrt(D)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.bfloat16)

    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": triton.__version__, "n": args.n, "rows": []}
    # Prefill B1 at each length (the Gluon kernel also forced); decode B1 over a 1K cache.
    seqs = [int(x) for x in args.seqs.split(",")]
    pre = {S: (rnd(1, HQ, S, D), rnd(1, HKV, S, D), rnd(1, HKV, S, D)) for S in seqs}
    outs = {S: torch.empty_like(pre[S][0]) for S in seqs}
    qd, kc, vc = rnd(1, HQ, 1, D), rnd(1, HKV, 1024, D), rnd(1, HKV, 1024, D)
    ctx = torch.tensor([1024], dtype=torch.int32, device=dev)
    od = torch.empty_like(qd)
    kcr, vcr = kc.repeat_interleave(HQ // HKV, 1), vc.repeat_interleave(HQ // HKV, 1)
    calls: dict[str, tuple] = {}  # label -> (call, module or None, output)
    for S, (q, k, v) in pre.items():
        kr, vr = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
        for be, name in ((torch.nn.attention.SDPBackend.CUDNN_ATTENTION, "cudnn"),
                         (torch.nn.attention.SDPBackend.FLASH_ATTENTION, "flash")):
            def peer(be=be, q=q, kr=kr, vr=vr):
                with torch.nn.attention.sdpa_kernel(be):
                    F.scaled_dot_product_attention(q, kr, vr, is_causal=True, scale=scale)
            calls[f"sdpa_{name} prefill S{S}"] = (peer, None, None)

    def sdpa_decode():
        F.scaled_dot_product_attention(qd, kcr, vcr, scale=scale)
    calls["sdpa decode"] = (sdpa_decode, None, None)
    tmp = Path(tempfile.mkdtemp())
    for name in args.variants.split(","):
        mod, _ = load_variant(name, VARIANTS[name], tmp)
        gl_mod = None
        if mod.KNOBS["FULL_IMPL"] != "triton":
            gl_mod, _ = load_variant(name + "_gluon", {**VARIANTS[name], "FULL_IMPL": "gluon_ws"}, tmp)
        for S, (q, k, v) in pre.items():
            calls[f"{name} prefill S{S}"] = (lambda mod=mod, q=q, k=k, v=v, o=outs[S]: mod.prefill(q, k, v, scale, o),
                                             mod, outs[S])
            if gl_mod is not None:
                calls[f"{name} prefill S{S} (Gluon forced)"] = (
                    lambda mod=gl_mod, q=q, k=k, v=v, o=outs[S]: mod.prefill(q, k, v, scale, o), gl_mod, outs[S])
        calls[f"{name} decode"] = (lambda mod=mod: mod.decode(qd, kc, vc, ctx, scale, od), mod, od)
    for label, (fn, mod, out) in calls.items():
        for fast in ((True, False) if mod is not None else (None,)):
            if mod is not None:
                mod.FAST_LAUNCH = fast
            fn()
            torch.cuda.synchronize()
            row = {"call": label if fast is None else f"{label} [{'fast' if fast else 'triton'} launch]",
                   "host_us": host_us(fn, args.n), "gpu_us": graph_replay_us(fn)}
            row["host_us_again"] = host_us(fn, args.n)
            row["host_us_third"] = host_us(fn, args.n)  # the host is noisy: three readings, compare their minima
            if "prefill" in label:  # what an event timing sees of the call, after a flush and without
                row["events_flush_us"], row["events_us"] = events_us(fn, True), events_us(fn, False)
            if mod is not None:
                row["profile"] = profile_top(fn, 200)
                fn()
                torch.cuda.synchronize()
                if fast:
                    ref = out.clone()
                else:
                    row["same_bits"] = bool(torch.equal(out, ref))
                mod.FAST_LAUNCH = True
            report["rows"].append(row)
            events = f"events {row['events_flush_us']:6.1f} flushed / {row['events_us']:6.1f}, " \
                if "events_us" in row else ""
            bits = f", same bits {row['same_bits']}" if "same_bits" in row else ""
            print(f"{row['call']:>58}: host {row['host_us']:6.1f} / {row['host_us_again']:6.1f} / "
                  f"{row['host_us_third']:6.1f} us per call, {events}GPU {row['gpu_us']:6.1f} us{bits}", flush=True)
    for row in report["rows"]:
        if "profile" in row:
            print(f"--- {row['call']}\n" + "\n".join(row["profile"][:12]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
