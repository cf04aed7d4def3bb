"""Audit in a subprocess: bad candidates become failed audits with evidence, never a dead run."""

import time

import pytest

from tik_evo.audit import AuditJob, run_audit, worker_devices
from tik_evo.families import load_family
from tik_evo.knobs import read_knobs, write_knobs
from tik_evo.store import source_hash

FAMILY = load_family("rmsnorm")
ROOT_SRC = FAMILY.root_source()
WORKLOADS = [{"name": "full", "phase": "full", "tokens": 4, "hidden": 256},
             {"name": "decode", "phase": "decode", "batch": 2, "hidden": 256}]


def audit(tmp_path, src, timeout=120, time_it=False, executor="auto", check_procs=0, seeds=(0,), graph="auto"):
    job = AuditJob(FAMILY, src, source_hash(src), "I1", WORKLOADS, list(seeds), {"timeout_s": timeout,
                   "interpreter_reps": 1, "executor": executor, "check_procs": check_procs,
                   "graph_replay": graph}, "cpu", time=time_it)
    return run_audit(tmp_path, job)


def with_body(extra: str) -> str:
    # Inject code at the start of the decode entry point.
    return ROOT_SRC.replace('    """One token per sequence: x [batch, hidden]; '
                            'same per-row numerics as rmsnorm_full."""\n',
                            '    """One token per sequence."""\n' + extra)


def test_root_passes_and_is_timed(tmp_path):
    out = audit(tmp_path, ROOT_SRC, time_it=True)
    assert out.passed, out.failure
    assert [s["name"] for s in out.stages] == ["static", "import", "small", "full", "repeat", "timing"]
    assert set(out.measurements) == {"full", "decode"}
    assert all(m["timer"] == "wall-interpreter" for m in out.measurements.values())
    assert out.device["gpu"].startswith("none")
    # Time outside the stages is itemised: the worker's start and exit, and each runner's own account.
    ph = out.device["phases"]
    assert ph["worker_start_s"] >= 0 and ph["worker_exit_s"] >= 0 and ph["before_judge_s"] >= 0
    assert ph["runner"]["judge_wait"]["load"][0] == 1
    assert ph["runner"]["runner"]["ops"]["call"][0] >= 1


def test_graph_stage_replays_the_entry_points_and_catches_a_call_that_remembers_its_output(tmp_path):
    # On the CPU the stage's "graph" reruns the call (evaluate.graph_replay=on; auto runs it on GPUs only). The
    # root passes; a candidate that skips the work for an output tensor it has already written (a cache keyed by
    # the output, invisible to checks that allocate fresh outputs) writes nothing on replay and is refused.
    out = audit(tmp_path / "root", ROOT_SRC, graph="on")
    assert out.passed, out.failure
    graph = next(s for s in out.stages if s["name"] == "graph")
    names = [c["name"] for c in graph["checks"] if c["name"].startswith("graph replay")]
    assert any("rmsnorm_decode" in n for n in names) and any("rmsnorm_full" in n for n in names), names
    # A candidate that skips the work for an output buffer it has written before (keyed by its address: the
    # judge's arena slots are reused from call to call, as a replay reuses its graph's buffers) is refused, with
    # the graph stage or without it: its later calls leave stale values.
    cheat = with_body("    if out.data_ptr() in WRITTEN:\n        return\n    WRITTEN.append(out.data_ptr())\n")
    cheat += "\nWRITTEN = []\n"
    for graph in ("on", "off"):
        out = audit(tmp_path / f"cheat_{graph}", cheat, graph=graph)
        assert not out.passed and out.failure_kind in ("consistency", "finite", "reference"), out.failure


@pytest.mark.parametrize("executor", ["spawn", "forkserver"])
def test_hanging_candidate_killed_within_timeout(tmp_path, executor):
    src = with_body("    while True:\n        pass\n")
    t0 = time.time()
    out = audit(tmp_path, src, timeout=12, executor=executor)
    assert time.time() - t0 < 30
    assert out.failure_kind == "timeout" and not out.passed
    assert "timeout_s" in out.failure


