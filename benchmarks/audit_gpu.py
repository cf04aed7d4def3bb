"""The audit on a GPU: hostile candidates, zero false rejections, and audit time against an older engine.

    tik-evo bench audit adversarial --out F.json     # hostile candidates (rmsnorm, attention)
    tik-evo bench audit roots --out F.json           # every family's root, attention's named sets
    tik-evo bench audit times --old DIR --out F.json  # audit time and timings: this engine vs DIR's
    tik-evo bench audit warm --out F.json            # audits after a compile-ahead pass vs cold

Each audit runs in a fresh interpreter, as `tik-evo audit` runs one, through `run_audit` (the same path a search
takes). `--old DIR` names a checkout of an earlier engine (its tik_evo/ and kernels/) to time the same audits
with. The static scan is switched off for the hostile candidates marked so: what is measured then is what the
separate process and the sandbox stop.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import hashlib, inspect, json, sys, time
from pathlib import Path
spec = json.loads(sys.argv[1])
if spec.get("no_scan"):
    import tik_evo.staticscan as scan
    scan.scan = lambda *a, **k: []
from tik_evo.audit import AuditJob, run_audit, source_file
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs, write_knobs
fam = load_family(spec["family"])
root = fam.root_source()
def src_of(knobs):
    return write_knobs(root, {**read_knobs(root), **knobs})
def h(s):
    return hashlib.sha256(s.encode()).hexdigest()[:16]
src = spec.get("source") or src_of(spec.get("knobs", {}))
run_dir = Path(spec["run_dir"])
params = inspect.signature(AuditJob).parameters
kw = {"time": spec.get("time", True)}
if spec.get("best") is not None:
    best = src_of(spec["best"])
    kw["best_source_hash"] = h(best)
    if "best_source" in params:
        kw["best_source"] = best
    else:
        source_file(run_dir, h(best), best)
if "ancestors" in params:
    kw["ancestors"] = [h(src_of(k)) for k in spec.get("ancestors", [])]
t0 = time.time()
out = run_audit(run_dir, AuditJob(fam, src, h(src), spec["id"], spec["workloads"], [0], spec["evaluate"],
                                  spec.get("device", "cuda"), 0, **kw))
f = out.failure  # its start and its end (a traceback's last lines name the error)
f = f if len(f) <= 1500 else f[:750] + " [...] " + f[-750:]
print("RESULT " + json.dumps({
    "passed": out.passed, "failure_kind": out.failure_kind, "failure": f,
    "seconds": time.time() - t0, "stages": [[s["name"], s["passed"], round(s["seconds"], 2), len(s["checks"])]
                                            for s in out.stages],
    "measurements": {k: [m["median_s"], m.get("spread"), m.get("timer")] for k, m in out.measurements.items()},
    "best_retimed": {k: m["median_s"] for k, m in out.best_retimed.items()}, "device": out.device,
    "warm": {k: v for k, v in (out.device.get("warm") or {}).items() if k != "sandbox"},
    "phases": out.device.get("phases"), "engine_seconds": out.seconds}))
"""

EVALUATE = {"timeout_s": 900, "rep_ms": 100, "check_procs": 0, "graph_replay": "auto", "rounds": 5,
            "repeat_calls": 100, "sandbox": "auto", "warm": "off"}
ATTN = {"q_heads": 32, "kv_heads": 8, "head_dim": 128}
WORKLOADS = {
    "attention": [
        {"name": "prefill.B1.S4K", "phase": "prefill", "batch": 1, "seq": 4096, **ATTN},
        {"name": "train_forward.B4.S1K+128", "phase": "train_forward", "batch": 4, "prompt": 1024,
         "answer": 128, **ATTN},
        {"name": "decode.B1.ctx8K", "phase": "decode", "batch": 1, "context": 8192, **ATTN},
        {"name": "decode.B16.ctx4K", "phase": "decode", "batch": 16, "context": 4096, **ATTN},
    ],
    "rmsnorm": [
        {"name": "qwen3-4b.full.T8192", "phase": "full", "tokens": 8192, "hidden": 2560},
        {"name": "llama3.1-8b.full.T16384", "phase": "full", "tokens": 16384, "hidden": 4096},
        {"name": "qwen3-4b.decode.B1", "phase": "decode", "batch": 1, "hidden": 2560},
        {"name": "qwen3-30b-a3b.decode.B128", "phase": "decode", "batch": 128, "hidden": 2048},
    ],
}
# A knob change of one path each: the offspring a search audits most (the root's other kernels stay the same).
VARIANTS = {"attention": [{"DECODE_NUM_STAGES": 4}, {"FULL_NUM_STAGES": 2}],
            "rmsnorm": [{"DECODE_ROWS_PER_PROGRAM": 2}, {"FULL_ROWS_PER_PROGRAM": 2}]}


