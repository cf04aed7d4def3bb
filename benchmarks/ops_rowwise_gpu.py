"""GPU benchmark of the row-wise and elementwise families (rmsnorm, add_rmsnorm, qk_rmsnorm, rope, silu_mul,
kv_append, embedding): each family's root (and any `extras`: a run's best, a kernel file) against torch eager,
torch.compile and Liger-Kernel where Liger has the op; bitwise path consistency at model shapes (the families'
own checks, run on the GPU); achieved bandwidth against a device-to-device copy ceiling measured in the same run.
Writes JSON to --out; prints a table last.
rope is timed several ways: `root_us` looks each token's cos/sin row up in the table by position (as the engine
times it); on rotated sets like the peers, `root_table_us` the same lookup, `root_rows_us` rows pre-gathered
outside the timed region as Liger's cos/sin are (a model gathers them once per step for all layers) and
`root_inplace_us` those rows rotated in place (q_out = q); `rows_bitwise` says rows and table gave the same bits.
silu_mul's root reads the two halves of a fused gate_up output (the engine's bench); `root_separate_us` times it
on two separate tensors, the inputs Liger's SwiGLU is given.

    tik-evo bench ops-rowwise [--families a,b] [--out DIR] [--all-workloads]

An extra implementation (`run(..., extras=)`, from `tik-evo bench ops --best / --kernel`) is checked like the
root (the same cases on this GPU) and timed on the same cells right after it: `<label>_us`,
`<label>_verify_passed` in each row, `x root` (the root's time over its time) in the table.

Full-sequence workloads are timed with triton.testing.do_bench (median), or as graph replays where that reads
under FULL_GRAPH_BELOW_US; decode workloads as CUDA-graph replays of 20 launches (per-launch median), peers the
same way (torch.compile: full workloads only). With
`--rounds N` the root and its peers are timed N times, interleaved, and each figure is the median of its rounds
(`<name>_us_rounds` keeps them): for cells where one reading is not enough.
Imports only torch/triton/numpy/yaml + tik_evo.family/checks.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from tik_evo import checks  # noqa: E402
from tik_evo.candidate import load_module  # noqa: E402
from tik_evo.timing import graph_replay_us  # noqa: E402
from tik_evo_kernels.peers import hf_rmsnorm, rotate_half  # noqa: E402

FAMILIES = ("rmsnorm", "add_rmsnorm", "silu_mul", "rope", "qk_rmsnorm", "embedding", "kv_append")
EPS = 1e-6
GRAPH_CALLS = 20
DEVICE = "cuda"  # "cpu" (with --dry-run) exercises every code path under TRITON_INTERPRET=1
WORKLOADS = "_models"  # workloads/<family><WORKLOADS>.yaml
BUDGET = {"deadline": float("inf")}  # wall-clock guard: past it, skip torch.compile and remaining peers
ROUNDS = {"n": 1}  # --rounds: root and peers timed again in interleaved rounds; each figure the median of its rounds

# Timed workloads per family (names from workloads/<family>_models.yaml): the largest full pass, a small one,
# and decode at batch 1 and 256. --all-workloads times every entry.
SELECT = {
    "rmsnorm": ("qwen3-4b.full.T32768", "qwen3-30b-a3b.full.T4096", "qwen3-4b.decode.B1", "qwen3-4b.decode.B256"),
    "add_rmsnorm": ("llama-3.1-8b.full.T32768", "qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B1",
                    "qwen3-4b.decode.B256"),
    "qk_rmsnorm": ("qwen3-4b.full.T32768", "qwen3-30b-a3b.full.T4096", "qwen3-4b.decode.B1", "qwen3-4b.decode.B256"),
    "rope": ("llama-3.1-8b.full.T32768", "qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B1", "qwen3-4b.decode.B256"),
    "silu_mul": ("llama-3.1-8b.full.T32768", "qwen3-30b-a3b.full.T4096", "qwen3-4b.decode.B1",
                 "qwen3-4b.decode.B256"),
    "kv_append": ("llama-3.1-8b.full.T32768", "qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B1",
                  "qwen3-4b.decode.B256"),
    "embedding": ("llama-3.1-8b.full.T32768", "qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B1",
                  "qwen3-4b.decode.B256"),
}

# GPU consistency cases at model shapes (token counts not multiples of any block), on top of check_cases("full").
GPU_CASES = {
    "rmsnorm": [{"tokens": 4099, "hidden": 4096, "seqs": 7}, {"tokens": 1029, "hidden": 1536, "seqs": 5, "scale": 30.0},
                {"tokens": 2053, "hidden": 2560, "seqs": 256}],
    "add_rmsnorm": [{"tokens": 4099, "hidden": 4096, "seqs": 7}, {"tokens": 1029, "hidden": 1536, "seqs": 5,
                                                                  "scale": 30.0},
                    {"tokens": 2053, "hidden": 2560, "seqs": 256}],
    "qk_rmsnorm": [{"tokens": 2051, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "seqs": 6},
                   {"tokens": 1001, "q_heads": 32, "kv_heads": 4, "head_dim": 128, "seqs": 256}],
    "rope": [{"lengths": [1000, 3001, 17, 77], "q_heads": 32, "kv_heads": 8, "head_dim": 128, "theta": 5e5,
              "scaling": "llama3"},
             {"lengths": [513, 2, 1029], "q_heads": 12, "kv_heads": 2, "head_dim": 128, "theta": 1e6,
              "start": 28000}],
    "silu_mul": [{"tokens": 1031, "intermediate": 14336, "seqs": 5}, {"tokens": 2000, "intermediate": 768,
                                                                      "seqs": 256, "fused": True},
                 {"tokens": 517, "intermediate": 8960, "seqs": 9, "scale": 8.0}],
    "kv_append": [{"prompts": [1000, 513, 77], "answers": [5, 9, 3], "page_size": 16, "kv_heads": 8,
                   "head_dim": 128},
                  {"prompts": [301, 45], "answers": [4, 2], "page_size": 0, "kv_heads": 2, "head_dim": 128}],
    "embedding": [{"tokens": 4099, "vocab": 151936, "hidden": 2560, "seqs": 9},
                  {"tokens": 1000, "vocab": 128256, "hidden": 4096, "seqs": 256, "int64": True}],
}


# Knob sweep (--sweep): path-knob variants of each root timed on a few workloads, peers timed alongside.
SWEEP = {
    # silu_mul (root: 1024-wide column blocks of 4 warps, evict-first hints in the decode path): decode launch
    # shapes, Liger's one 32-warp program per row included, all ran the same at B256
    # (rowwise_sweep_silu_waves_h100_2026-12-05.json); the hints read 2.5% faster at decode B256 (7 rounds on an
    # H100, 2026-12-06) and cost 6% at 32K tokens in the full path (2026-12-03), so the decode path alone takes them.
    "silu_mul": (("qwen3-4b.decode.B256", "qwen3-4b.decode.B1"), [
        {}, {"DECODE_STREAMING": False}, {"DECODE_COLS_FASTEST": True}, {},
        {"DECODE_STREAMING": False}, {"DECODE_BLOCK_I": 2048, "DECODE_NUM_WARPS": 8}, {},
        {"DECODE_STREAMING": False}]),
    # rope (root: early loads, 2 decode warps, auto head split; measured in rowwise_sweep2_2026-12-02.json against
    # the serial root, the split and in-kernel cos/sin): decode warps and tokens per program around the new root.
    "rope": (("qwen3-4b.decode.B1", "qwen3-4b.decode.B256", "llama-3.1-8b.full.T32768"), [
        {}, {"DECODE_HEAD_SPLIT": 1}, {"DECODE_NUM_WARPS": 1}, {"DECODE_NUM_WARPS": 4, "DECODE_TOKENS_PER_PROGRAM": 2},
        {"DECODE_NUM_WARPS": 1, "DECODE_HEAD_SPLIT": 2}]),
    # rmsnorm (root: 256-wide chunks, 4 warps, read twice): the h200_rmsnorm campaign's best (1024-wide), and
    # whole rows in one chunk (read once, kept in registers) at several warp counts (contract knobs).
    "rmsnorm": (("qwen3-4b.decode.B1", "qwen3-4b.decode.B256", "qwen3-30b-a3b.full.T4096", "qwen3-4b.full.T32768"), [
        {}, {"BLOCK_H": 1024}, {"BLOCK_H": 4096, "NUM_WARPS": 4}, {"BLOCK_H": 4096, "NUM_WARPS": 8},
        {"BLOCK_H": 4096, "NUM_WARPS": 16}, {"BLOCK_H": 2048, "NUM_WARPS": 8},
        {"BLOCK_H": 4096, "NUM_WARPS": 8, "FULL_ROWS_PER_PROGRAM": 2}, {"BLOCK_H": 4096, "NUM_WARPS": 2}]),
    # add_rmsnorm (root: weight loaded with x and the residual): the previous late load, and 4 warps (contract).
    "add_rmsnorm": (("qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B256"), [
        {}, {"FULL_WEIGHT_LOAD": "late", "DECODE_WEIGHT_LOAD": "late"}, {"NUM_WARPS": 4},
        {"DECODE_NUM_STAGES": 2}]),
    # embedding: one program per (token, column block), against the row walk.
    "embedding": (("qwen2.5-1.5b.full.T4096", "qwen3-4b.decode.B256", "llama-3.1-8b.full.T32768"), [
        {}, {"FULL_SPLIT_ROW": True, "DECODE_SPLIT_ROW": True},
        {"FULL_SPLIT_ROW": True, "DECODE_SPLIT_ROW": True, "FULL_BLOCK_H": 512, "DECODE_BLOCK_H": 512,
         "FULL_NUM_WARPS": 2, "DECODE_NUM_WARPS": 2},
        {"FULL_BLOCK_H": 2048, "FULL_NUM_WARPS": 8, "DECODE_BLOCK_H": 2048, "DECODE_NUM_WARPS": 8},
        {}]),
}


def load_variant(family: str, changes: dict):
    import tempfile

    from tik_evo.knobs import read_knobs, write_knobs

    src = (ROOT / "kernels" / family / "root.py").read_text()
    knobs = read_knobs(src)
    knobs.update(changes)
    path = Path(tempfile.mkdtemp()) / f"{family}_variant.py"
    path.write_text(write_knobs(src, knobs))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep(families, out_dir: Path) -> dict:
    liger = load_liger()
    result = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "gpu": _device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "liger": liger["version"] if liger else None},
              "sweep": {}}
    lines = []
    for family in families:
        if family not in SWEEP:
            continue
        names, variants = SWEEP[family]
        fam = importlib.import_module(f"tik_evo_kernels.{family}").FAMILY
        fam_mod = importlib.import_module(f"tik_evo_kernels.{family}.family")
        wl = {w["name"]: w for w in yaml.safe_load((ROOT / "workloads" / f"{family}{WORKLOADS}.yaml").read_text())
              ["workloads"]}
        rows = []
        peer_t = {}
        for n in names:
            timer = time_full if wl[n]["phase"] == "full" else time_graph
            peer_t[n] = {k: timer(fn) for k, fn in peers(family, wl[n], liger, fam_mod).items()}
        for changes in variants:
            impl = load_variant(family, changes)
            row = {"knobs": changes}
            for n in names:
                timer = time_full if wl[n]["phase"] == "full" else time_graph
                b = fam.make_bench(impl, wl[n], 0, DEVICE)
                row[n] = timer(b.run)
                row[n + ".verify"] = all(c.passed for c in b.verify())
                del b
            rows.append(row)
            cells = " ".join(f"{n.split('.', 1)[1]}={row[n]:.2f}"
                             f"({'/'.join(f'{k}:{v / row[n]:.2f}' for k, v in peer_t[n].items())})"
                             for n in names)
            lines.append(f"{family:<12}{json.dumps(changes):<60} {cells}")
            print(lines[-1], flush=True)
        result["sweep"][family] = {"peers_us": peer_t, "variants": rows}
        (out_dir / "rowwise_sweep.json").write_text(json.dumps(result, indent=1, default=str))
    print("\nsweep (us; peer time / variant time in brackets)")
    print("\n".join(lines))
    return result


def load_root(family: str):
    return load_module(ROOT / "kernels" / family / "root.py", f"root_{family}")


def load_liger():
    try:
        import liger_kernel
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
        from liger_kernel.ops.rms_norm import rms_norm_forward
        from liger_kernel.ops.rope import rope_forward
        from liger_kernel.ops.swiglu import swiglu_forward
        version = getattr(liger_kernel, "__version__", None)
        if version is None:
            from importlib.metadata import version as _v
            version = _v("liger-kernel")
        return {"version": version, "rms_norm": rms_norm_forward, "fused_add": fused_add_rms_norm_forward,
                "rope": rope_forward, "swiglu": swiglu_forward}
    except Exception as e:  # noqa: BLE001
        print(f"liger unavailable: {e!r}")
        return None


# ---------------------------------------------------------------- timing
def _device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter dry run)"


def _wall_us(fn, reps: int = 2) -> float:
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps * 1e6


# Full cells shorter than this by do_bench are timed as graph replays instead: one call's events then also hold
# the host time of an implementation slow to launch (Liger's rms_norm read 75-83 us at 4K tokens where ours read
# 13.8, and a 16 us launch of ours read 10.7-18.1 over five rounds), which is not the kernel's time.
FULL_GRAPH_BELOW_US = 50.0


def time_full(fn) -> float:
    if DEVICE != "cuda":
        return _wall_us(fn)
    fn()
    torch.cuda.synchronize()
    us = float(triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median")) * 1e3
    if us < FULL_GRAPH_BELOW_US:
        try:
            return graph_replay_us(fn, calls=GRAPH_CALLS)
        except Exception:  # noqa: BLE001 - an implementation that cannot be captured keeps its event time
            torch.cuda.synchronize()
    return us


def time_graph(fn) -> float:
    """Per-launch time of GRAPH_CALLS launches captured in one CUDA graph (median over replays)."""
    if DEVICE != "cuda":
        return _wall_us(fn)
    return graph_replay_us(fn, calls=GRAPH_CALLS)


def copy_ceiling() -> dict:
    n = 1 << 30 if DEVICE == "cuda" else 1 << 20  # 1 GiB of bf16 copied: 2 GiB moved
    src = torch.randn(n // 2, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = time_full(lambda: dst.copy_(src))
    src = dst = None
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {"bytes": 2 * n, "us": us, "GBps": 2 * n / us / 1e3}


# ---------------------------------------------------------------- peers (eager torch, as HF models compute)
def rot_cos_sin(fam_mod, workload, pos):
    cos, sin = fam_mod.rope_table(int(pos.max()) + 1, workload["head_dim"], workload["theta"],
                                  workload.get("scaling"), DEVICE)
    cos2 = torch.cat([cos, cos], -1)[pos.long()]  # HF layout: full head_dim, per token, gathered once per model
    sin2 = torch.cat([sin, sin], -1)[pos.long()]
    return cos2, sin2


def peers(family: str, workload: dict, liger, fam_mod, impl=None) -> dict:
    """name -> zero-arg callable on rotated inputs of the workload's shape (outputs may be discarded). With
    `impl` (the timed root or variant) also its other entry forms timed like the peers (rope: "root_rows").

    Rotates through as many input sets as the families' own benches do (`checks.input_copies`), so a peer is
    not served from L2 while ours reads HBM (decode-sized inputs fit in the 60 MB L2)."""
    return rotated(peer_sets(family, workload, liger, fam_mod, impl))


def rotated(sets: list[dict]) -> dict:
    """name -> one callable rotating over the sets' calls of that name."""
    return {name: checks.rotate(lambda f: f(), [s[name] for s in sets]) for name in sets[0]}