@pytest.mark.parametrize("executor", ["spawn", "forkserver"])
def test_os_abort_is_a_crash_not_a_dead_run(tmp_path, executor):
    """A candidate that calls os.abort(): refused statically; with the scan bypassed, the worker dies of
    SIGABRT and the audit records a crash with the log tail."""
    src = ROOT_SRC.replace("import torch\n", "import os\nimport torch\n", 1) + "\nos.abort()\n"
    out = audit(tmp_path, src)
    assert out.failure_kind == "static" and "import os" in out.failure
    from tik_evo import staticscan

    original = staticscan.scan
    try:
        staticscan.scan = lambda *a, **k: []
        out = audit(tmp_path, src, executor=executor)
    finally:
        staticscan.scan = original
    assert out.failure_kind == "crash" and "SIGABRT" in out.failure
    assert audit(tmp_path, ROOT_SRC, executor=executor).passed  # the next audit is unaffected


FIXED = [f"T{c['tokens']}xH{c['hidden']}/" for c in FAMILY.check_cases("full")]


def _full(out, fixed_only=True):
    """The full stage, with only the checks of the family's fixed cases (each audit draws other cases too)."""
    stage = next(s for s in out.stages if s["name"] == "full")
    if not fixed_only:
        return stage
    return {**stage, "checks": [c for c in stage["checks"] if any(t in c["name"] for t in FIXED)
                                or ("[case" in c["name"]
                                    and int(c["name"].split("[case ")[1].split()[0]) < len(FIXED))]}


@pytest.mark.parametrize("executor", ["spawn", "forkserver"])
def test_full_stage_split_over_processes_reads_as_in_worker(tmp_path, executor):
    one = audit(tmp_path / "one", ROOT_SRC, check_procs=1, seeds=(0, 1))
    three = audit(tmp_path / "three", ROOT_SRC, check_procs=3, seeds=(0, 1), executor=executor)
    assert one.passed and three.passed, (one.failure, three.failure)
    assert one.device["check_procs"] == 1 and three.device["check_procs"] == 3
    # Same checks in the same (case, seed) order, with the same evidence.
    assert _full(three)["checks"] == _full(one)["checks"]
    assert len({c["name"] for c in _full(one)["checks"]}) == len(_full(one)["checks"]) > 0
    assert sorted((tmp_path / "three" / "audits" / "I1").glob("shard*.json"))
    assert len(three.device["phases"]["shard_runners"]) == 3


# Case 1 of rmsnorm's full level has hidden 1000 (the small level never does).
IN_CASE_1 = "    if x.shape[-1] == 1000:\n    {}\n"


def test_error_in_a_shard_names_its_case_and_keeps_earlier_cases(tmp_path):
    src = with_body(IN_CASE_1.format("    raise RuntimeError('boom in case 1')"))
    serial, split = audit(tmp_path / "a", src, check_procs=1), audit(tmp_path / "b", src, check_procs=3)
    for out in (serial, split):
        assert out.failure_kind == "exception" and "boom in case 1" in out.failure
    # Checks of case 0 kept, none of cases 1 and 2: what the in-worker loop keeps.
    assert _full(split)["checks"] == _full(serial)["checks"]
    assert _full(split)["checks"] and all("1000" not in c["name"] for c in _full(split)["checks"])


def test_crash_in_a_shard_is_a_crash_of_its_case(tmp_path):
    from tik_evo import staticscan

    src = with_body(IN_CASE_1.format("    __import__('os').abort()"))
    original = staticscan.scan
    try:
        staticscan.scan = lambda *a, **k: []
        out = audit(tmp_path, src, check_procs=3)
    finally:
        staticscan.scan = original
    assert out.failure_kind == "crash" and "SIGABRT" in out.failure and "case 1" in out.failure, out.failure
    assert _full(out)["checks"]  # case 0's


