"""Attention's benchmark (`tik-evo bench attention`) on the CPU: its arguments, cells, geomeans, graph plans
and tables, with the GPU timing parts stubbed; the figures themselves come from GPU runs."""

from __future__ import annotations

import math

import pytest
import torch
from _attention import (
    REPO,
    interpreter,  # noqa: F401 (an autouse fixture: the exact-dot interpreter)
    with_knobs,
)

from tik_evo_kernels.attention import FAMILY


def test_bench_needs_a_gpu(capsys):
    from tik_evo_kernels.attention import bench

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main([]) == 2


def test_bench_names_a_kernel_file_it_cannot_use(tmp_path, capsys):
    # Checked before anything runs (and before the GPU check): a missing file, a file without KNOBS, a knob
    # outside the family's space.
    from tik_evo_kernels.attention import bench

    bad_knob = tmp_path / "bad_knob.py"
    bad_knob.write_text(with_knobs(FAMILY.root_source(), BLOCK_N=128).replace('"BLOCK_N": 128', '"BLOCK_N": 96'))
    no_knobs = tmp_path / "no_knobs.py"
    no_knobs.write_text("def prefill(): pass\n")
    for path, message in ((tmp_path / "missing.py", "No such file or directory"),
                          (no_knobs, "KNOBS"), (bad_knob, "BLOCK_N=96 is not one of [32, 64, 128]")):
        assert bench.main(["--kernel", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"--kernel {path}: ") and message in err, err


def test_bench_grid_and_geomeans():
    from tik_evo_kernels.attention.bench import geomeans, grid_cells

    decode, prefill = grid_cells()
    assert len(decode) == 16 and len(prefill) == 32  # the paper grid: 16 decode, 16 prefill, 16 train_forward
    assert ("train_forward", 4, 4096 + 128) in prefill and (16, 8192) in decode
    rows = [{"phase": "decode", "cell": "a", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "a", "impl": "root", "us": 20.0},
            {"phase": "decode", "cell": "b", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "b", "impl": "root", "us": 2.5},
            {"phase": "prefill", "cell": "p", "impl": "sdpa_cudnn", "ms": 3.0},
            {"phase": "prefill", "cell": "p", "impl": "sdpa_flash", "ms": 1.0},
            {"phase": "prefill", "cell": "p", "impl": "root", "ms": 4.0},
            {"phase": "prefill", "cell": "q", "impl": "root", "error": "boom"}]
    g = geomeans(rows)
    assert g["decode"]["root"] == pytest.approx(math.sqrt(2)) and g["decode"]["root_cells"] == 2  # 0.5 and 4
    assert g["prefill"]["root"] == pytest.approx(0.75) and g["prefill"]["root_cells"] == 1  # cuDNN is the peer


def test_bench_packed_cells_and_their_peer():
    from tik_evo_kernels.attention.bench import geomeans, packed_cells

    cells = packed_cells()  # the grid's train_packed workloads, every length listed
    assert [n for n, _ in cells] == ["train_packed.B8.T16K", "train_packed.B4.T32K"]
    assert [sum(lens) for _, lens in cells] == [16384, 32768]
    rows = [{"phase": "train_packed", "cell": "t", "impl": "varlen_flash", "ms": 3.0},
            {"phase": "train_packed", "cell": "t", "impl": "root", "ms": 2.0},
            {"phase": "train_packed", "cell": "u", "impl": "varlen_flash", "error": "no flash"},
            {"phase": "train_packed", "cell": "u", "impl": "root", "ms": 2.0}]
    g = geomeans(rows)
    assert g["train_packed"] == {"root": pytest.approx(1.5), "root_cells": 1}  # a cell without the peer: left out


def test_varlen_peer_tries_each_releases_keywords(monkeypatch):
    # torch's varlen API changed its keywords across releases: the peer takes the first form this torch accepts
    # (the oldest, without a scale keyword, only where its default scale is ours), and the flash op itself where
    # the module is missing or no form fits.
    import sys
    import types

    from tik_evo_kernels.attention.autograd import varlen_flash

    q, kv = torch.zeros((5, 4, 8)), torch.zeros((5, 2, 8))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    seen, flash = [], []
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward",
                        lambda *a, scale=None: flash.append((a[5:10], scale)) or ("flash",), raising=False)

    def older(*args, is_causal=False, return_aux=None):  # a release before the `scale` and GQA keywords
        seen.append(("older", is_causal, args[5:]))
        return "older"

    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", types.SimpleNamespace(varlen_attn=older))
    assert varlen_flash(q, kv, kv, cu, 3, 8 ** -0.5) == "older" and seen == [("older", True, (3, 3))]
    assert varlen_flash(q, kv, kv, cu, 3, 0.5) == "flash" and flash == [((3, 3, 0.0, True, False), 0.5)]

    def newer(*args, scale=None, window_size=(-1, -1), enable_gqa=False):
        seen.append(("newer", scale, window_size, enable_gqa))
        return "newer"

    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", types.SimpleNamespace(varlen_attn=newer))
    assert varlen_flash(q, kv, kv, cu, 3, 0.5) == "newer" and seen[-1] == ("newer", 0.5, (-1, 0), True)

    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)  # no such module: the flash op
    assert varlen_flash(q, kv, kv, cu, 3, 0.5) == "flash" and len(flash) == 2