def peer_sets(family: str, workload: dict, liger, fam_mod, impl=None) -> list[dict]:
    """As many input sets' peers as rotate out of L2 (one on the CPU)."""
    if DEVICE != "cuda":
        return [peer_set(family, workload, liger, fam_mod, 123, impl)]
    before = torch.cuda.memory_allocated()
    first = peer_set(family, workload, liger, fam_mod, 123, impl)
    n = checks.input_copies(DEVICE, torch.cuda.memory_allocated() - before)
    return [first] + [peer_set(family, workload, liger, fam_mod, 123 + i, impl) for i in range(1, n)]


def compiled_peer(sets: list[dict]):
    """torch.compile of the eager peer, rotated over the input sets like the others. Each set's call is compiled
    (one graph, the sets' tensors its inputs); compiling the rotating wrapper instead traced its Python index
    and timed below the time to read the bytes."""
    calls = [torch.compile(s["torch"], dynamic=False) for s in sets]
    return checks.rotate(lambda f: f(), calls), calls[0]


def peer_set(family: str, workload: dict, liger, fam_mod, seed: int, impl=None) -> dict:
    """One input set's peers: name -> zero-arg callable."""
    full = workload["phase"] == "full"
    T = workload["tokens"] if full else workload["batch"]
    g = checks.generator(seed)
    rnd = lambda *shape, scale=1.0: checks.randn(shape, g, torch.bfloat16, DEVICE, scale)
    out: dict = {}
    if family == "rmsnorm":
        H = workload["hidden"]
        x, w = rnd(T, H), rnd(H, scale=0.5) + 1.0
        out["torch"] = lambda: hf_rmsnorm(x, w)
        if liger:
            out["liger"] = lambda: liger["rms_norm"](x, w, EPS, 0.0, "llama", None)
    elif family == "add_rmsnorm":
        H = workload["hidden"]
        x, r, w = rnd(T, H), rnd(T, H), rnd(H, scale=0.5) + 1.0

        def eager():
            h = x + r
            return hf_rmsnorm(h, w), h
        out["torch"] = eager
        if liger:
            out["liger"] = lambda: liger["fused_add"](x, r, w, EPS, 0.0, "llama")
    elif family == "qk_rmsnorm":
        hq, hk, d = workload["q_heads"], workload["kv_heads"], workload["head_dim"]
        q, k, qw, kw = rnd(T, hq, d), rnd(T, hk, d), rnd(d, scale=0.5) + 1.0, rnd(d, scale=0.5) + 1.0
        out["torch"] = lambda: (hf_rmsnorm(q, qw), hf_rmsnorm(k, kw))
        if liger:
            def lig():
                liger["rms_norm"](q.view(-1, d), qw, EPS, 0.0, "llama", None)
                liger["rms_norm"](k.view(-1, d), kw, EPS, 0.0, "llama", None)
            out["liger"] = lig
    elif family == "rope":
        hq, hk, d = workload["q_heads"], workload["kv_heads"], workload["head_dim"]
        if full:
            L = workload["seq_len"]
            pos = fam_mod.packed_positions([L] * (T // L) + ([T % L] if T % L else [])).to(DEVICE)
        else:
            pos = torch.randint(0, workload["context"], (T,), generator=g).to(DEVICE)
        cos2, sin2 = rot_cos_sin(fam_mod, workload, pos)
        q, k = rnd(T, hq, d), rnd(T, hk, d)
        cb, sb = cos2.to(torch.bfloat16)[:, None, :], sin2.to(torch.bfloat16)[:, None, :]
        out["torch"] = lambda: (q * cb + rotate_half(q) * sb, k * cb + rotate_half(k) * sb)
        if liger:
            ql, kl = rnd(T, hq, d), rnd(T, hk, d)
            c1, s1 = cos2[None], sin2[None]  # [1, T, head_dim] fp32, one row per packed token

            def lig():
                # Liger wants [batch, heads, seq, dim] views of [batch, seq, heads, dim] storage; rotates in place.
                liger["rope"](ql[None].transpose(1, 2), kl[None].transpose(1, 2), c1, s1)
            out["liger"] = lig
        if impl is not None and fam_mod.takes_rows(impl):
            cos, sin = rope_table(fam_mod, workload, pos)
            rows = rope_rows(impl, fam_mod, cos, sin, pos)  # gathered outside the timed region, like cos2/sin2
            fn = impl.rope_full if full else impl.rope_decode
            # one output pair for every input set, as the root's own bench writes: per-set outputs doubled the
            # working set past L2 and timed write-backs the in-place Liger never pays (gpu_2026-12-06.md, section 6)
            if ("rope", T, q.shape[1], k.shape[1]) not in SHARED_OUT:
                SHARED_OUT[("rope", T, q.shape[1], k.shape[1])] = (torch.empty_like(q), torch.empty_like(k))
            qo, ko = SHARED_OUT[("rope", T, q.shape[1], k.shape[1])]
            out["root_rows"] = lambda: fn(q, k, None, None, None, qo, ko, rows=rows)
            # the table lookup timed the same way (rotated sets), so table, rows and Liger compare like for like
            out["root_table"] = lambda: fn(q, k, cos, sin, pos, qo, ko)
            # rotating in place (q_out = q), as Liger does: same bits (tests), written back to the lines just read
            out["root_inplace"] = lambda: fn(q, k, None, None, None, q, k, rows=rows)
    elif family == "silu_mul":
        inter = workload["intermediate"]
        a, b = rnd(T, inter), rnd(T, inter)
        out["torch"] = lambda: F.silu(a) * b
        if liger:
            out["liger"] = lambda: liger["swiglu"](a, b)
        if impl is not None:  # ours on Liger's inputs: two separate contiguous tensors, not a fused gate_up's halves
            # one output for every input set, as the root's bench writes and as Liger's allocation comes back
            if (T, inter) not in SHARED_OUT:
                SHARED_OUT[(T, inter)] = torch.empty((T, inter), dtype=torch.bfloat16, device=DEVICE)
            y = SHARED_OUT[(T, inter)]
            fn = impl.silu_mul_full if full else impl.silu_mul_decode
            out["root_separate"] = lambda: fn(a, b, y)
    elif family == "kv_append":
        hk, d, page = workload["kv_heads"], workload["head_dim"], workload["page_size"]
        n_slots = T * 2 + page
        kc = torch.zeros((n_slots, hk * d), dtype=torch.bfloat16, device=DEVICE)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(n_slots, generator=g)[:T].to(DEVICE)  # vLLM-style slot mapping, computed outside
        k, v = rnd(T, hk * d), rnd(T, hk * d)

        def eager():
            kc[slots] = k
            vc[slots] = v
        out["torch"] = eager
    elif family == "embedding":
        V, H = workload["vocab"], workload["hidden"]
        w = rnd(V, H)
        ids = torch.randint(0, V, (T,), generator=g).to(DEVICE)
        out["torch"] = lambda: F.embedding(ids, w)
    return out


# silu_mul's root_separate and rope's out-of-place forms: one output per shape, shared by the input sets
SHARED_OUT: dict[tuple, torch.Tensor | tuple[torch.Tensor, torch.Tensor]] = {}

# our kernel's other forms, timed like the peers
OURS_AS_PEERS = ("root_rows", "root_table", "root_inplace", "root_separate")


def rope_table(fam_mod, workload, pos):
    return fam_mod.rope_table(int(pos.max()) + 1, workload["head_dim"], workload["theta"], workload.get("scaling"),
                              DEVICE)


def rope_rows(impl, fam_mod, cos, sin, pos):
    return getattr(impl, "gather_rows", fam_mod.gathered)(cos, sin, pos)


def rope_rows_bitwise(impl, fam_mod, workload) -> bool:
    """The timed entry point with pre-gathered rows gives the table path's bits (bf16 and fp32) on the workload."""
    full = workload["phase"] == "full"
    T = workload["tokens"] if full else workload["batch"]
    hq, hk, d = workload["q_heads"], workload["kv_heads"], workload["head_dim"]
    g = checks.generator(7)
    pos = torch.randint(0, workload["seq_len" if full else "context"], (T,), generator=g).to(DEVICE)
    cos, sin = rope_table(fam_mod, workload, pos)
    q, k = checks.randn((T, hq, d), g, torch.bfloat16, DEVICE), checks.randn((T, hk, d), g, torch.bfloat16, DEVICE)
    fn = impl.rope_full if full else impl.rope_decode
    outs = []
    for kw in ({"cos": cos, "sin": sin, "positions": pos}, {"cos": None, "sin": None, "positions": None,
                                                            "rows": rope_rows(impl, fam_mod, cos, sin, pos)}):
        o = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(q, dtype=torch.float32),
             torch.empty_like(k, dtype=torch.float32))
        checks.poison(*o)
        fn(q, k, q_out=o[0], k_out=o[1], q32=o[2], k32=o[3], **kw)
        outs.append(o)
    return all(checks.bitwise("rows", a, b).passed for a, b in zip(*outs))


# ---------------------------------------------------------------- run
def gpu_consistency(family: str, fam, impl) -> dict:
    cases = [("check_cases(full)", c) for c in fam.check_cases("full")] + [("model shape", c)
                                                                         for c in GPU_CASES[family]]
    n, failed = 0, []
    for label, case in cases:
        for seed in ((0,) if label.startswith("check_cases") else (0, 1)):
            for c in fam.run_checks(impl, case, seed, DEVICE):
                n += 1
                if not c.passed:
                    failed.append({"case": case, "label": label, **c.to_dict()})
    return {"checks": n, "cases": len(cases), "failed": failed}


def time_extra(fam, impl, workload: dict, timer, label: str) -> dict:
    """An extra implementation's time and fresh-input verification on one workload (row keys `<label>_...`); an
    error stays in its own key, so the root's and the peers' figures of the row are kept."""
    try:
        b = fam.make_bench(impl, workload, 0, DEVICE)
        out = {f"{label}_us": timer(b.run)}
        vchecks = b.verify()
        out[f"{label}_verify_passed"] = all(c.passed for c in vchecks)
        if not out[f"{label}_verify_passed"]:
            out[f"{label}_verify_failed"] = [c.to_dict() for c in vchecks if not c.passed]
        return out
    except Exception as e:  # noqa: BLE001
        return {f"{label}_error": repr(e)[:300]}


def load_extras(family: str, fam, extras: dict[str, str], res: dict) -> dict:
    """{label: module} of the extra implementations that load and run their checks; each one's knobs, checks or
    error go to res["extras"][label]."""
    mods = {}
    for label, path in extras.items():
        info = res.setdefault("extras", {})[label] = {"path": path}
        t0 = time.time()
        try:
            mod = load_module(Path(path), f"{family}_{label}")
            info["knobs"] = dict(mod.KNOBS)
            info["consistency"] = gpu_consistency(family, fam, mod)
            mods[label] = mod
        except Exception:  # noqa: BLE001 - a broken file is reported; the root's figures go on
            info["error"] = traceback.format_exc()[-1500:]
            print(f"{family} {label}: {info['error'].splitlines()[-1]}", flush=True)
        info["consistency_s"] = round(time.time() - t0, 1)
    return mods


def bench_family(family: str, liger, all_workloads: bool, changes: dict | None = None,
                 extras: dict[str, str] | None = None) -> dict:
    fam = importlib.import_module(f"tik_evo_kernels.{family}").FAMILY
    fam_mod = importlib.import_module(f"tik_evo_kernels.{family}.family")
    impl = load_variant(family, changes) if changes else load_root(family)
    res: dict = {"knobs": dict(impl.KNOBS)}
    t0 = time.time()
    res["consistency"] = gpu_consistency(family, fam, impl)
    res["consistency_s"] = round(time.time() - t0, 1)
    others = load_extras(family, fam, extras or {}, res)
    wl = yaml.safe_load((ROOT / "workloads" / f"{family}{WORKLOADS}.yaml").read_text())["workloads"]
    chosen = wl if all_workloads else [w for w in wl if w["name"] in SELECT[family]]
    rows = []
    first_full = next((w["name"] for w in chosen if w["phase"] == "full"), None)
    for w in chosen:
        row = {"workload": w["name"], "phase": w["phase"]}
        late = time.time() > BUDGET["deadline"]
        try:
            b = fam.make_bench(impl, w, 0, DEVICE)
            timer = time_full if w["phase"] == "full" else time_graph
            row["root_us"] = timer(b.run)
            row["bytes"] = b.bytes_moved
            row["root_GBps"] = b.bytes_moved / row["root_us"] / 1e3
            vchecks = b.verify()
            row["verify_passed"] = all(c.passed for c in vchecks)
            if not row["verify_passed"]:
                row["verify_failed"] = [c.to_dict() for c in vchecks if not c.passed]
            del b
            for label, mod in others.items():  # timed right after the root, on the same cell
                row.update(time_extra(fam, mod, w, timer, label))
            if family == "rope" and fam_mod.takes_rows(impl):
                row["rows_bitwise"] = rope_rows_bitwise(impl, fam_mod, w)
            sets = peer_sets(family, w, liger, fam_mod, impl)
            for name, fn in rotated(sets).items():
                if late and name != "torch" and name not in OURS_AS_PEERS:  # ours is always timed
                    row[f"{name}_skipped"] = "time budget"
                    continue
                try:
                    row[f"{name}_us"] = timer(fn)
                except Exception as e:  # noqa: BLE001
                    row[f"{name}_error"] = repr(e)[:300]
                if name == "torch" and w["name"] == first_full and not late and DEVICE == "cuda":
                    try:
                        cfn, first = compiled_peer(sets)
                        t1 = time.time()
                        first()
                        row["compile_s"] = round(time.time() - t1, 1)
                        row["compile_us"] = time_full(cfn)
                    except Exception as e:  # noqa: BLE001
                        row["compile_error"] = repr(e)[:300]
            if ROUNDS["n"] > 1 and not late:
                ours = {n: fam.make_bench(m, w, 0, DEVICE).run for n, m in {"root": impl, **others}.items()}
                more_rounds(row, {**ours, **rotated(sets)}, timer)
        except Exception as e:  # noqa: BLE001
            row["error"] = traceback.format_exc()[-1500:]
            print(f"{family} {w['name']}: {e!r}")
        SHARED_OUT.clear()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    res["workloads"] = rows
    return res


def more_rounds(row: dict, fns: dict, timer) -> None:
    """Time every implementation the row has a figure for ROUNDS - 1 more times, one after another in each round
    (so a drifting clock or a neighbour's load falls on all of them): `<name>_us_rounds` keeps every round and
    `<name>_us` becomes their median."""
    fns = {n: f for n, f in fns.items() if f"{n}_us" in row}
    for n in fns:
        row[f"{n}_us_rounds"] = [row[f"{n}_us"]]
    for _ in range(ROUNDS["n"] - 1):
        for n, f in fns.items():
            row[f"{n}_us_rounds"].append(timer(f))
    for n in fns:
        row[f"{n}_us"] = statistics.median(row[f"{n}_us_rounds"])
    row["root_GBps"] = row["bytes"] / row["root_us"] / 1e3


def run(families, out_dir: Path, all_workloads: bool = False, budget_s: float = 1e9,
        knobs: dict | None = None, extras: dict[str, dict[str, str]] | None = None) -> dict:
    """Check and time `families`' roots (with `knobs` {family: changes} applied) and `extras` {family: {label:
    kernel file}} beside them; writes rowwise.json to out_dir as each family finishes."""
    BUDGET["deadline"] = time.time() + budget_s
    torch.manual_seed(0)
    liger = load_liger()
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": _device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda if DEVICE == "cuda" else None, "liger": liger["version"] if liger else None,
            "graph_calls": GRAPH_CALLS}
    meta["copy"] = copy_ceiling()
    print("meta", json.dumps(meta), flush=True)
    result = {"meta": meta, "families": {}}
    for fam in families:
        t0 = time.time()
        try:
            result["families"][fam] = bench_family(fam, liger, all_workloads, (knobs or {}).get(fam),
                                                   (extras or {}).get(fam))
        except Exception:  # noqa: BLE001
            result["families"][fam] = {"error": traceback.format_exc()[-2000:]}
        result["families"][fam]["wall_s"] = round(time.time() - t0, 1)
        (out_dir / "rowwise.json").write_text(json.dumps(result, indent=1, default=str))
    print_table(result)
    return result


