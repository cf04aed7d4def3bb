"""Quick GPU smoke of the Gluon prefill (FULL_IMPL) against the Triton one, bits compared; run before long
benchmarks so that a hang costs seconds, not the whole call: python3 benchmarks/attention_ws_smoke.py"""
import sys

import torch

sys.path.insert(0, ".")
import kernels.attention.root as r

r.KNOBS.update({"FULL_SPLIT_LOOP": "flatten"})
for S, D, HQ, HKV in ((1984, 128, 32, 8), (1088, 64, 8, 8), (4096, 128, 32, 8), (192, 128, 4, 1)):
    q = torch.randn(2, HQ, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, HKV, S, D, device="cuda", dtype=torch.bfloat16)
    outs = {}
    for impl, sched, pers in (("triton", "overlap", "off"), ("gluon_ws", "overlap", "off"),
                              ("gluon_ws", "serial", "off"), ("gluon_ws", "overlap", "snake"),
                              ("gluon_ws", "serial", "snake")):
        r.KNOBS.update({"FULL_IMPL": impl, "FULL_WS_SCHEDULE": sched, "FULL_WS_PERSISTENT": pers})
        o = torch.empty_like(q)
        o32 = torch.empty(q.shape, device="cuda", dtype=torch.float32)
        used = r._ws_prefill(q, k, v, 0.1, o, o32) if impl != "triton" else r.prefill(q, k, v, 0.1, o, o32)
        torch.cuda.synchronize()
        outs[(impl, sched, pers)] = (o, o32, used)
    ref = outs[("triton", "overlap", "off")]
    for key, (o, o32, used) in outs.items():
        print(S, D, key, "ws ran" if used else "", "bf16 diff", int((o.view(torch.int16) != ref[0].view(torch.int16)).sum()),
              "fp32 diff", int((o32.view(torch.int32) != ref[1].view(torch.int32)).sum()), flush=True)