def test_bench_graph_geomeans_beside_the_event_ones():
    from tik_evo_kernels.attention.bench import geomeans

    def row(cell, impl, ms, graph):  # graph: a graph time, or None for a failed capture
        phase = cell.split()[0]
        return {"phase": phase, "cell": cell, "impl": impl, "ms": ms,
                **({"graph_error": "RuntimeError('capture')"} if graph is None else {"graph_ms": graph})}

    rows = [row("prefill a", "sdpa_cudnn", 3.0, 2.0), row("prefill a", "root", 4.0, 2.0),  # event 0.75, graph 1
            row("prefill b", "sdpa_cudnn", 1.0, 1.0), row("prefill b", "root", 1.0, 0.25),  # event 1, graph 4
            row("prefill c", "sdpa_cudnn", 2.0, None), row("prefill c", "root", 2.0, 1.0),  # the peer's capture failed
            row("prefill d", "sdpa_cudnn", 1.0, 1.0), row("prefill d", "root", 2.0, None),  # ours failed
            row("prefill a", "nograph", 1.0, None), row("prefill b", "nograph", 1.0, None),
            # an older file's rows (no graph fields): event geomeans only, no graph key, nothing counted
            {"phase": "train_forward", "cell": "train_forward t", "impl": "sdpa_cudnn", "ms": 2.0},
            {"phase": "train_forward", "cell": "train_forward t", "impl": "root", "ms": 1.0},
            {"phase": "decode", "cell": "decode x", "impl": "sdpa", "us": 10.0},
            {"phase": "decode", "cell": "decode x", "impl": "root", "us": 5.0}]
    g = geomeans(rows)
    assert set(g) == {"prefill", "prefill_graph", "train_forward", "decode"}
    # The event geomeans are unchanged by the graph figures: all four cells, from "ms".
    assert g["prefill"]["root"] == pytest.approx((0.75 * 1 * 1 * 0.5) ** 0.25) and g["prefill"]["root_cells"] == 4
    assert "root_graph_errors" not in g["prefill"]
    # The graph geomean: cells a and b only; c (peer) and d (ours) failed capture, excluded and counted.
    assert g["prefill_graph"]["root"] == pytest.approx(2.0) and g["prefill_graph"]["root_cells"] == 2
    assert g["prefill_graph"]["root_graph_errors"] == 2
    assert "nograph" not in g["prefill_graph"] and g["prefill_graph"]["nograph_graph_errors"] == 2
    assert g["prefill"]["nograph"] == pytest.approx(math.sqrt(3.0)) and g["prefill"]["nograph_cells"] == 2
    assert g["train_forward"] == {"root": 2.0, "root_cells": 1}
    assert g["decode"] == {"root": 2.0, "root_cells": 1}


