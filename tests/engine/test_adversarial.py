"""Hostile candidates: each class of cheat tried against the audit, with the static scan switched off so the
process separation and the sandbox are what stop it (the scan has its own tests). Small edits of the real
rmsnorm root, audited with timing on, as a search audits them; the root itself must pass every time."""

import os
import socket
import threading
import uuid
from pathlib import Path

import pytest

from tik_evo import staticscan
from tik_evo.audit import AuditJob, run_audit
from tik_evo.families import load_family
from tik_evo.store import source_hash

FAMILY = load_family("rmsnorm")
ROOT_SRC = FAMILY.root_source()
WORKLOADS = [{"name": "full", "phase": "full", "tokens": 5, "hidden": 256},
             {"name": "decode", "phase": "decode", "batch": 3, "hidden": 256}]
DECODE_DOC = '    """One token per sequence: x [batch, hidden]; same per-row numerics as rmsnorm_full."""\n'
FULL_SIG = "def rmsnorm_full("


@pytest.fixture
def no_scan(monkeypatch):
    monkeypatch.setattr(staticscan, "scan", lambda *a, **k: [])


def audit(run_dir: Path, src: str, graph: str = "on", **evaluate):
    cfg = {"timeout_s": 120, "interpreter_reps": 2, "check_procs": 1, "graph_replay": graph, **evaluate}
    job = AuditJob(FAMILY, src, source_hash(src), "I1", WORKLOADS, [0], cfg, "cpu", time=True,
                   best_source_hash=source_hash(ROOT_SRC), best_source=ROOT_SRC)
    return run_audit(run_dir, job)


def in_decode(code: str) -> str:
    assert DECODE_DOC in ROOT_SRC
    return ROOT_SRC.replace(DECODE_DOC, DECODE_DOC + "".join(f"    {ln}\n" for ln in code.splitlines()))


def at_import(code: str) -> str:
    return ROOT_SRC + "\n" + code + "\n"


def failed_checks(out) -> list[dict]:
    return [c for s in out.stages for c in s["checks"] if not c["passed"]]


