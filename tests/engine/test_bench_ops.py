"""`tik-evo bench ops --best RUN_DIR / --kernel FAMILY=FILE`: a run's best and kernel files are checked and timed
beside the family's root and its peers. The row-wise suite runs here as its dry run (the interpreter, tiny
workloads); the matmul suite's bookkeeping is checked without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tik_evo.cli import main
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.records import Implementation
from tik_evo.store import Store, StoreError, best_of
from tik_evo_kernels.rmsnorm import FAMILY as RMSNORM

ROOT = Path(__file__).resolve().parents[2]


def _run_with_best(run_dir: Path, family: str, source: str | None) -> None:
    with Store.create(run_dir) as store, store.transaction() as t:
        t.state["family"] = family
        if source is not None:
            t.put(Implementation("I0", t.put_source(source), [], "root", "best"))
            t.state["best"] = "I0"


def _variant(family: str, **knobs) -> str:
    src = (ROOT / "kernels" / family / "root.py").read_text()
    return write_knobs(src, {**read_knobs(src), **knobs})


def test_best_of_names_the_family_and_refuses_a_run_without_a_best(tmp_path):
    source = RMSNORM.root_source()
    _run_with_best(tmp_path / "a", "rmsnorm", source)
    _run_with_best(tmp_path / "new", "rmsnorm", None)
    assert best_of(tmp_path / "a") == ("rmsnorm", "I0", source)
    with pytest.raises(StoreError, match="family 'rmsnorm', not 'rope'"):
        best_of(tmp_path / "a", "rope")
    with pytest.raises(StoreError, match="no best implementation yet"):
        best_of(tmp_path / "new")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU form")
def test_a_runs_best_and_kernel_files_are_checked_and_timed_beside_the_root(tmp_path, capsys):
    knob = next(k for k in RMSNORM.knobs if k.role == "full" and len(k.values) > 1)
    value = next(v for v in knob.values if v != read_knobs(RMSNORM.root_source())[knob.name])
    _run_with_best(tmp_path / "run", "rmsnorm", _variant("rmsnorm", **{knob.name: value}))
    good = tmp_path / "silu_exp2.py"
    good.write_text(_variant("silu_mul", SILU_FORM="exp2"))
    broken = tmp_path / "silu_broken.py"  # raises on import: reported, and the rest of the run goes on
    broken.write_text(_variant("silu_mul") + "\nraise RuntimeError('boom at import')\n")
    out = tmp_path / "out"
    rc = main(["bench", "ops", "--dry-run", "--best", str(tmp_path / "run"), "--kernel", f"silu_mul={good}",
               "--kernel", f"silu_mul={broken}", "--out", str(out)])
    assert rc == 0
    result = json.loads((out / "rowwise.json").read_text())["families"]
    assert set(result) == {"rmsnorm", "silu_mul"}  # only the families of the extras, without --families
    rms = result["rmsnorm"]
    assert rms["extras"]["best_I0"]["knobs"][knob.name] == value
    assert rms["extras"]["best_I0"]["consistency"]["failed"] == []
    assert rms["extras"]["best_I0"]["consistency"]["checks"] == rms["consistency"]["checks"] > 0
    silu = result["silu_mul"]
    assert silu["extras"]["file_silu_exp2"]["consistency"]["failed"] == []
    assert "boom at import" in silu["extras"]["file_silu_broken"]["error"]
    for fam, label in (("rmsnorm", "best_I0"), ("silu_mul", "file_silu_exp2")):
        rows = result[fam]["workloads"]
        assert {r["phase"] for r in rows} == {"full", "decode"}
        for r in rows:
            assert r["root_us"] > 0 and r[f"{label}_us"] > 0 and r[f"{label}_verify_passed"] is True
            assert "torch_us" in r  # the peers are timed on the same cells
    assert all("file_silu_broken_us" not in r for r in silu["workloads"])
    table = capsys.readouterr().out
    assert "best_I0" in table and "x root" in table and "file_silu_broken: ERROR" in table


@pytest.mark.parametrize("args, message", [
    (["--kernel", "nope=x.py"], "--kernel nope=x.py: family 'nope' is not one of rmsnorm, add_rmsnorm"),
    (["--kernel", "silu_mul"], "--kernel silu_mul: expected FAMILY=FILE"),
    (["--kernel", "silu_mul={missing}"], "No such file or directory"),
    (["--kernel", "rope={silu}"], "its KNOBS: family 'rope' has no knob 'SILU_FORM'"),
    (["--best", "{missing}"], "no IR store here"),
    (["--best", "{attention_run}"], "family 'attention' is not one of rmsnorm, add_rmsnorm, silu_mul, rope, "
                                    "qk_rmsnorm, embedding, kv_append, linear, logprob, moe_routing (attention: "
                                    "`tik-evo bench attention --best / --kernel`)"),
    (["--families", "foo"], "--families: foo not benchmarked here"),
    (["--families", "rope", "--kernel", "silu_mul={silu}"], "--families leaves out silu_mul"),
])
def test_bad_arguments_are_refused_naming_them(tmp_path, capsys, args, message):
    silu = tmp_path / "silu.py"
    silu.write_text(_variant("silu_mul"))
    _run_with_best(tmp_path / "att", "attention", (ROOT / "kernels" / "attention" / "root.py").read_text())
    paths = {"missing": tmp_path / "missing", "silu": silu, "attention_run": tmp_path / "att"}
    args = [a.format(**paths) for a in args]
    assert main(["bench", "ops", "--dry-run", *args, "--out", str(tmp_path / "out")]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU form")
def test_the_matmul_suite_dry_run_checks_and_times_kernel_files_beside_the_root(tmp_path):
    # linear and moe_routing through `bench ops --dry-run` (the interpreter, tiny sizes): each file's bits are
    # checked like the root's and it is timed on the root's cells, back to back with it.
    lin, routing = tmp_path / "lin.py", tmp_path / "routing.py"
    lin.write_text(_variant("linear", DECODE_USE_TMA=False))
    routing.write_text(_variant("moe_routing", FULL_BLOCK_T=16))
    out = tmp_path / "out"
    assert main(["bench", "ops", "--dry-run", "--kernel", f"linear={lin}", "--kernel", f"moe_routing={routing}",
                 "--out", str(out)]) == 0
    result = json.loads((out / "ops_matmul_gpu.json").read_text())
    assert result["errors"] == []
    checked = {c["impl"]: c for c in result["consistency"]}
    assert checked["file_lin"]["decode_vs_full_fp32_mismatches"] == 0
    assert checked["file_routing"]["decode_vs_full_mismatches"] == 0
    for family, label, cells in (("linear", "file_lin", 6), ("moe_routing", "file_routing", 3)):
        e = result["extras"][family][label]
        assert len(e["vs_root"]) == cells and all(r > 0 for r in e["vs_root"].values())


def test_kernel_files_load_and_report_against_the_root(tmp_path):
    # What the matmul suite does with --extras (tik_evo_kernels.variants): load a kernel file, label its rows,
    # time it beside the root, and report its time over the root's on the cells both were timed on.
    from tik_evo_kernels import variants as v

    path = tmp_path / "routing.py"
    path.write_text(_variant("moe_routing", FULL_BLOCK_T=32))
    f = v.KernelFile("best_I3", str(path))
    assert v.load("moe_routing", f, {}).KNOBS["FULL_BLOCK_T"] == 32 and v.tag(f) == "best_I3"
    assert v.tag({"FULL_BLOCK_T": 32}) == "FULL_BLOCK_T=32" and v.tag({}) == "root"
    assert v.with_root([f]) == [{}, f] and v.with_root([]) == []
    rows = [{"workload": wl, "impl": impl, "time_us": us} for impl, wl, us in (
        ("root", "a", 10.0), ("best_I3", "a", 8.0), ("root", "b", 4.0), ("best_I3", "b", 5.0),
        ("best_I3", "only_here", 1.0))]
    e = v.vs_root(rows, [f])["best_I3"]
    assert e["vs_root"] == {"a": 0.8, "b": 1.25} and e["gmean_vs_root"] == pytest.approx(1.0)
    linear = [{"workload": "qkv.M4096", "impl": impl, "time_us": us}
              for impl, us in (("full:root", 100.0), ("full:file_lin", 90.0), ("full:K_CHUNK=0", 1.0))]
    assert v.vs_root(linear, [v.KernelFile("file_lin", "lin.py")])["file_lin"]["vs_root"] == {"qkv.M4096": 0.9}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU form")
def test_the_rowwise_suite_times_root_and_peers_in_interleaved_rounds(tmp_path, monkeypatch):
    # `--rounds 3`: every figure of a row (the root's, each peer's, an `--extras` kernel file's) is the median of
    # three rounds, all kept.
    import statistics


    wide = tmp_path / "wide.py"
    wide.write_text(_variant("rmsnorm", BLOCK_H=1024))
    extras = json.dumps({"rmsnorm": {"wide": str(wide)}})
    assert main(["bench", "ops-rowwise", "--dry-run", "--families", "rmsnorm", "--rounds", "3", "--extras", extras,
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "rowwise.json").read_text())["families"]["rmsnorm"]["workloads"]
    assert rows and all("error" not in r for r in rows)
    for r in rows:
        timed = [k[:-len("_us_rounds")] for k in r if k.endswith("_us_rounds")]
        assert {"root", "torch", "wide"} <= set(timed), r.keys()
        assert r["wide_verify_passed"]
        for name in timed:
            assert len(r[f"{name}_us_rounds"]) == 3 and r[f"{name}_us"] == statistics.median(r[f"{name}_us_rounds"])
    with pytest.raises(SystemExit):
        main(["bench", "ops-rowwise", "--dry-run", "--families", "rmsnorm", "--rounds", "0", "--out", str(tmp_path)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU form")
def test_the_ncu_comparison_labels_each_launch_and_refuses_a_miscounted_report(tmp_path):
    # `tik-evo bench rowwise-ncu`: `run` alternates each cell's single-launch calls and writes their order;
    # `summarize` labels an ncu raw-page export by it (root / each, per cell) and stops when the counts differ.


    def tool(argv):
        return main(["bench", "rowwise-ncu", *argv])

    order = tmp_path / "order.json"
    warps4 = tmp_path / "rope_w4.py"
    warps4.write_text(_variant("rope", DECODE_NUM_WARPS=4))
    assert tool(["run", "--dry-run", "--cells", "rope:decode.B3xC50,silu_mul:decode.B3xI600", "--reps", "2",
                      "--extras", json.dumps({"rope": {"w4": str(warps4)}}), "--order", str(order)]) == 0
    labels = json.loads(order.read_text())["order"]
    assert labels[:3] == ["rope:decode.B3xC50 root", "rope:decode.B3xC50 w4", "rope:decode.B3xC50 root_inplace"]
    assert "silu_mul:decode.B3xI600 w4" not in labels  # a family's extras go to its own cells only
    assert len(labels) == 2 * len(set(labels)) and labels[len(labels) // 2:] == labels[:len(labels) // 2]

    def export(rows):  # ncu --page raw --csv: a header, a units row, one row per launch
        head = '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","dram__bytes_write.sum"'
        lines = [head, '"","","nsecond","byte","byte"']
        lines += [f'"{i}","{k}","{ns:,}","100","50"' for i, (k, ns) in enumerate(rows)]
        (tmp_path / "r.csv").write_text("==PROF== noise\n" + "\n".join(lines) + "\n")
        return ["summarize", "--csv", str(tmp_path / "r.csv"), "--order", str(order), "--out", str(tmp_path / "x.json")]

    kernel = lambda label: "_rope_kernel" if label.startswith("rope") else "_silu_mul_kernel"  # noqa: E731
    times = {"root": 2000, "w4": 2000, "root_inplace": 1000, "root_rows": 4000, "root_separate": 2000}
    assert tool(export([(kernel(lb), times[lb.rpartition(" ")[2]]) for lb in labels])) == 0
    cells = json.loads((tmp_path / "x.json").read_text())["cells"]
    rope = cells["rope:decode.B3xC50"]
    assert rope["root"]["us"] == [2.0, 2.0] and rope["root_inplace"]["root_over_this"] == pytest.approx(2.0)
    assert rope["root_rows"]["root_over_this"] == pytest.approx(0.5)
    assert cells["silu_mul:decode.B3xI600"]["root_separate"]["median_us"] == pytest.approx(2.0)
    with pytest.raises(SystemExit, match="launches profiled"):
        tool(export([(kernel(lb), 1000) for lb in labels] + [("_rope_kernel", 1000)]))
    with pytest.raises(SystemExit, match="launched"):  # a label whose launches are different kernels
        tool(export([(f"k{i}", 1000) for i, _ in enumerate(labels)]))