def test_bench_prints_graph_times_and_geomeans(capsys):
    from tik_evo_kernels.attention.bench import geomeans, print_table

    timings = [{"phase": "prefill", "cell": "prefill B1 S1024", "impl": "sdpa_cudnn", "ms": 0.05, "graph_ms": 0.036},
               {"phase": "prefill", "cell": "prefill B1 S1024", "impl": "root", "ms": 0.055, "graph_ms": 0.04},
               {"phase": "prefill", "cell": "prefill B1 S1024", "impl": "sync", "ms": 0.06, "graph_error": "x"},
               {"phase": "decode", "cell": "decode B1 ctx8192", "impl": "sdpa", "us": 16.9},
               {"phase": "decode", "cell": "decode B1 ctx8192", "impl": "root", "us": 14.6}]
    report = {"gpu": "H200", "torch": "2.11", "triton": "3.6", "ceilings": {"copy_TBps": 4.1,
              "bf16_matmul_TFLOPs": 700.0}, "consistency": {}, "timings": timings, "skipped": [],
              "geomean_speedup_vs_peer": geomeans(timings)}
    print_table(report)
    lines = capsys.readouterr().out.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("prefill B1 S1024"))
    assert lines[i].split("ms: ")[1] == "sdpa_cudnn=0.05 root=0.055 sync=0.06"  # the event line as before
    assert lines[i + 1].split("graph ms: ")[1] == "sdpa_cudnn=0.036 root=0.04 sync=ERR"
    assert not any("graph ms" in line for line in lines if line.startswith("decode")) and \
        sum("graph ms" in line for line in lines) == 1
    geo = {line.split()[2]: line for line in lines if line.startswith("geomean")}
    assert "root=0.909 over 1 cells" in geo["prefill"] and "sync=0.833 over 1 cells" in geo["prefill"]
    assert "root=0.900 over 1 cells" in geo["prefill_graph"]
    assert "sync=none, 1 without a graph time" in geo["prefill_graph"]
    assert "root=1.158 over 1 cells" in geo["decode"]


def test_bench_graph_plan_bounds_replays_of_long_cells():
    from tik_evo_kernels.attention import bench

    assert bench.graph_plan(0.037, 8) == {"calls": 20, "replays": 30, "warmup": 3}  # B1 1K: as decode's timing
    assert bench.graph_plan(60.0) == {"calls": 1, "replays": 5, "warmup": 1}  # B16 S16K: 7 calls, not 663
    assert bench.graph_plan(1.5, 2)["calls"] == 2  # every input set in each replay
    for ms in (0.01, 0.037, 0.3, 1.0, 2.9, 4.0, 9.0, 10.0, 15.0, 30.0, 60.0, 100.0):
        p = bench.graph_plan(ms)
        assert 1 <= p["calls"] <= 20 and 5 <= p["replays"] <= 30 and p["warmup"] >= 1
        executed = p["warmup"] + (p["warmup"] + p["replays"]) * p["calls"]  # side-stream warm-ups, then replays
        assert executed * ms <= max(120.0, 7 * ms), ms  # GPU time per implementation and cell
    # Extra input sets only while they fit the byte budget; the big cells (B16 S16K: 3 GB a set) get one.
    _, cells = bench.grid_cells()
    for _, B, S in cells:
        n = bench.n_prefill_sets(B, S)
        assert n == 1 or n * B * (bench.HQ + 2 * bench.HKV) * S * bench.D * 2 <= bench.PREFILL_SETS_BYTES
    assert bench.n_prefill_sets(1, 1024) == 8 and bench.n_prefill_sets(16, 16384) == 1