def extra_line(w: dict, name: str, label: str, eager: bool, ok: bool | None) -> None:
    """A table line for `name`'s timing in row `w`, if it has one: x eager (if asked) and x Liger."""
    if f"{name}_us" not in w:
        return
    us = w[f"{name}_us"]
    xe = f"{w['torch_us'] / us if 'torch_us' in w else float('nan'):8.2f}" if eager else f"{'':>8}"
    xl = w["liger_us"] / us if "liger_us" in w else float("nan")
    print(f"{'':<12}{label:<28}{us:9.1f}{'-':>6}{'':>24}{xe}{xl:8.2f}"
          + ("" if ok is None else f" {'Y' if ok else 'N'}"))


def extra_impl_line(w: dict, label: str, copy_gbps: float) -> None:
    """A table line for an extra implementation in row `w`: as the root's line, with the root's time over its."""
    if f"{label}_us" not in w:
        if f"{label}_error" in w:
            print(f"{'':<12}{'  ' + label:<28} ERROR {w[f'{label}_error'][:100]}")
        return
    us = w[f"{label}_us"]
    xe = w["torch_us"] / us if "torch_us" in w else float("nan")
    xl = w["liger_us"] / us if "liger_us" in w else float("nan")
    print(f"{'':<12}{'  ' + label:<28}{us:9.1f}{100 * w['bytes'] / us / 1e3 / copy_gbps:6.0f}{'-':>8}{'-':>8}{'-':>8}"
          f"{xe:8.2f}{xl:8.2f} {'Y' if w.get(f'{label}_verify_passed') else 'N'} x root {w['root_us'] / us:.2f}")


