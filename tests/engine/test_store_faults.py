"""Faults in a real run's store: damaged records, a truncated file, a full map or disk, and the backups.

Each ends in a message naming what is wrong and how to get the records back, a non-zero exit without a
signal, and no intact record lost (salvage exports them, a backup restores them).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import lmdb
import pytest

import tik_evo.store as store_module
from tik_evo.cli import main
from tik_evo.store import Store, StoreFull
from tik_evo.store_integrity import list_backups, unseal
from tik_evo.store_salvage import restore_backup

from .helpers import ROOT, write_campaign

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished quickstart run (3 evaluations, a backup after every step) and its export, made once."""
    tmp = tmp_path_factory.mktemp("faults")
    campaign = write_campaign(tmp, search={"max_evaluations": 3})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "BACKUP_EVERY", 1)
        assert main(["run", str(campaign), "--quiet"]) == 0
    run = tmp / "run"
    assert main(["export", str(run), "-o", str(tmp / "export.jsonl")]) == 0
    return run, (tmp / "export.jsonl").read_text().splitlines()


@pytest.fixture
def run(finished, tmp_path):
    """A private copy of the finished run (the faults are made to it)."""
    copy = tmp_path / "run"
    shutil.copytree(finished[0], copy, ignore=shutil.ignore_patterns("triton"))
    return copy


def _said(text: str, *needles: str) -> bool:
    # Rich wraps long messages (and long paths) at the console width: compare without whitespace.
    flat = "".join(text.split())
    return all("".join(n.split()) in flat for n in needles)


def _records(lines: list[str]) -> dict[tuple[str, str], str]:
    """Export lines of records (not the state, not events) by (type, id)."""
    out = {}
    for line in lines:
        d = json.loads(line)
        if d["type"] not in ("state", "event", "damaged"):
            out[(d["type"], d["id"])] = line
    return out


def _immutable(lines: list[str]) -> dict[tuple[str, str], dict]:
    # Status (implementations) and uses/evidence (opportunities) legitimately change as a run goes on.
    return {k: {f: v for f, v in json.loads(line).items() if f not in ("status", "uses", "evidence")}
            for k, line in _records(lines).items()}


def _smash(run, needle: bytes) -> int:
    """Overwrite the bytes after every copy of `needle` in the store's file (LMDB pages are copy-on-write, so
    a value may also sit in freed pages): what a bad sector or a stray write does to a record."""
    data = run / "ir.lmdb" / "data.mdb"
    blob = bytearray(data.read_bytes())
    hits = [m.end() for m in re.finditer(re.escape(needle), blob)]
    for at in hits:
        blob[at:at + 6] = b"\xff\xfe\xfd\xfc\xfb\xfa"
    data.write_bytes(bytes(blob))
    return len(hits)


def _salvage(run, tmp_path, capsys) -> tuple[int, list[str], str]:
    out = tmp_path / f"salvage-{uuid.uuid4().hex[:6]}.jsonl"
    rc = main(["export", str(run), "--salvage", "-o", str(out)])
    return rc, out.read_text().splitlines(), capsys.readouterr().err


def test_a_damaged_record_is_named_and_everything_else_salvaged(run, finished, tmp_path, capsys):
    assert _smash(run, b'{"id": "U1", ') >= 1
    for cmd in (["status", str(run)], ["resume", str(run), "--quiet"], ["export", str(run)], ["show", str(run), "I1"]):
        capsys.readouterr()
        assert main(cmd) == 2, cmd
        err = capsys.readouterr().err
        assert _said(err, f"{run}: the IR store is damaged: audit U1: its checksum does not match its bytes.",
                     f"tik-evo export {run} --salvage", f"tik-evo resume {run} --from-backup step-000003"), (cmd, err)
        assert "Traceback" not in err
    rc, lines, err = _salvage(run, tmp_path, capsys)
    assert rc == 1 and _said(err, "damaged: audit U1: its checksum does not match its bytes", "salvaged")
    original = set(finished[1])
    lost = original - set(lines)
    assert len(lost) == 1 and json.loads(lost.pop())["id"] == "U1"  # every other record, state and event intact
    assert json.loads(lines[-1]) == {"type": "damaged", "table": "audit", "key": "U1",
                                     "problem": "its checksum does not match its bytes"}


def _unseal_store(run) -> None:
    """Rewrite the run's store as schema 1 wrote it: bare JSON values, no integrity flag."""
    env = lmdb.open(str(run / "ir.lmdb"), max_dbs=16)
    with env.begin(write=True) as t:
        for name in ("implementation", "opportunity", "action", "audit", "decision", "state", "event"):
            db = env.open_db(name.encode(), txn=t)
            for k, v in list(t.cursor(db=db)):
                t.put(k, unseal(v, True), db=db)
        meta = env.open_db(b"meta", txn=t)
        t.put(b"schema", b"1", db=meta)
        t.delete(b"integrity", db=meta)
    env.close()


def test_a_store_without_checksums_still_reads_and_bad_bytes_are_named(run, finished, tmp_path, capsys):
    _unseal_store(run)
    rc, lines, _ = _salvage(run, tmp_path, capsys)
    assert rc == 0 and set(lines) == set(finished[1])  # schema 1 reads as it did
    assert main(["status", str(run)]) == 0
    assert _smash(run, b'{"id": "D0", ') >= 1  # bad UTF-8 where a checksum would have said more
    capsys.readouterr()
    assert main(["status", str(run)]) == 2
    assert _said(capsys.readouterr().err, "the IR store is damaged: decision D0: it is not valid UTF-8", "--salvage")
    rc, lines, err = _salvage(run, tmp_path, capsys)
    assert rc == 1 and _said(err, "decision D0: it is not valid UTF-8")
    assert set(finished[1]) - set(lines) == {next(x for x in finished[1] if '"id": "D0"' in x)}