def test_bench_interleaves_a_cells_graph_replays_and_keeps_going_when_capture_fails(monkeypatch):
    # Each implementation is captured once with its own plan; the replays run in rounds whose order rotates, and
    # graph_ms is the median over rounds (so a clock drift during the cell does not favour whoever ran last).
    from tik_evo_kernels.attention import bench

    order, seqs = [], {"a": iter([5.0, 1.0, 3.0, 2.0, 4.0]), "c": iter([10.0] * 5)}

    def capture(fn, calls, warmup):
        for _ in range(calls):
            fn()
        return fn.name

    def replay(graph, replays, calls):
        order.append(graph)
        return next(seqs[graph])

    def job(name, fails=False):
        def fn(i):
            if fails:
                raise RuntimeError("operation not permitted when stream is capturing")
        return fn

    class Named:  # checks.rotate's result, named for the stubs
        def __init__(self, fn, n):
            self.fn, self.n, self.i, self.name = fn, n, 0, None

        def __call__(self):
            self.fn(self.i % self.n)
            self.i += 1

    def rotate(fn, idx):
        r = Named(fn, len(idx))
        r.name = names[id(fn)]
        return r

    fns = {"a": job("a"), "b": job("b", fails=True), "c": job("c")}
    names = {id(f): n for n, f in fns.items()}
    monkeypatch.setattr(bench, "capture_graph", capture)
    monkeypatch.setattr(bench, "replay_us", replay)
    monkeypatch.setattr(bench.checks, "rotate", rotate)
    rows = {n: {"impl": n} for n in fns}
    bench.interleaved_graph_fields([(rows["a"], fns["a"], 3, 0.3), (rows["b"], fns["b"], 1, 0.3),
                                    (rows["c"], fns["c"], 1, 2.0)], rounds=5)
    plan = bench.graph_plan(0.3, 3)
    assert rows["a"] == {"impl": "a", "graph_ms": 0.003, "graph_calls": plan["calls"],
                         "graph_replays": max(1, plan["replays"] // 5) * 5, "graph_rounds": 5,
                         "graph_round_ms": [0.005, 0.001, 0.003, 0.002, 0.004]}
    assert rows["c"]["graph_ms"] == 0.01 and rows["c"]["graph_calls"] == bench.graph_plan(2.0, 1)["calls"]
    assert "graph_ms" not in rows["b"] and "capturing" in rows["b"]["graph_error"]
    assert order == ["a", "c", "c", "a", "a", "c", "c", "a", "a", "c"]


def test_bench_time_prefill_adds_graph_times_beside_event_ones(monkeypatch):
    # time_prefill on the CPU, with SDPA's math backend for the peers and the two timers stubbed: the rows carry
    # both figures, a module that cannot be captured keeps its event figure, and the graph replays run on the
    # same input sets and output as the event timing.
    import contextlib
    from types import SimpleNamespace

    from tik_evo_kernels.attention import bench

    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    sets = [tuple(torch.randn((1, h, 8, bench.D), generator=g, dtype=torch.bfloat16)
                  for h in (bench.HQ, bench.HKV, bench.HKV)) for _ in range(3)]
    state = {"capturing": False, "outs": set(), "inputs": set()}

    def sdpa(q, k, v, scale, out, syncs=False):
        if syncs and state["capturing"]:
            raise RuntimeError("syncs during capture")
        state["outs"].add(id(out))
        state["inputs"].add(id(q))
        out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))

    def capture_graph(fn, calls, warmup):  # the capture: the sets in turn, the last one's output left behind
        state["capturing"] = True
        try:
            for _ in range(calls):
                fn()
        finally:
            state["capturing"] = False
        return "graph"

    monkeypatch.setattr(bench, "prefill_sets", lambda B, S: sets)
    monkeypatch.setattr(bench, "_sdpa", lambda backend: contextlib.nullcontext())
    monkeypatch.setattr(bench, "_event_ms", lambda fn: (fn(), 0.5)[1])
    monkeypatch.setattr(bench, "capture_graph", capture_graph)
    monkeypatch.setattr(bench, "replay_us", lambda graph, replays, calls: 300.0)
    eager_calls = []
    monkeypatch.setattr(bench, "eager_us", lambda fn: (eager_calls.append(fn()), 42.0)[1])
    modules = {"ours": SimpleNamespace(prefill=sdpa),
               "syncs": SimpleNamespace(prefill=lambda *a: sdpa(*a, syncs=True))}
    rows, keep = [], {}
    bench.time_prefill(modules, "prefill", 1, 8, rows, keep=keep)
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["sdpa_cudnn", "sdpa_flash", "ours", "syncs"]
    calls = bench.graph_plan(0.5, 3)["calls"]
    for name in ("sdpa_cudnn", "sdpa_flash", "ours"):
        assert by[name]["ms"] == 0.5 and by[name]["graph_ms"] == pytest.approx(0.3), name
        assert by[name]["graph_calls"] == calls and "graph_error" not in by[name]
    assert by["sdpa_cudnn"]["gqa_expanded"] is False
    assert by["syncs"]["ms"] == 0.5 and "graph_ms" not in by["syncs"] and "syncs" in by["syncs"]["graph_error"]
    # The error and the kept output are set 0's, though the graph capture left another set's output in `out`.
    assert by["ours"]["rel_l2_vs_sdpa"] == 0.0 and by["syncs"]["rel_l2_vs_sdpa"] == 0.0
    q, k, v = sets[0]
    assert torch.equal(keep["ours"], F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                     scale=1 / math.sqrt(bench.D), enable_gqa=True))
    assert len(state["outs"]) == 1 and state["inputs"] == {id(s[0]) for s in sets}
    assert bench.geomeans(rows)["prefill_graph"] == {"ours": 1.0, "ours_cells": 1, "syncs_graph_errors": 1}
    # A short cell (0.5 ms by events, EAGER_MAX_MS) also gets its back-to-back time, the peers' too; a longer one not.
    assert all(by[n]["eager_us"] == 42.0 for n in by) and len(eager_calls) == 4
    assert bench.geomeans(rows)["prefill_eager"] == {"ours": 1.0, "ours_cells": 1, "syncs": 1.0, "syncs_cells": 1}
    monkeypatch.setattr(bench, "_event_ms", lambda fn: (fn(), bench.EAGER_MAX_MS * 2)[1])
    rows = []
    bench.time_prefill(modules, "prefill", 1, 8, rows)
    assert not any("eager_us" in r for r in rows) and len(eager_calls) == 4


