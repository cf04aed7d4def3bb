"""The job file the engine writes for a judge and the result file it reads back."""

from tik_evo.audit import AuditJob
from tik_evo.families import load_family
from tik_evo.worker_io import StageResult, WorkerJob, WorkerResult


def _job(**kw) -> AuditJob:
    return AuditJob(load_family("rmsnorm"), "src", "h1", "I1", [{"name": "w"}], [3, 4], {"timeout_s": 9}, "cpu",
                    best_source_hash="h0", best_source="best src", ancestors=["h1", "h0"], **kw)


def test_a_job_goes_to_the_judge_and_back_unchanged(tmp_path):
    job = _job().worker_job(tmp_path, tmp_path / "result.json")
    assert WorkerJob.from_json(job.to_json()) == job
    assert (job.family, job.best_source, job.best_hash, job.ancestors) == ("rmsnorm", "best src", "h0", ["h0"])
    untimed = _job(time=False).worker_job(tmp_path, tmp_path / "result.json")
    assert untimed.best_source is None and untimed.best_hash is None  # the best goes only where it is timed


def test_a_result_keeps_what_it_does_not_name(tmp_path):
    stage = {"name": "full", "passed": False, "seconds": 1.5, "checks": [{"name": "c", "passed": False}],
             "error": "", "failure_kind": "consistency", "note": "added by the judge"}
    data = {"stages": [stage], "measurements": {"w": {"median_s": 1e-3}}, "done": False, "drawn_cases": [{"n": 1}]}
    result = WorkerResult.from_dict(data)
    assert result.stages[0].failure_kind == "consistency" and not result.stages[0].passed
    assert result.stages[0].to_dict() == stage and result.other == {"drawn_cases": [{"n": 1}]}
    assert StageResult("static", True).to_dict() == {"name": "static", "passed": True, "seconds": 0.0, "checks": [],
                                                     "error": "", "failure_kind": ""}
    assert WorkerResult.read(tmp_path / "missing.json") == WorkerResult()  # a judge that died before writing