def test_a_truncated_store_is_refused_without_sigbus_and_restored_from_its_backup(run, finished, tmp_path, capsys):
    data = run / "ir.lmdb" / "data.mdb"
    os.truncate(data, data.stat().st_size * 6 // 10)
    env = {**os.environ, "COLUMNS": "1000"}
    for cmd in (["status", str(run)], ["resume", str(run)]):
        r = subprocess.run([sys.executable, "-m", "tik_evo.cli", *cmd], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, (cmd, r.returncode, r.stderr[-2000:])  # was -7 (SIGBUS), exit 135 in a shell
        assert _said(r.stderr, f"{run}: the IR store is damaged: {data} is", "but LMDB's header says the store uses",
                     "the file was truncated", f"tik-evo export {run} --salvage",
                     f"tik-evo resume {run} --from-backup step-000003"), r.stderr
    r = subprocess.run([sys.executable, "-m", "tik_evo.cli", "export", str(run), "--salvage", "-o",
                        str(tmp_path / "s.jsonl")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and _said(r.stderr, "the file was truncated", "salvaged"), r.stderr[-2000:]
    salvaged = _records((tmp_path / "s.jsonl").read_text().splitlines())
    assert set(salvaged.items()) <= set(_records(finished[1]).items())  # what it could read, read right
    # The backup made when the run finished holds every record: restored, nothing is lost.
    capsys.readouterr()
    assert main(["resume", str(run), "--from-backup", "latest", "--quiet"]) == 0
    err = capsys.readouterr().err
    aside = next(run.glob("ir.lmdb.damaged-*"))
    assert _said(err, f"restored {run / 'backups' / 'step-000003'} (step 3,", f"the store it replaces is in {aside}")
    rc, lines, _ = _salvage(run, tmp_path, capsys)
    assert rc == 0 and _immutable(lines) == _immutable(finished[1])


def test_backups_are_made_verified_and_rotated(run, finished, tmp_path, capsys):
    backups = list_backups(run)
    assert [b.name for b in backups] == ["step-000002", "step-000003"]  # one per step, the newest two kept
    assert not [p for p in (run / "backups").iterdir() if p.name.startswith(".")]
    rc, lines, _ = _salvage(backups[-1], tmp_path, capsys)  # a backup reads like a store
    assert rc == 0 and set(lines) == set(finished[1])
    # An older backup, asked for by name: the run goes back to step 2 and its records then.
    (run / "ir.lmdb" / "data.mdb").write_bytes(b"\0" * 100)
    capsys.readouterr()
    assert main(["status", str(run)]) == 2
    assert _said(capsys.readouterr().err, "holds 100 bytes, less than LMDB's two header pages",
                 "--from-backup step-000003", "2 backup(s)")
    assert main(["resume", str(run), "--from-backup", "step-000009"]) == 2
    assert _said(capsys.readouterr().err, "no backup 'step-000009'; its backups: step-000002, step-000003")
    assert "(step 2," in restore_backup(run, "step-000002")  # what `resume --from-backup` does first
    with Store.open_reader(run) as s:
        assert s.state()["step"] == 2 and len(s.all("A")) == 2


def test_a_full_map_fails_the_step_and_keeps_every_committed_record(run, finished, tmp_path, monkeypatch, capsys):
    # A map no larger than what the store uses now: the first step that needs a new page finds it full.
    monkeypatch.setattr(store_module, "MAP_SIZE", 1)
    assert main(["resume", str(run), "search.max_evaluations=6", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert _said(err, f"{run}: a write to the IR store at step", "failed: its map is full", "TIK_EVO_MAP_SIZE",
                 f"tik-evo resume {run}` continues", "every record committed before it is intact"), err
    rc, lines, _ = _salvage(run, tmp_path, capsys)
    assert rc == 0
    before, after = _immutable(finished[1]), _immutable(lines)
    assert all(after[k] == v for k, v in before.items())
    with Store.open_reader(run) as s:  # the failed step left nothing half-written
        st = s.state()
        for kind in "IOAUD":
            assert [r.id for r in s.all(kind)] == [f"{kind}{n}" for n in range(st["counters"][kind])]


def _mount_tmpfs(path, size: str) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _fill(directory) -> None:
    """Write zeros until the filesystem is full, down to its last byte (unbuffered: nothing is left to flush)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while os.write(fd, b"\0" * size) == size:
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def test_a_full_disk_fails_the_write_and_keeps_every_committed_record(run, finished, tmp_path, capsys):
    fs = tmp_path / "fs"
    if not _mount_tmpfs(fs, "4m"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        small = fs / "run"
        shutil.copytree(run, small, ignore=shutil.ignore_patterns("backups"))
        with Store.open_writer(small) as store:
            _fill(fs)
            with pytest.raises(StoreFull) as e, store.transaction() as txn:
                txn.event("note", "x" * 2_000_000)  # more pages than are free in the file: it must grow
            assert _said(str(e.value), "a write to the IR store at step 3 failed: the disk holding", "is full",
                         "every record committed before it is intact")
            store.verify()
        capsys.readouterr()
        # The CLI: the step fails wherever the disk runs out (store or an audit's files), clearly.
        assert main(["resume", str(small), "search.max_evaluations=5", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert _said(err, "failed: the disk holding", "is full (No space left on device)",
                     f"tik-evo resume {small}` continues", "every record committed before it is intact"), err
        (fs / "filler").unlink()
        rc, lines, _ = _salvage(small, tmp_path, capsys)
        assert rc == 0 and all(_immutable(lines)[k] == v for k, v in _immutable(finished[1]).items())
    finally:
        subprocess.run(["umount", "-l", str(fs)], capture_output=True)