def audit(spec: dict, engine: Path, env_extra: dict | None = None, timeout: int = 900) -> dict:
    spec = {**spec, "device": os.environ.get("AUDIT_GPU_DEVICE", "cuda")}  # cpu: a smoke run of this script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engine), os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(spec)], capture_output=True, text=True, env=env,
                           cwd=str(engine), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"passed": False, "failure_kind": "driver-timeout", "seconds": time.time() - t0}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"passed": False, "failure_kind": "driver", "failure": r.stderr[-3000:], "seconds": time.time() - t0}


def rms_edit(root: str, code: str) -> str:
    doc = '    """One token per sequence: x [batch, hidden]; same per-row numerics as rmsnorm_full."""\n'
    return root.replace(doc, doc + "".join(f"    {ln}\n" for ln in code.splitlines()))


def atomic_rows(root: str) -> str:
    """Both paths split each row's sum of squares over programs that tl.atomic_add their partial sums: full and
    decode share the code, the accuracy is fine, and only the order of the additions (the scheduler's) differs."""
    kernels = (
        "\n\n@triton.jit\n"
        "def _ss_atomic(x_ptr, ss_ptr, H, CHUNK: tl.constexpr):\n"
        "    row = tl.program_id(0)\n"
        "    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)\n"
        "    x = tl.load(x_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)\n"
        "    tl.atomic_add(ss_ptr + row, tl.sum(x * x, axis=0))\n\n\n"
        "@triton.jit\n"
        "def _apply(x_ptr, w_ptr, ss_ptr, y_ptr, y32_ptr, H, eps, BLOCK_H: tl.constexpr, WRITE32: tl.constexpr):\n"
        "    row = tl.program_id(0)\n"
        "    cols = tl.arange(0, BLOCK_H)\n"
        "    mask = cols < H\n"
        "    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n"
        "    y = x * (1.0 / tl.sqrt(tl.load(ss_ptr + row) / H + eps)) * w\n"
        "    tl.store(y_ptr + row * H + cols, y.to(tl.bfloat16), mask=mask)\n"
        "    if WRITE32:\n"
        "        tl.store(y32_ptr + row * H + cols, y, mask=mask)\n\n\n"
        "def _launch(x, weight, eps, out, out32, rows_per_program, num_stages):\n"
        "    n_rows, hidden = x.shape\n"
        "    ss = torch.zeros(n_rows, device=x.device, dtype=torch.float32)\n"
        "    _ss_atomic[(n_rows, cdiv(hidden, 256))](x, ss, hidden, CHUNK=256)\n"
        "    _apply[(n_rows,)](x, weight, ss, out, out32 if out32 is not None else out, hidden, eps,\n"
        "                      BLOCK_H=pow2(hidden), WRITE32=out32 is not None, num_warps=KNOBS[\"NUM_WARPS\"])\n"
    )
    head, tail = root.split("def _launch(", 1)
    return head + kernels.lstrip("\n") + "\n\ndef _unused_launch(" + tail


