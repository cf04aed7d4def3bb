"""results/index.csv stays true: regenerated in memory, it must equal the committed file; and the name parsing."""

import json
from pathlib import Path

import pytest

from tik_evo import results_index as ri

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def test_committed_index_is_current():
    committed = (RESULTS / "index.csv").read_text(encoding="utf-8")
    fresh = ri.render(RESULTS)
    assert committed == fresh, "results/index.csv is stale: run `python -m tik_evo.results_index` and commit it"


def test_index_covers_every_file_once():
    listed = [r["file"] for r in ri.rows(RESULTS)]
    on_disk = sorted("results/" + p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*")
                     if p.is_file() and p.name != "index.csv" and not p.name.startswith("."))
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


@pytest.mark.parametrize("name, date, run, card, what, ext", [
    # card first (attention/, engine/, model/)
    ("h200_run58_ab_tma_2026-12-04.json", "2026-12-04", "", "h200", "run58_ab_tma", ".json"),
    ("h200_campaign2_2026-12-02_export.jsonl.gz", "2026-12-02", "", "h200", "campaign2_export", ".jsonl.gz"),
    ("h100_rope_2026-12-06b.md", "2026-12-06", "b", "h100", "rope", ".md"),
    ("h200_consistency_2026-12-04f_tma_s512.json", "2026-12-04", "f", "h200", "consistency_tma_s512", ".json"),
    ("h200_2026-12-05c.md", "2026-12-05", "c", "h200", "", ".md"),
    # card after the subject (ops/), offline compiles named sm90
    ("rowwise_h100_2026-12-06e_rms_blocks_silu_rope.json", "2026-12-06", "e", "h100", "rowwise_rms_blocks_silu_rope",
     ".json"),
    ("rowwise_ncu_h100_2026-12-06_caches_all.json", "2026-12-06", "", "h100", "rowwise_ncu_caches_all", ".json"),
    ("packed_prefill_tma_sm90_2026-12-05.md", "2026-12-05", "", "sm90", "packed_prefill_tma", ".md"),
    ("h200_prefill_ncu_details_2026-12-03.csv.gz", "2026-12-03", "", "h200", "prefill_ncu_details", ".csv.gz"),
    # no card, no date
    ("linear_full_ab_2026-12-02.json", "2026-12-02", "", "", "linear_full_ab", ".json"),
    ("ops_2026-12-02_evening.md", "2026-12-02", "", "", "ops_evening", ".md"),
    ("h200_run1.json", "", "", "h200", "run1", ".json"),
    ("README.md", "", "", "", "README", ".md"),
])
def test_parse_name(name, date, run, card, what, ext):
    assert ri.parse_name(name) == {"date": date, "run": run, "card": card, "what": what, "ext": ext}


@pytest.mark.parametrize("name, scheme", [
    ("h200_run58_ab_tma_2026-12-04.json", "card_first"),
    ("rowwise_h100_2026-12-06a_silu_rope.json", "card_after"),
    ("linear_full_ab_2026-12-02.json", "no_card"),
    ("h200_run1.json", "no_date"),
    ("README.md", ""),
    ("STATUS.md", ""),
])
def test_scheme_of(name, scheme):
    assert ri.scheme_of(name) == scheme


def test_card_of_gpu():
    assert ri.card_of_gpu("NVIDIA H100 80GB HBM3") == "h100"
    assert ri.card_of_gpu("NVIDIA H200") == "h200"
    assert ri.card_of_gpu("cuda") == ""


def test_rows_fill_date_and_card_from_the_files(tmp_path):
    """Name first; else the JSON's own fields (nested ones too), the summary JSON of an export, a notebook's device."""
    ops = tmp_path / "ops"
    ops.mkdir()
    (ops / "linear_ab_2026-12-02.json").write_text(json.dumps({"env": {"date": "2026-12-03 00:10 UTC",
                                                                       "gpu": "NVIDIA H200"}}))
    (ops / "h200_run1.json").write_text(json.dumps({"date": "2026-12-02T14:57:04+00:00", "gpu": "NVIDIA H200"}))
    (ops / "ops_2026-12-05.json").write_text(json.dumps({"ops_rowwise_gpu": {"meta": {"gpu": "NVIDIA H100 80GB"}}}))
    (ops / "run_2026-12-04.json").write_text(json.dumps({"device": {"gpu": "NVIDIA H100 80GB HBM3"}}))
    (ops / "run_2026-12-04_lineage.txt").write_text("I0 root\n")
    (ops / "gpu_2026-12-06.md").write_text("# notes\n\nEvery call ran on an **H100 80GB HBM3**, asked for an H200.\n")
    (tmp_path / "README.md").write_text("# results\n\nNVIDIA H200\n")  # undated notebooks are not scanned
    got = {r["file"]: (r["date"], r["card"], r["area"], r["what"]) for r in ri.rows(tmp_path)}
    assert got == {
        "results/ops/linear_ab_2026-12-02.json": ("2026-12-02", "h200", "ops", "linear_ab"),  # the name's date wins
        "results/ops/h200_run1.json": ("2026-12-02", "h200", "ops", "run1"),
        "results/ops/ops_2026-12-05.json": ("2026-12-05", "h100", "ops", "ops"),
        "results/ops/run_2026-12-04.json": ("2026-12-04", "h100", "ops", "run"),
        "results/ops/run_2026-12-04_lineage.txt": ("2026-12-04", "h100", "ops", "run_lineage"),
        "results/ops/gpu_2026-12-06.md": ("2026-12-06", "h100", "ops", "gpu"),
        "results/README.md": ("", "", "", "README"),
    }
    text = ri.render(tmp_path)
    assert text.splitlines()[0] == "date,card,area,what,file"
    assert text.splitlines()[1].startswith(",,,README,")  # undated files sort first


def test_main_writes_then_checks(tmp_path, capsys):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "h200_rmsnorm_2026-12-02.md").write_text("NVIDIA H200\n")
    assert ri.main(["--results", str(tmp_path), "--check"]) == 1  # no index yet
    assert ri.main(["--results", str(tmp_path)]) == 0
    assert ri.main(["--results", str(tmp_path), "--check"]) == 0
    (tmp_path / "engine" / "h100_rope_2026-12-06.md").write_text("H100 80GB\n")
    assert ri.main(["--results", str(tmp_path), "--check"]) == 1
    capsys.readouterr()
