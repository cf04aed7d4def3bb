"""Compile ahead (tik_evo.warm): calls noted by a run's first audits, replayed by a runner with no GPU that compiles
for a named target (real Triton compiles for sm_90 on this CPU-only machine), the GPU held by one audit at a time."""

import json
import re
import threading
import time

import torch

from tik_evo import warm
from tik_evo.audit import AuditJob, audit_slots, run_audit
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.store import source_hash
from tik_evo.worker import sandbox_options
from tik_evo.worker_io import WorkerJob

FAMILY = load_family("rmsnorm")
ROOT_SRC = FAMILY.root_source()
WORKLOADS = [{"name": "full", "phase": "full", "tokens": 4, "hidden": 256},
             {"name": "decode", "phase": "decode", "batch": 2, "hidden": 256}]
EVALUATE = {"timeout_s": 120, "interpreter_reps": 1, "check_procs": 2, "warm": "on", "warm_capability": [9, 0],
            "warm_timeout_s": 60}


def meta(shape, dtype="bfloat16"):
    return {"t": "meta", "dtype": dtype, "shape": shape}


CALLS = [{"fn": "rmsnorm_full", "kwargs": {"x": meta([64, 4096]), "weight": meta([4096]), "eps": 1e-6,
                                          "out": meta([64, 4096]), "out32": meta([64, 4096], "float32")}},
         {"fn": "rmsnorm_decode", "kwargs": {"x": meta([8, 2560]), "weight": meta([2560]), "eps": 1e-6,
                                            "out": meta([8, 2560]), "out32": None}}]


def opts_for(tmp_path, src):
    job = WorkerJob("rmsnorm", str(tmp_path), src, source_hash(src), [], [0], {}, "cuda", "")
    return sandbox_options(job)


def cubins(d):
    return sorted(p.name for p in d.rglob("*.cubin"))


def test_a_warm_pass_compiles_the_candidates_kernels_with_no_gpu(tmp_path):
    opts = opts_for(tmp_path, ROOT_SRC)
    report = warm.warm(ROOT_SRC, CALLS, [9, 0], opts, timeout=120)
    assert report.get("error") is None and (report["calls"], report["failed"]) == (2, 0), report
    # Two widths, two specialisations of the one row kernel, in the candidate's own lineage cache directory.
    assert cubins(opts["cache_dir"]) == ["_rms_rows_kernel.cubin", "_rms_rows_kernel.cubin"], report
    assert report["cubins"] == 2


def test_a_warm_pass_that_hangs_or_raises_is_a_report_not_a_verdict(tmp_path):
    hang = ROOT_SRC.replace("    n_rows, hidden = x.shape\n", "    n_rows, hidden = x.shape\n"
                            "    while x.is_meta:\n        pass\n", 1)
    t0 = time.time()
    report = warm.warm(hang, CALLS, [9, 0], opts_for(tmp_path, hang), timeout=5)
    assert "did not answer" in report["error"] and time.time() - t0 < 30
    bad = ROOT_SRC.replace("    n_rows, hidden = x.shape\n", "    n_rows, hidden = x.shape\n"
                           "    if x.is_meta:\n        raise ValueError('no warm-up for you')\n", 1)
    report = warm.warm(bad, CALLS, [9, 0], opts_for(tmp_path, bad), timeout=60)
    assert report["failed"] == 2 and "no warm-up for you" in report["errors"][0]


def widths_of(manifest):
    return {c["kwargs"]["x"]["shape"][-1] for c in manifest["calls"]}


def drawn_widths(tmp_path, impl):
    return {c["hidden"] for c in json.loads((tmp_path / "audits" / impl / "result.json").read_text())["drawn_cases"]}


def test_audits_note_their_calls_after_the_verdict_and_later_audits_compile_them_ahead(tmp_path):
    root = run_audit(tmp_path, AuditJob(FAMILY, ROOT_SRC, source_hash(ROOT_SRC), "I0", WORKLOADS, [0], EVALUATE,
                                        "cpu"))
    assert root.passed, root.failure
    manifest = json.loads((tmp_path / warm.MANIFEST).read_text())
    assert {c["fn"] for c in manifest["calls"]} == {"rmsnorm_full", "rmsnorm_decode"} and manifest["audits"] == 1
    # The fixed cases (noted by the check shards too), the workloads and, its verdict written, the audit's drawn case.
    fixed = {c["hidden"] for c in FAMILY.check_cases("full")} | {w["hidden"] for w in WORKLOADS}
    drawn0 = drawn_widths(tmp_path, "I0")
    assert drawn0 - fixed and fixed | drawn0 <= widths_of(manifest)

    child = write_knobs(ROOT_SRC, {**read_knobs(ROOT_SRC), "DECODE_ROWS_PER_PROGRAM": 2})
    h = source_hash(child)
    out = run_audit(tmp_path, AuditJob(FAMILY, child, h, "I1", WORKLOADS, [0], EVALUATE, "cpu"))
    assert out.passed, out.failure
    report = out.device["warm"]
    # its warm pass replayed the manifest as it stood, the earlier draw included; never a call of its own draws
    assert report["calls"] == len(manifest["calls"]) and report["failed"] == 0, report
    secret = drawn_widths(tmp_path, "I1") - fixed - drawn0
    assert secret and not secret & widths_of(manifest)
    assert cubins(tmp_path / "triton" / h)  # compiled for sm_90 into the candidate's own cache directory
    after = json.loads((tmp_path / warm.MANIFEST).read_text())
    assert after["audits"] == 2 and secret <= widths_of(after)  # merged once I1's verdict was written
    # past DRAWN_AUDITS audits the manifest stops growing (each warm pass replays all of it)
    after["audits"] = warm.DRAWN_AUDITS
    (tmp_path / warm.MANIFEST).write_text(json.dumps(after))
    assert not warm.wants_notes(after) and warm.wants_notes(None) and warm.wants_notes({"calls": []})
    notes = warm.Notes()
    notes.add("rmsnorm_full", {"x": torch.empty(3, 7)})
    notes.merge(tmp_path, [9, 0])
    assert json.loads((tmp_path / warm.MANIFEST).read_text()) == after