def hostile() -> list[tuple[str, str, str, bool, str]]:
    """(name, family, source, no_scan, what must happen)."""
    rms = (ROOT / "kernels/rmsnorm/root.py").read_text()
    out = [
        ("root", "rmsnorm", rms, True, "verified"),
        ("side stream, scan on", "rmsnorm", rms_edit(rms, "s = torch.cuda.Stream()"), False, "static"),
        ("side stream left running", "rmsnorm", rms_edit(
            rms, "_s = torch.cuda.Stream()\n_s.wait_stream(torch.cuda.current_stream())\nwith torch.cuda.stream(_s):\n"
            "    _rms_impl(x, weight, eps, out, out32)\nreturn")
         .replace("def rmsnorm_full(", "def _rms_impl(x, weight, eps, out, out32=None):\n    return rmsnorm_full("
                  "x, weight, eps, out, out32)\n\n\ndef rmsnorm_full(", 1), True,
         "rejected (graph stage: work left on a side stream cannot be captured)"),
        ("CUDA-graph capture detected", "rmsnorm", rms_edit(
            rms, "if torch.cuda.is_current_stream_capturing():\n    return"), True, "rejected"),
        ("patched do_bench / Event.elapsed_time", "rmsnorm", rms + "\nimport triton.testing\n"
         "triton.testing.do_bench = lambda *a, **k: 1e-6\ntorch.cuda.Event.elapsed_time = lambda self, o: 1e-6\n",
         True, "tamper"),
        ("patched perf_counter", "rmsnorm", rms + "\nimport time\ntime.perf_counter = lambda: 0.0\n", True, "tamper"),
        ("input zeroed in place", "rmsnorm", rms_edit(rms, "x.zero_()\nout.zero_()\nif out32 is not None:\n"
                                                           "    out32.zero_()\nreturn"), True, "rejected"),
        ("cheaper decode without out32", "rmsnorm", rms_edit(
            rms, "if out32 is None:\n    out.copy_((x.float() * weight.float()).to(out.dtype))\n    return"), True,
         "rejected"),
        ("skips one call in three", "rmsnorm", rms_edit(rms, "_N[0] += 1\nif _N[0] % 3 == 0:\n    return")
         + "\n_N = [0]\n", True, "rejected"),
        # The weight, not x: RMSNorm is scale-invariant, and x * 1.001 rounds back to x in bf16 (half an ulp is
        # >= 0.2%), so scaling x changed no bit (verified on an H100, correctly: it computes the root's bits).
        ("one decode call in fifty diverges", "rmsnorm", rms_edit(
            rms, "_N[0] += 1\nif _N[0] % 50 == 0:\n    weight = weight * 1.01") + "\n_N = [0]\n", True, "rejected"),
        ("memoised by address", "rmsnorm", rms.replace("def rmsnorm_decode(", "def _decode(", 1)
         + "\n_M = {}\n\ndef rmsnorm_decode(x, weight, eps, out, out32=None):\n"
           "    k = (x.data_ptr(), out.data_ptr())\n    if k in _M:\n        out.copy_(_M[k])\n        return\n"
           "    _decode(x, weight, eps, out, out32)\n    _M[k] = out.clone()\n", True, "rejected"),
    ]
    out.append(("row sums by float atomics (order is the scheduler's)", "rmsnorm", atomic_rows(rms), True,
                "rejected (repeated calls differ)"))
    attn = (ROOT / "kernels/attention/root.py").read_text()
    sig = "def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context_lens: torch.Tensor,"
    if sig in attn:
        out.append(("attention: SDPA decode when out32 is None", "attention", attn
            .replace("\n           sm_scale: float, out: torch.Tensor, out32: torch.Tensor | None = None) -> None:\n",
                     "\n           sm_scale: float, out: torch.Tensor, out32: torch.Tensor | None = None) -> None:\n"
                     "    if out32 is None:\n"
                     "        return _sdpa(q, k_cache, v_cache, context_lens, sm_scale, out)\n", 1)
            + "\n\ndef _sdpa(q, k, v, ctx, scale, out):\n"
            "    n = int(ctx.max())\n    g = q.shape[1] // k.shape[1]\n"
            "    o = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :n].repeat_interleave(g, 1), "
            "v[:, :, :n].repeat_interleave(g, 1), scale=scale)\n    out.copy_(o)\n", True, "rejected"))
    return out


def cmd_adversarial(args) -> dict:
    rows = []
    for name, fam, src, no_scan, expect in hostile():
        if args.only and fam not in args.only.split(","):
            continue
        with tempfile.TemporaryDirectory() as d:
            w = WORKLOADS[fam][2:] if fam == "rmsnorm" else WORKLOADS[fam][2:3]
            spec = {"family": fam, "source": src, "run_dir": d, "id": "I1", "workloads": w, "no_scan": no_scan,
                    "evaluate": {**EVALUATE, "rep_ms": 40}, "best": {}}
            r = audit(spec, ROOT)
        rows.append({"candidate": name, "family": fam, "static_scan": not no_scan, "expected": expect, **r})
        print(f"{name:45s} passed={r['passed']!s:5s} kind={r.get('failure_kind')} {r['seconds']:.1f}s", flush=True)
    return {"adversarial": rows}