def print_table(result: dict) -> None:
    cp = result["meta"]["copy"]["GBps"]
    print(f"\ncopy ceiling {cp:.0f} GB/s | {result['meta']['gpu']} torch {result['meta']['torch']} "
          f"triton {result['meta']['triton']} liger {result['meta']['liger']}")
    print(f"{'family':<12}{'workload':<28}{'root us':>9}{'%copy':>6}{'eager':>8}{'compile':>8}{'liger':>8}"
          f"{'x eager':>8}{'x liger':>8} ok")
    for fam, r in result["families"].items():
        if "error" in r:
            print(f"{fam:<12}ERROR {r['error'][-200:]}")
            continue
        cons = r["consistency"]
        for w in r["workloads"]:
            if "root_us" not in w:
                print(f"{fam:<12}{w['workload']:<28} ERROR")
                continue
            f = lambda k, w=w: f"{w[k]:8.1f}" if k in w else f"{'-':>8}"
            xe = w["torch_us"] / w["root_us"] if "torch_us" in w else float("nan")
            xl = w["liger_us"] / w["root_us"] if "liger_us" in w else float("nan")
            print(f"{fam:<12}{w['workload']:<28}{w['root_us']:9.1f}{100 * w['root_GBps'] / cp:6.0f}"
                  f"{f('torch_us')}{f('compile_us')}{f('liger_us')}{xe:8.2f}{xl:8.2f} "
                  f"{'Y' if w.get('verify_passed') else 'N'}")
            # our kernel's other forms (rope), timed on rotated sets as the peers are
            extra_line(w, "root_table", "  table, rotated sets", eager=False, ok=None)
            extra_line(w, "root_inplace", "  rows, in place", eager=False, ok=None)
            extra_line(w, "root_rows", "  + pre-gathered rows", eager=True, ok=w.get("rows_bitwise"))
            extra_line(w, "root_separate", "  separate gate, up", eager=True, ok=None)
            for label in r.get("extras", {}):
                extra_impl_line(w, label, cp)
        print(f"{'':<12}bitwise/reference checks on {DEVICE}: {cons['checks'] - len(cons['failed'])}/{cons['checks']} "
              f"passed ({r['consistency_s']} s)")
        for label, info in r.get("extras", {}).items():
            c = info.get("consistency")
            print(f"{'':<12}{label}: " + (f"{c['checks'] - len(c['failed'])}/{c['checks']} checks passed"
                                           if c else f"ERROR {info.get('error', '').splitlines()[-1:]}"))


