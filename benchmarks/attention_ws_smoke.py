"""Quick GPU smoke of the Gluon prefill (FULL_IMPL) against the Triton one, bits compared, on whole-block and
ragged lengths (two and three consumer warpgroups, splits 1024 and 512), then the fused decode merge against the
merge launch; run before long benchmarks so that a hang costs seconds, not the whole call:
python3 benchmarks/attention_ws_smoke.py"""
import sys

import torch
import triton

sys.path.insert(0, ".")
import tik_evo  # noqa: F401 - maps tik_evo_kernels to kernels/ where tik-evo is not installed
import tik_evo_kernels.attention.root as r


def diff(a, b, view):
    return int((a.view(view) != b.view(view)).sum())


r.KNOBS.update({"FULL_SPLIT_LOOP": "flatten"})
CONFIGS = (("triton", "overlap", "off", 2), ("gluon_ws", "overlap", "off", 2), ("gluon_ws", "serial", "off", 2),
           ("gluon_ws", "overlap", "snake", 2), ("gluon_ws", "serial", "snake", 2), ("gluon_ws", "overlap", "off", 3),
           ("gluon_ws", "serial", "off", 3), ("gluon_ws", "overlap", "snake", 3))
for split in (1024, 512):  # at split 512 only the three-consumer kernels (compiling each costs seconds)
    r.KNOBS["SPLIT_TOKENS"] = split
    configs = CONFIGS if split == 1024 else [c for c in CONFIGS if c[0] == "triton" or c[3] == 3]
    for S, D, HQ, HKV in ((1984, 128, 32, 8), (1088, 64, 8, 8), (4096, 128, 32, 8), (192, 128, 4, 1),
                          (2076, 128, 32, 8), (1070, 128, 4, 4), (4113, 64, 8, 2), (77, 128, 4, 1)):
        q = torch.randn(2, HQ, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        outs = {}
        for impl, sched, pers, cons in configs:
            r.KNOBS.update({"FULL_IMPL": impl, "FULL_WS_SCHEDULE": sched, "FULL_WS_PERSISTENT": pers,
                            "FULL_WS_CONSUMERS": cons})
            o = torch.empty_like(q)
            o32 = torch.empty(q.shape, device="cuda", dtype=torch.float32)
            used = r._ws_prefill(q, k, v, 0.1, o, o32) if impl != "triton" else r.prefill(q, k, v, 0.1, o, o32)
            torch.cuda.synchronize()
            outs[(impl, sched, pers, cons)] = (o, o32, used)
        ref = outs[CONFIGS[0]]
        for key, (o, o32, used) in outs.items():
            print(f"split {split}", S, D, key, "ws ran" if used else "", "bf16 diff", diff(o, ref[0], torch.int16),
                  "fp32 diff", diff(o32, ref[1], torch.int32), flush=True)
r.KNOBS.update({"SPLIT_TOKENS": 1024, "FULL_WS_CONSUMERS": 2})

# Ragged lengths, timed: the Gluon kernel (overlapped, 4 slots, persistent by the auto rule) against Triton.
r.KNOBS.update({"FULL_KV_LOADS": "auto", "FULL_PERSISTENT": "auto", "FULL_WS_SCHEDULE": "overlap",
                "FULL_WS_PERSISTENT": "auto"})
for B, S in ((1, 16000), (4, 4077), (16, 1000)):
    q = torch.randn(B, 32, S, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, 8, S, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, 8, S, 128, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(q)
    ms = {}
    for impl, cons in (("triton", 2), ("gluon_ws", 2), ("gluon_ws", 3), ("gluon_ws", 2), ("gluon_ws", 3)):
        r.KNOBS.update({"FULL_IMPL": impl, "FULL_WS_CONSUMERS": cons})
        ms.setdefault(f"{impl}{cons}", []).append(triton.testing.do_bench(
            lambda q=q, k=k, v=v, o=o: r.prefill(q, k, v, 0.088, o), warmup=50, rep=300))
    print(f"ragged prefill B{B} S{S} ms: " + ", ".join(f"{k} {' / '.join(f'{x:.4f}' for x in v)}"
                                                       for k, v in ms.items()), flush=True)
r.KNOBS["FULL_WS_CONSUMERS"] = 2

# The fused decode merge (the last chunk program folds) against the PDL merge launch: bits, mixed lengths.
r.KNOBS.update({"DECODE_FINISH_SINGLE": True, "DECODE_MERGE_LOADS": 8, "DECODE_MERGE_ROWS": 1})
for split in (1024, 512):  # at split 512 only the three-consumer kernels (compiling each costs seconds)
    r.KNOBS["SPLIT_TOKENS"] = split
    configs = CONFIGS if split == 1024 else [c for c in CONFIGS if c[0] == "triton" or c[3] == 3]
    for B, cap in ((1, 8192), (16, 8192), (7, 3000)):
        q = torch.randn(B, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(B, 8, cap, 128, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn(B, 8, cap, 128, device="cuda", dtype=torch.bfloat16)
        ctx = torch.randint(1, cap + 1, (B,), device="cuda", dtype=torch.int32)
        ctx[0] = cap
        res = {}
        for launch in ("pdl", "fused", "fused"):  # fused twice: the counters must be back at zero
            r.KNOBS["DECODE_MERGE_LAUNCH"] = launch
            o = torch.empty_like(q)
            o32 = torch.empty(q.shape, device="cuda", dtype=torch.float32)
            r.decode(q, kc, vc, ctx, 0.088, o, o32)
            torch.cuda.synchronize()
            res.setdefault(launch, []).append((o, o32))
        for i, (o, o32) in enumerate(res["fused"]):
            print(f"decode split {split} B{B} cap{cap} fused #{i}: bf16 diff {diff(o, res['pdl'][0][0], torch.int16)} "
                  f"fp32 diff {diff(o32, res['pdl'][0][1], torch.int32)}", flush=True)