def test_audits_in_flight_hold_the_gpu_one_at_a_time(tmp_path):
    spans = []

    def hold():
        rec = {}
        with warm.gpu_lock(tmp_path, rec):
            start = time.time()
            time.sleep(0.2)
            spans.append((start, time.time()))

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans.sort()
    assert len(spans) == 3 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_in_flight_multiplies_the_slots_of_each_gpu():
    from omegaconf import OmegaConf

    ev = OmegaConf.create({"gpus": [0, 1], "gpu_index": 0, "parallel": 1, "in_flight": 2})
    assert audit_slots(ev, "cuda") == [0, 0, 1, 1]
    assert audit_slots(OmegaConf.create({"gpus": [], "gpu_index": 3, "parallel": 1, "in_flight": 3}), "cuda") \
        == [3, 3, 3]


def test_a_run_with_audits_in_flight_compiles_ahead_and_holds_the_gpu_one_at_a_time(tmp_path, capsys):
    from tik_evo.cli import main
    from tik_evo.store import Store

    from .helpers import write_campaign

    campaign = write_campaign(tmp_path, search={"max_evaluations": 4, "kappa_threshold": 40},
                              evaluate={"in_flight": 2, "warm": "on", "warm_capability": [9, 0]})
    assert main(["run", str(campaign), "--quiet"]) == 0
    with Store.open_reader(tmp_path / "run") as s:
        st, audits = s.state(), s.all("U")
    assert st["evaluations"] == 4 and "crash" not in st["failures_by_kind"], st["failures_by_kind"]
    offspring = [u for u in audits if u.device.get("warm")]  # the root's audit notes the calls; the rest warm
    assert len(offspring) >= 3 and all(u.device["warm"]["calls"] > 0 for u in offspring)
    holds = sorted((u.device["gpu_lock"]["acquired_at"], u.device["gpu_lock"]["released_at"])
                   for u in audits if u.device.get("gpu_lock"))
    assert len(holds) >= 3 and all(a[1] <= b[0] for a, b in zip(holds, holds[1:]))
    # Runners (and on a GPU their CUDA contexts) start before the hold; the candidate is loaded only within it.
    for u in audits:
        if u.device.get("gpu_lock"):
            ph, lock = u.device["phases"], u.device["gpu_lock"]
            assert ph["runners_forked_at"] <= lock["acquired_at"] <= ph["candidate_loaded_at"] <= lock["released_at"]
    capsys.readouterr()
    assert main(["status", str(tmp_path / "run")]) == 0  # what the settings buy: offspring a minute, GPU held
    status = " ".join(capsys.readouterr().out.split())
    assert re.search(r"throughput \d+\.\d\d offspring/min after the root's audit; GPU held \d+\.\d s per", status)


def test_a_candidate_that_hangs_holding_the_gpu_times_out_after_timeout_s(tmp_path):
    # With audits in flight the worker may live longer (it may wait for the GPU); the candidate still gets
    # evaluate.timeout_s from taking the GPU, and its verdict is a timeout.
    src = ROOT_SRC.replace("    n_rows, hidden = x.shape\n", "    n_rows, hidden = x.shape\n    while True:\n"
                           "        pass\n", 1)
    t0 = time.time()
    out = run_audit(tmp_path, AuditJob(FAMILY, src, source_hash(src), "I1", WORKLOADS, [0],
                                       {"timeout_s": 6, "in_flight": 2, "interpreter_reps": 1}, "cpu"))
    assert not out.passed and out.failure_kind == "timeout", (out.failure_kind, out.failure)
    assert "held the GPU for 6 s" in out.failure and time.time() - t0 < 40
    assert out.device["gpu_lock"]["acquired_at"] <= out.device["gpu_lock"]["released_at"]