def _dry_run_setup() -> None:
    """CPU dry run: the interpreter, tiny workloads (all of each family's _cpu.yaml), tiny GPU cases."""
    global DEVICE, WORKLOADS
    from tik_evo import interp

    interp.install()
    DEVICE, WORKLOADS = "cpu", "_cpu"
    for fam in FAMILIES:
        names = tuple(w["name"] for w in yaml.safe_load((ROOT / "workloads" / f"{fam}_cpu.yaml").read_text())
                      ["workloads"])
        SELECT[fam] = names
        GPU_CASES[fam] = []
        if fam in SWEEP:
            SWEEP[fam] = (names, SWEEP[fam][1][:2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--families", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--all-workloads", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="time the SWEEP knob variants instead")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU + TRITON_INTERPRET=1 over workloads/<family>_cpu.yaml: exercises the code, not speed")
    ap.add_argument("--budget-s", type=float, default=1e9, help="past this many seconds skip compile/Liger")
    ap.add_argument("--knobs", type=json.loads, default=None,
                    help='JSON {family: {knob: value}}: check and time these changes to the root instead')
    ap.add_argument("--extras", type=json.loads, default=None,
                    help='JSON {family: {label: kernel file}}: check and time these beside the root, in its rounds')
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the root and its peers in this many interleaved rounds (medians; every round kept)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be at least 1")
    ROUNDS["n"] = args.rounds
    fams = [f for f in args.families.split(",") if f] or list(FAMILIES)
    if args.dry_run:
        _dry_run_setup()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        sweep(fams, out)
    else:
        run(fams, out, args.all_workloads, args.budget_s, args.knobs, args.extras)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