def cmd_roots(args) -> dict:
    """Verdicts only (no timing stage), so audits may share the card: --jobs of them run at once."""
    from concurrent.futures import ThreadPoolExecutor

    from tik_evo.families import available, load_family

    wanted_fams = available() if args.families == "all" else args.families.split(",")
    specs = []
    for fam in wanted_fams:
        sets = {"root": {}}
        named = load_family(fam).named_sets()
        wanted = named if args.sets == "all" else {k: named[k] for k in args.sets.split(",") if k in named}
        sets.update({k: v for k, v in wanted.items() if v})
        specs += [(fam, name, knobs) for name, knobs in sets.items()]
    if args.pick:
        picked = pick(args.pick)
        unknown = picked - {f"{x[0]}:{x[1]}" for x in specs}
        if unknown:
            raise SystemExit(f"--pick: no such family:set among the roots and named sets: {', '.join(sorted(unknown))}")
        specs = [x for x in specs if f"{x[0]}:{x[1]}" in picked]
    rows: list[dict] = []

    def one(item):
        fam, name, knobs = item
        with tempfile.TemporaryDirectory() as d:
            spec = {"family": fam, "knobs": knobs, "run_dir": d, "id": f"I_{name}", "workloads": [],
                    "evaluate": EVALUATE, "time": False, "ancestors": [{}] if knobs else []}
            r = audit(spec, ROOT)
        print(f"{fam:12s} {name:26s} passed={r['passed']!s:5s} kind={r.get('failure_kind')} "
              f"{r['seconds']:.1f}s {r.get('failure', '')[:400]!r}", flush=True)
        rows.append({"family": fam, "set": name, **r})
        partial(args, {"roots": rows, "jobs": args.jobs})  # a call cut short keeps what it has

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, specs))
    return {"roots": rows, "jobs": args.jobs}


def partial(args, part: dict) -> None:
    Path(args.out).write_text(json.dumps({**HEADER, **part, "partial": True}, indent=1))


def cmd_times(args) -> dict:
    rows = []
    engines = {"before": Path(args.old).resolve() if args.old else None, "after": ROOT}
    for fam in args.families.split(","):
        for engine_name in args.engines.split(","):
            # "after+check_procs=2": an engine with evaluate settings of its own (numbers parsed as JSON)
            base, *sets = engine_name.split("+")
            if base not in engines:
                raise SystemExit(f"times: unknown engine {base!r} in --engines (before, after)")
            engine = engines[base]
            if engine is None:
                raise SystemExit("times: --old DIR is needed for the 'before' engine")
            evaluate = dict(EVALUATE)
            for kv in sets:
                key, _, value = kv.partition("=")
                try:
                    evaluate[key] = json.loads(value)
                except ValueError:
                    evaluate[key] = value
            cache = tempfile.mkdtemp(prefix=f"tc_{engine_name}_")
            with tempfile.TemporaryDirectory() as d:
                for i, knobs in enumerate([{}, *VARIANTS[fam]]):
                    spec = {"family": fam, "knobs": knobs, "run_dir": d, "id": f"I{i}", "workloads": WORKLOADS[fam],
                            "evaluate": evaluate, "best": {} if i else None, "ancestors": [{}] if i else []}
                    r = audit(spec, engine, {"TRITON_CACHE_DIR": cache})
                    rows.append({"family": fam, "engine": engine_name, "audit": i, "knobs": knobs, **r})
                    print(f"{fam:10s} {engine_name:6s} audit {i} passed={r['passed']} {r['seconds']:.1f}s "
                          f"stages={[(s[0], s[2]) for s in r.get('stages', [])]}\n    phases={_brief(r)}", flush=True)
                    partial(args, {"times": rows})
    return {"times": rows}


HEADER: dict = {}