def test_shard_out_of_gpu_memory_reruns_in_the_worker(tmp_path):
    # Contexts of several shards may not fit a small GPU together: a shard's OutOfMemoryError is no verdict on the
    # candidate. This one runs out in a process's first decode call at hidden 1000 (case 1): in its shard; the
    # worker's small stage has called decode before, so the rerun there passes.
    src = with_body("    if x.shape[-1] == 1000 and not _CALLS:\n"
                    "        raise torch.OutOfMemoryError('CUDA out of memory (test)')\n"
                    "    _CALLS.append(1)\n") + "\n_CALLS = []\n"
    out = audit(tmp_path, src, check_procs=3)
    assert out.passed, out.failure
    assert out.device["checks_rerun_in_worker_from_case"] == 1
    serial = audit(tmp_path / "serial", ROOT_SRC, check_procs=1)
    assert [c["name"] for c in _full(out)["checks"]] == [c["name"] for c in _full(serial)["checks"]]


def test_shard_counts():
    from tik_evo import shards

    assert shards.count(0, 7, cpus=16) == 7 and shards.count(0, 20, cpus=64) == shards.MAX_AUTO
    assert shards.count(0, 3, cpus=2) == 1  # two CPUs: the stage stays in the worker
    assert shards.count(4, 2) == 2 and shards.count(1, 9) == 1
    assert shards.deal(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    # drawn cases (compiled cold) alone on their shards, the fixed ones dealt over the rest
    assert shards.deal(10, 8, fresh_from=7) == [[7], [8], [9], [0, 5], [1, 6], [2], [3], [4]]
    assert shards.deal(6, 2, fresh_from=4) == [[0, 2, 4], [1, 3, 5]]


def test_raising_candidate(tmp_path):
    out = audit(tmp_path, with_body("    raise RuntimeError('boom')\n"))
    assert out.failure_kind == "exception" and "boom" in out.failure


def test_out_of_resources_is_its_own_kind(tmp_path):
    # A legal knob choice that does not fit the GPU (e.g. too many stages for shared memory) is reported as
    # "resources", in whichever stage it is raised, so operators and the TUI can tell it from a broken kernel.
    out = audit(tmp_path,
                with_body("    raise triton.runtime.errors.OutOfResources(245800, 232448, 'shared memory')\n"))
    assert out.failure_kind == "resources", out.failure
    assert "shared memory" in out.failure


def test_error_kinds():
    from tik_evo.worker import error_kind

    def named(name):
        return type(name, (Exception,), {})()

    assert error_kind(named("OutOfResources")) == "resources"
    assert error_kind(named("CompilationError")) == "compile"
    assert error_kind(named("CompileTimeAssertionFailure")) == "compile"
    assert error_kind(RuntimeError("boom")) == "exception"


def test_mismatched_contract_caught(tmp_path):
    """Decode with another reduction width than full: each path is accurate, the bits differ."""
    knobs = read_knobs(ROOT_SRC)
    # Few-row launches (decode) reduce in 64-wide chunks, the full path in 128-wide ones.
    src = write_knobs(ROOT_SRC, {**knobs, "BLOCK_H": 128}).replace(
        'BLOCK_H=block,', 'BLOCK_H=block if x.shape[0] > 6 else 64,')
    out = audit(tmp_path, src)
    assert out.failure_kind == "consistency", out.failure
    failed = [c for s in out.stages for c in s["checks"] if not c["passed"]]
    assert failed and all(c["kind"] == "consistency" for c in failed)
    assert any("fp32" in c["name"] for c in failed)


def test_static_scan_refuses_cheats(tmp_path):
    for bad in ("import time\n", "import subprocess\n", "x = open('/etc/passwd')\n",
                "s = torch.cuda.Stream()\n", "import functools\nfunctools.__builtins__['__import__']('os')\n",
                "x = ().__class__.__mro__[1].__subclasses__()\n", "t = torch.cuda.Event()\n"):
        out = audit(tmp_path, ROOT_SRC + "\n" + bad)
        assert out.failure_kind == "static", bad


@pytest.mark.parametrize("missing", ["rmsnorm_decode"])
def test_missing_entry_point(tmp_path, missing):
    out = audit(tmp_path, ROOT_SRC.replace(f"def {missing}(", "def renamed("))
    assert out.failure_kind == "static" and missing in out.failure


HANG_AUDIT = """
import sys
from pathlib import Path
from tik_evo.audit import AuditJob, run_audit, worker_devices
from tik_evo.families import load_family
from tik_evo.store import source_hash

family = load_family("rmsnorm")
src = Path(sys.argv[2]).read_text()
run_audit(Path(sys.argv[1]), AuditJob(family, src, source_hash(src), "I1", [], [0],
          {"timeout_s": 600, "executor": sys.argv[3]}, "cpu", time=False))
"""


@pytest.mark.parametrize("executor", ["spawn", "forkserver"])
def test_kill_9_of_the_engine_takes_the_audit_down(tmp_path, executor):
    """A hanging audit must not outlive an engine killed with SIGKILL (its 600 s timeout never fires)."""
    import os
    import signal
    import subprocess
    import sys

    from .helpers import ROOT
    from .test_run import _audit_processes

    (tmp_path / "hang.py").write_text(with_body("    while True:\n        pass\n"))
    engine = subprocess.Popen([sys.executable, "-c", HANG_AUDIT, str(tmp_path), str(tmp_path / "hang.py"), executor],
                              cwd=ROOT)
    deadline = time.time() + 60
    while not _audit_processes(tmp_path / "audits") and time.time() < deadline:
        time.sleep(0.2)
    assert _audit_processes(tmp_path / "audits"), "the audit never started"
    time.sleep(1)
    os.kill(engine.pid, signal.SIGKILL)
    engine.wait()
    deadline = time.time() + 15
    while _audit_processes(tmp_path / "audits") and time.time() < deadline:
        time.sleep(0.2)
    assert not _audit_processes(tmp_path / "audits")


@pytest.mark.parametrize("visible, index, pinned", [
    (None, 2, "2"), ("4,5", 1, "5"), ("GPU-aa, GPU-bb", 0, "GPU-aa"), ("MIG-x", 0, "MIG-x")])
def test_worker_is_pinned_through_the_engines_visible_devices(visible, index, pinned):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert worker_devices(env, index) == pinned


def test_a_gpu_index_outside_the_visible_devices_is_named():
    with pytest.raises(ValueError, match="evaluate.gpu_index=2 .* 2 device"):
        worker_devices({"CUDA_VISIBLE_DEVICES": "4,5"}, 2)


def test_resolve_device_names_a_gpu_index_that_is_not_visible(monkeypatch, tmp_path):
    import torch

    from tik_evo.config import ConfigError, load_campaign
    from tik_evo.initialization import resolve_device

    from .helpers import write_campaign

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cfg = load_campaign(write_campaign(tmp_path), ["evaluate.gpu_index=2"])
    with pytest.raises(ConfigError, match="key 'evaluate.gpu_index': 2, but 2 CUDA device"):
        resolve_device(cfg)


@pytest.mark.parametrize("executor", ["spawn", "forkserver"])
def test_closing_the_executors_stops_an_audit_in_flight(tmp_path, executor):
    """What an interrupted run with concurrent audits does: the audits stop now, not at their timeout."""
    import threading

    from tik_evo.audit import close_executors

    result = {}
    thread = threading.Thread(target=lambda: result.update(out=audit(
        tmp_path, with_body("    while True:\n        pass\n"), timeout=300, executor=executor)))
    thread.start()
    from .test_run import _audit_processes

    deadline = time.time() + 60
    while not _audit_processes(tmp_path / "audits") and time.time() < deadline:
        time.sleep(0.2)
    assert _audit_processes(tmp_path / "audits"), "the audit never started"
    t0 = time.time()
    close_executors()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.time() - t0 < 30
    assert not result["out"].passed


def test_audit_slots():
    from types import SimpleNamespace as NS

    from tik_evo.audit import audit_slots

    assert audit_slots(NS(gpus=[], gpu_index=1, parallel=1), "cuda") == [1]
    assert audit_slots(NS(gpus=[2], gpu_index=0, parallel=1), "cuda") == [2]  # one GPU listed: the search's too
    assert audit_slots(NS(gpus=[3, 1], gpu_index=0, parallel=4), "cuda") == [3, 1]
    assert audit_slots(NS(gpus=[3, 1], gpu_index=0, parallel=3), "cpu") == [0, 0, 0]


def test_a_close_while_a_worker_starts_still_stops_it(tmp_path, monkeypatch):
    """The race behind an interrupted run's audits: close() lands after the worker process exists but before
    the executor knew its pid. The executor must still kill it, and start nothing once closed."""
    import signal
    import subprocess
    import sys

    from tik_evo import executor as ex_mod

    real_popen = subprocess.Popen
    ex = ex_mod.SpawnExecutor({})

    def popen_then_close(*args, **kwargs):  # a worker that would sleep out the timeout, closed as it starts
        proc = real_popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        ex.close()
        return proc

    monkeypatch.setattr(ex_mod.subprocess, "Popen", popen_then_close)
    t0 = time.time()
    assert ex.run(tmp_path / "job.json", tmp_path / "worker.log", timeout=300) == (-signal.SIGKILL, False)
    assert time.time() - t0 < 30 and not ex.running

    def no_popen(*args, **kwargs):
        raise AssertionError("a closed executor started a process")

    monkeypatch.setattr(ex_mod.subprocess, "Popen", no_popen)
    assert ex.run(tmp_path / "job.json", tmp_path / "worker.log", timeout=300) == ex_mod.CLOSED
    server = ex_mod.ForkServerExecutor({})
    server.close()
    assert server.run(tmp_path / "job.json", tmp_path / "worker.log", timeout=300) == ex_mod.CLOSED


def test_close_reaches_a_job_the_fork_server_handed_to_its_fallback(tmp_path, monkeypatch):
    """A server that answers garbage sends its job to a spawned worker; closing the executor must stop that
    worker now, not at the job's timeout."""
    import signal
    import subprocess
    import sys
    import threading

    from tik_evo import executor as ex_mod

    real_popen = subprocess.Popen
    server = ex_mod.ForkServerExecutor({})
    broken = real_popen([sys.executable, "-c", "print('not a pid line')"], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, bufsize=0)
    monkeypatch.setattr(server, "_start", lambda: broken)
    monkeypatch.setattr(ex_mod.subprocess, "Popen", lambda *a, **k: real_popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True))
    result = {}
    thread = threading.Thread(target=lambda: result.update(
        out=server.run(tmp_path / "job.json", tmp_path / "worker.log", timeout=300)))
    thread.start()
    deadline = time.time() + 60
    while not server._fallback.running and time.time() < deadline:
        time.sleep(0.05)
    assert server._fallback.running, "the job never reached the fallback worker"
    t0 = time.time()
    server.close()
    thread.join(timeout=30)
    assert not thread.is_alive() and time.time() - t0 < 30
    assert result["out"] == (-signal.SIGKILL, False)


def test_a_long_failure_is_cut_in_the_middle_keeping_the_error_at_its_end():
    from tik_evo.failure import clip

    text = "Traceback (most recent call last):\n" + "  frame\n" * 400 + "ArenaError: out of device memory"
    cut = clip(text, 300)
    assert len(cut) < 360 and cut.startswith("Traceback") and cut.endswith("ArenaError: out of device memory")
    assert clip("short", 300) == "short"