def _alive(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


def test_root_passes_with_everything_on(tmp_path, no_scan):
    out = audit(tmp_path, ROOT_SRC)
    assert out.passed, out.failure
    assert [s["name"] for s in out.stages] == ["static", "import", "small", "full", "graph", "repeat", "timing"]
    assert set(out.best_retimed) == {"full", "decode"}


def test_a_forged_verdict_file_is_not_the_verdict(tmp_path, no_scan):
    result = tmp_path / "audits" / "I1" / "result.json"
    forged = ('{"done": true, "forged": true, "stages": [], "measurements": {"full": {"median_s": 1e-9}, '
              '"decode": {"median_s": 1e-9}}}')
    src = at_import(f"import os\ntry:\n    open({str(result)!r}, 'w').write({forged!r})\nexcept OSError:\n"
                    "    pass\nos._exit(0)")
    out = audit(tmp_path, src)
    assert not out.passed and out.failure_kind == "crash", out.failure
    assert '"forged": true' not in result.read_text()


def test_patching_the_checks_in_its_process_changes_nothing(tmp_path, no_scan):
    patch = ("import tik_evo.checks as _c\n_c.reference = lambda name, *a, **k: _c.Check(name, True, 'reference')\n"
             "_c.bitwise = lambda name, *a, **k: _c.Check(name, True, 'consistency')\n")
    src = at_import(patch) .replace(DECODE_DOC, DECODE_DOC + "    out.zero_()\n    return\n")
    out = audit(tmp_path, src)
    assert not out.passed and out.failure_kind in ("consistency", "reference", "finite"), out.failure


def test_a_patched_clock_is_tampering(tmp_path, no_scan):
    out = audit(tmp_path, at_import("import time\ntime.perf_counter = lambda: 0.0"))
    assert not out.passed and out.failure_kind == "tamper", out.failure
    assert "time.perf_counter" in out.failure


def test_the_best_cannot_be_sabotaged_through_files(tmp_path, no_scan):
    sources = tmp_path / "sources"
    sources.mkdir(parents=True)
    best_file = sources / f"cand_{source_hash(ROOT_SRC)}.py"
    best_file.write_text(ROOT_SRC)
    family_file = FAMILY.folder / "family.py"
    before = family_file.read_text()
    targets = [str(best_file), str(family_file), str(tmp_path / "ir.lmdb.pwned")]
    src = at_import(f"for _p in {targets!r}:\n    try:\n"
                    "        open(_p, 'a').write('\\nimport time; time.sleep(1)\\n')\n"
                    "    except OSError:\n        pass")
    out = audit(tmp_path, src)
    assert out.passed, out.failure
    assert best_file.read_text() == ROOT_SRC and family_file.read_text() == before
    assert not (tmp_path / "ir.lmdb.pwned").exists()


def test_an_input_zeroed_in_place_is_caught(tmp_path, no_scan):
    # Zero the input, write zeros: relative error 0/|0| against a reference taken from the mutated input.
    src = in_decode("x.zero_()\nout.zero_()\nif out32 is not None:\n    out32.zero_()\nreturn")
    out = audit(tmp_path, src)
    assert not out.passed, out.failure
    if FAMILY.signature("rmsnorm_decode"):  # declared: x is an input, so its change is named as such
        assert any(c["kind"] == "inputs" and "'x'" in c["name"] for c in failed_checks(out)), failed_checks(out)


def test_a_production_call_without_the_fp32_output_must_give_the_same_bits(tmp_path, no_scan):
    if not FAMILY.signature("rmsnorm_decode") or "out32" not in FAMILY.signature("rmsnorm_decode").optional:
        pytest.skip("rmsnorm declares no optional out32")
    # Production (model, autograd) calls pass out32=None: this one then computes something cheaper.
    src = in_decode("if out32 is None:\n    out.copy_((x.float() * weight.float()).to(out.dtype))\n    return")
    out = audit(tmp_path, src)
    assert not out.passed and out.failure_kind == "consistency", out.failure
    assert any("without out32" in c["name"] for c in failed_checks(out))


def test_a_call_that_skips_now_and_then_is_caught(tmp_path, no_scan):
    src = in_decode("_N[0] += 1\nif _N[0] % 3 == 0:\n    return") + "\n_N = [0]\n"
    out = audit(tmp_path, src)
    assert not out.passed, out.failure


def test_memoised_outputs_are_caught(tmp_path, no_scan):
    # The output of the first call per input address, replayed for every later call at that address.
    src = ROOT_SRC.replace("def rmsnorm_decode(", "def _decode_impl(", 1) + (
        "\n_MEMO = {}\n\ndef rmsnorm_decode(x, weight, eps, out, out32=None):\n"
        "    _k = (x.data_ptr(), out.data_ptr())\n    if _k in _MEMO:\n        out.copy_(_MEMO[_k])\n        return\n"
        "    _decode_impl(x, weight, eps, out, out32)\n    _MEMO[_k] = out.clone()\n")
    out = audit(tmp_path, src, graph="off")
    assert not out.passed, out.failure


def test_no_network_env_or_other_processes_memory(tmp_path, no_scan, monkeypatch):
    monkeypatch.setenv("TIK_EVO_TEST_SECRET", "s3cr3t-" + uuid.uuid4().hex)
    secret = os.environ["TIK_EVO_TEST_SECRET"]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port, connections, stop = server.getsockname()[1], [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connections.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept)
    thread.start()
    probe = f"""
import os, socket
_seen = []
if os.environ.get("TIK_EVO_TEST_SECRET"):
    _seen.append("env")
for _pid in os.listdir("/proc"):
    try:
        if {secret!r}.encode() in open(f"/proc/{{_pid}}/environ", "rb").read():
            _seen.append("environ of " + _pid)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    _seen.append("network")
except OSError:
    pass
if _seen:
    raise RuntimeError("escaped: " + ", ".join(_seen))
"""
    try:
        out = audit(tmp_path, at_import(probe))
    finally:
        stop.set()
        thread.join()
        server.close()
    assert out.passed, out.failure
    assert not connections


def test_a_detached_process_dies_with_the_audit(tmp_path, no_scan):
    marker = "tik-evo-detached-" + uuid.uuid4().hex
    src = at_import("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
                    f"{marker!r}], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    out = audit(tmp_path, src, graph="off")
    assert out.passed, out.failure
    assert not _alive(marker)


def test_the_candidate_cannot_see_that_it_is_audited_by_name(tmp_path, no_scan):
    probe = ("import sys, os\n_judge = [m for m in sys.modules if m.startswith(('tik_evo.worker', 'tik_evo.judge', "
             "'tik_evo.remote', 'tik_evo.timed', 'kernels'))]\n"
             "if _judge or os.path.exists('job.json') or 'tik_evo' in os.getcwd():\n"
             "    raise RuntimeError(f'audit visible: {_judge} {os.getcwd()}')")
    out = audit(tmp_path, at_import(probe), graph="off")
    assert out.passed, out.failure


def test_strict_sandbox_records_every_protection(tmp_path):
    out = audit(tmp_path, ROOT_SRC, graph="off", sandbox="strict")
    assert out.passed, out.failure
    import json

    sb = json.loads((tmp_path / "audits" / "I1" / "result.json").read_text())["sandbox"]
    assert sb["network"] and sb["readonly_files"] and sb["capabilities_dropped"] and not sb["missing"], sb



def test_a_detached_process_dies_with_a_judge_killed_at_its_timeout(tmp_path, no_scan):
    import time

    marker = "tik-evo-orphan-" + uuid.uuid4().hex
    src = at_import("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', "
                    f"{marker!r}], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
                    ).replace(DECODE_DOC, DECODE_DOC + "    while True:\n        pass\n")
    out = audit(tmp_path, src, graph="off", timeout_s=15, executor="forkserver")
    assert out.failure_kind == "timeout", out.failure
    deadline = time.time() + 10
    while _alive(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(marker)


def test_the_sandbox_holds_where_the_temp_dir_is_reached_through_a_symlink(tmp_path, monkeypatch):
    # The private directory is made under $TMPDIR; reached through a symlink, its mount must still be writable
    # and everything else read-only (a GPU machine's /tmp was such a case).
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "link"))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    out = audit(tmp_path / "run", ROOT_SRC, graph="off", sandbox="strict")
    assert out.passed, out.failure


def test_temporary_files_go_to_the_private_directory(tmp_path, no_scan):
    # Triton builds its driver helper in tempfile's directory; the judge had resolved it before the fork.
    probe = "import tempfile\nwith tempfile.TemporaryDirectory() as _d:\n    open(_d + '/x', 'w').write('ok')"
    out = audit(tmp_path, at_import(probe), graph="off")
    assert out.passed, out.failure


def test_tik_evo_audit_judges_one_file_and_exits_by_its_verdict(tmp_path, capsys):
    import json

    from tik_evo.cli import main

    campaign = str(Path(__file__).resolve().parents[2] / "campaigns" / "quickstart.yaml")
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(ROOT_SRC)
    bad.write_text(in_decode("out.zero_()\nreturn"))
    assert main(["audit", campaign, str(good), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verified"] and verdict["objective"] > 0 and verdict["sandbox"]["network"], verdict
    assert main(["audit", campaign, str(bad), f"store.path={tmp_path / 'kept'}"]) == 1
    text = capsys.readouterr().out
    assert "REJECTED" in text and "failed stage" in text, text
    assert (tmp_path / "kept" / "ir.lmdb").is_dir()  # store.path given: the run directory is kept
    assert main(["audit", campaign, str(tmp_path / "missing.py")]) == 2
    assert "missing.py" in "".join(capsys.readouterr().err.split())  # rich wraps long paths


def test_a_candidate_right_only_on_the_fixed_shapes_is_caught_by_a_drawn_case(tmp_path, no_scan):
    # Wrong for any hidden size the family's fixed cases and these workloads do not use: only a case drawn for
    # this audit (an odd width) shows it.
    known = sorted({c["hidden"] for c in FAMILY.check_cases("full") + FAMILY.check_cases("small")} | {256})
    src = in_decode(f"if x.shape[-1] not in {known}:\n    out.zero_()\n    return")
    out = audit(tmp_path, src, graph="off")
    assert not out.passed and out.failure_kind in ("consistency", "reference", "finite"), out.failure
    full = next(s for s in out.stages if s["name"] == "full")
    assert not full["passed"]
    drawn = {f"xH{c['hidden']}/" for c in __import__("json").loads(
        (tmp_path / "audits" / "I1" / "result.json").read_text())["drawn_cases"]}
    assert any(any(d in c["name"] for d in drawn) for c in full["checks"] if not c["passed"])