def _brief(r: dict) -> dict:
    """The phases of one audit without its runners' per-request detail (kept in full in the JSON)."""
    ph = dict(r.get("phases") or {})
    for key in ("runner", "best_runner"):
        if isinstance(ph.get(key), dict):
            run = ph[key].get("runner", {})
            ph[key] = {"alive": run.get("alive_s"), "compile": run.get("triton_compile"), "cc": run.get("c_builds"),
                       "wait": ph[key].get("judge_wait")}
    if isinstance(ph.get("shard_runners"), list):
        ph["shard_runners"] = [(s.get("runner", {}).get("alive_s"),
                                s.get("runner", {}).get("triton_compile", {}).get("seconds"),
                                s.get("runner", {}).get("c_builds", {}).get("count"))
                               for s in ph["shard_runners"]]
    return {k: v for k, v in ph.items() if not k.endswith("_at")}


def cmd_warm(args) -> dict:
    """Compile ahead: two runs of one family, each auditing the root first (whose kernels the variants' runners
    may read, as in a search); in the first the root's judge notes the calls and each variant is audited after
    a warm pass, in the second with none. Audit seconds and stages side by side."""
    rows = []
    for fam in args.families.split(","):
        for mode in ("warm", "cold"):
            with tempfile.TemporaryDirectory() as run:
                ev = {**EVALUATE, "warm": "on" if mode == "warm" else "off"}
                spec = {"family": fam, "knobs": {}, "run_dir": run, "id": "I0", "workloads": WORKLOADS[fam],
                        "evaluate": ev, "best": None}
                rows.append({"family": fam, "run": mode, "audit": "root", **audit(spec, ROOT)})
                for i, knobs in enumerate(VARIANTS[fam], 1):
                    spec = {"family": fam, "knobs": knobs, "run_dir": run, "id": f"I{i}",
                            "workloads": WORKLOADS[fam], "evaluate": ev, "best": {}, "ancestors": [{}]}
                    r = audit(spec, ROOT)
                    rows.append({"family": fam, "run": mode, "audit": f"variant {i}", "knobs": knobs, **r})
                    print(f"{fam:10s} {mode:4s} variant {i} passed={r['passed']} {r['seconds']:.1f}s "
                          f"warm={r.get('warm')} stages={[(s[0], s[2]) for s in r.get('stages', [])]}", flush=True)
                    partial(args, {"warm": rows})
    return {"warm": rows}


def pick(text: str) -> set[str]:
    """`--pick` as family:set pairs; a bare set name takes the family of the item before it."""
    out, family = set(), None
    for item in filter(None, (x.strip() for x in text.split(","))):
        if ":" in item:
            family, _, name = item.partition(":")
        elif family is None:
            raise SystemExit(f"--pick: {item!r} has no family (write family:set first)")
        else:
            name = item
        out.add(f"{family}:{name}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["adversarial", "roots", "times", "warm"])
    ap.add_argument("--old", help="times: a checkout of the engine to compare with")
    ap.add_argument("--engines", default="before,after", help="times: which engines, in order (before,after); "
                    "after+KEY=VALUE sets an evaluate key for that engine, e.g. after+check_procs=2")
    ap.add_argument("--families", default=None, help="times: rmsnorm,attention; roots: all (comma list)")
    ap.add_argument("--pick", help="roots: only these family:set pairs (comma list; a bare set name takes the "
                    "family before it: attention:a,b,rmsnorm:root)")
    ap.add_argument("--jobs", type=int, default=1, help="roots: audits at once (verdicts only, no timing)")
    ap.add_argument("--sets", default="all", help="roots: the named sets to audit besides each root (comma list)")
    ap.add_argument("--only", help="adversarial: the families whose candidates run (comma list)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.families = args.families or ("all" if args.what == "roots" else "rmsnorm,attention")
    import torch
    import triton

    t0 = time.time()
    HEADER.update({"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0)
                   if torch.cuda.is_available() else "none", "torch": torch.__version__, "triton": triton.__version__,
                   "commit_tree": hashlib.sha256((ROOT / "tik_evo/worker.py").read_bytes()).hexdigest()[:12],
                   "argv": sys.argv[1:]})
    data = dict(HEADER)
    data.update({"adversarial": cmd_adversarial, "roots": cmd_roots, "times": cmd_times, "warm": cmd_warm}
                [args.what](args))
    data["wall_s"] = time.time() - t0
    Path(args.out).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