def test_bench_decode_rows_carry_eager_times(monkeypatch):
    # time_decode on the CPU (SDPA for the peer and a stand-in decode), the graph timer stubbed: every row gets its
    # graph figure and its back-to-back figure, and the table prints both.
    from types import SimpleNamespace

    from tik_evo_kernels.attention import bench

    real = {name: getattr(torch, name) for name in ("Generator", "randn", "full", "empty")}
    # (bench.torch is torch: these stand-ins drop device="cuda" for the test's duration)
    monkeypatch.setattr(torch, "Generator", lambda device=None: real["Generator"]().manual_seed(0))
    for name in ("randn", "full", "empty"):
        monkeypatch.setattr(torch, name, lambda *a, device=None, _f=real[name], **k: _f(*a, **k))
    monkeypatch.setattr(bench, "graph_time_us", lambda fn, n_sets: (fn(0), 10.0)[1])
    monkeypatch.setattr(bench, "eager_us", lambda fn: (fn(), 30.0 if fn.func.__name__ == "peer" else 60.0)[1])
    ours = SimpleNamespace(decode=lambda q, k, v, lens, scale, out: out.zero_())
    rows = []
    bench.time_decode({"ours": ours}, 1, 64, rows)
    assert [(r["impl"], r["us"], r["eager_us"]) for r in rows] == [("sdpa", 10.0, 30.0), ("ours", 10.0, 60.0)]
    g = bench.geomeans(rows)
    assert g["decode"]["ours"] == 1.0 and g["decode_eager"]["ours"] == 0.5
    lines = bench.cell_lines("decode B1 ctx64", {r["impl"]: r for r in rows})
    assert lines == [f"{'decode B1 ctx64':28s} us: sdpa=10 ours=10", f"{'':28s} eager us: sdpa=30 ours=60"]


def test_named_bench_variants_use_declared_knob_values():
    # `tik-evo bench attention --variants NAME` runs these; a misspelt knob or value would time something else.
    from tik_evo_kernels.attention.bench import VARIANTS

    space = {k.name: k.values for k in FAMILY.knobs}
    for name, knobs in VARIANTS.items():
        for knob, value in knobs.items():
            assert knob in space and value in space[knob], (name, knob, value)
    # They are also the sets a campaign may start from (`start.set`), and `tik-evo check` validates that.
    assert FAMILY.named_sets() is VARIANTS
    from tik_evo.cli import main

    campaign = REPO / "campaigns" / "h200_attention.yaml"
    assert main(["check", str(campaign), "start.set=hopper_bn128_tree_s512"]) == 0


def test_bench_takes_the_best_of_a_run(tmp_path):
    from tik_evo.records import Implementation
    from tik_evo.store import Store
    from tik_evo_kernels.attention.bench import best_of

    source = with_knobs(FAMILY.root_source(), FULL_KV_LOADS="tma")
    for name, family, best in (("att", "attention", True), ("rms", "rmsnorm", True), ("new", "attention", False)):
        with Store.create(tmp_path / name) as store, store.transaction() as t:
            t.state["family"] = family
            t.put(Implementation("I0", t.put_source(source), [], "root", "best"))
            t.state["best"] = "I0" if best else None
    impl_id, text = best_of(tmp_path / "att")
    assert impl_id == "I0" and text == source
    with pytest.raises(SystemExit, match="family 'rmsnorm', not 'attention'"):
        best_of(tmp_path / "rms")
    with pytest.raises(SystemExit, match="no best implementation yet"):
        best_of(tmp_path / "new")
