"""A search's kernels in the whole model: `--kernel FAMILY=FILE` / `--best RUN_DIR` on the model benchmarks put files
in place of the roots (kernels/files.py), refused with a message naming the argument when they cannot be used."""

import json
from pathlib import Path

import pytest

from tik_evo.cli import main
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.records import Implementation
from tik_evo.store import Store
from tik_evo_kernels.files import KernelArgError, kernel_sources

ROOT = Path(__file__).resolve().parents[2]


def bench(suite: str, argv: list[str]) -> int:
    """`tik-evo bench SUITE ARGV...` in this process."""
    return main(["bench", suite, *argv])


def variant(family: str, **knobs) -> str:
    src = (ROOT / "kernels" / family / "root.py").read_text()
    return write_knobs(src, {**read_knobs(src), **knobs})


def test_kernel_files_and_a_runs_best_replace_roots_in_the_model_and_keep_it_bit_exact(tmp_path):
    # One policy benchmark run (each one takes minutes under the interpreter) with three replacements, each
    # reported and each in every call of its family, the policy forward still equal to training and rollout:
    # - silu_mul with another SiLU form (a contract knob: other bits than the root's, the same in every path) from
    #   a file;
    # - rmsnorm with a path knob from a run's best;
    # - rope with COS_SIN "sincos" (a campaign's best) from a file: it needs the table's inverse frequencies, which
    #   the model passes to every RoPE call (rollout, training and the policy's forward and backward).
    # One --matmul-backward mode: the modes differ only in the linear layers' gradients, no file's family here.
    (tmp_path / "silu.py").write_text(variant("silu_mul", SILU_FORM="exp2"))
    (tmp_path / "rope.py").write_text(variant("rope", COS_SIN="sincos"))
    with Store.create(tmp_path / "run") as store, store.transaction() as t:
        t.state["family"] = "rmsnorm"
        t.put(Implementation("I4", t.put_source(variant("rmsnorm", FULL_ROWS_PER_PROGRAM=2)), [], "root", "best"))
        t.state["best"] = "I4"
    out = tmp_path / "policy.json"
    rc = bench("policy", ["--smoke", "--configs", "dense", "--no-step", "--matmul-backward", "vendor",
                          "--kernel", f"silu_mul={tmp_path / 'silu.py'}", "--kernel", f"rope={tmp_path / 'rope.py'}",
                          "--best", str(tmp_path / "run"), "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["kernels"]["silu_mul"]["knobs"]["SILU_FORM"] == "exp2"
    assert result["kernels"]["rope"]["knobs"]["COS_SIN"] == "sincos"
    assert result["kernels"]["rmsnorm"] == {"from": f"--best {tmp_path / 'run'}",
                                            "knobs": read_knobs(variant("rmsnorm", FULL_ROWS_PER_PROGRAM=2))}
    # The model holds the files' modules (named by family and file), not the roots.
    held = result["configs"]["dense"]["kernels_in_model"]
    assert held["silu_mul"].startswith("_cand_silu_mul_file_silu") and held["rope"].startswith("_cand_rope_file_rope")
    assert held["rmsnorm"].startswith("_cand_rmsnorm_best_I4"), held
    c = result["configs"]["dense"]["checks"]
    assert c["answer_tokens"] > 0
    assert c["policy_vs_training_mismatches"] == c["policy_vs_rollout_mismatches"] == 0


@pytest.mark.parametrize("script, args, message", [
    ("model", ["--kernel", "nope=x.py"], "--kernel nope=x.py: family 'nope' is not one of"),
    ("model", ["--model", "dense", "--kernel", "moe_routing={routing}"],
     "family 'moe_routing' is not one of"),
    ("model-speed", ["--kernel", "silu_mul={silu}", "--kernel", "silu_mul={silu}"],
     "silu_mul is already given by --kernel silu_mul="),
    ("model-graphs", ["--kernel", "rope={silu}"], "its KNOBS: family 'rope' has no knob 'SILU_FORM'"),
    ("policy", ["--kernel", "silu_mul={missing}"], "No such file or directory"),
])
def test_the_model_benchmarks_refuse_unusable_files_naming_them(tmp_path, capsys, script, args, message):
    (tmp_path / "silu.py").write_text(variant("silu_mul"))
    (tmp_path / "routing.py").write_text(variant("moe_routing"))
    paths = {"silu": tmp_path / "silu.py", "routing": tmp_path / "routing.py", "missing": tmp_path / "none.py"}
    assert bench(script, [a.format(**paths) for a in args] + ["--out", str(tmp_path / "x.json")]) == 2
    assert message in capsys.readouterr().out


def test_kernel_sources_name_runs_without_a_best(tmp_path):
    with Store.create(tmp_path / "new") as store, store.transaction() as t:
        t.state["family"] = "rope"
    with pytest.raises(KernelArgError, match="--best .*new: .*no best implementation yet"):
        kernel_sources([str(tmp_path / "new")], [], ("rope",))
