import json
import subprocess
import sys

import pytest

from tik_evo.records import Implementation
from tik_evo.store import Store, StoreError, StoreLocked

from .helpers import ROOT


def _add(store, n):
    with store.transaction() as t:
        for _ in range(n):
            iid = t.new_id("I")
            t.put(Implementation(iid, t.put_source(f"# {iid}"), [], "joint", "active"))
            t.state["frontier"].append(iid)


def test_transaction_is_all_or_nothing(tmp_path):
    store = Store.create(tmp_path)
    _add(store, 2)
    with pytest.raises(RuntimeError), store.transaction() as t:
        t.put(Implementation(t.new_id("I"), "h", [], "joint", "active"))
        t.state["frontier"].append("I2")
        raise RuntimeError("crash mid-step")
    assert [i.id for i in store.all("I")] == ["I0", "I1"]
    assert store.state()["frontier"] == ["I0", "I1"] and store.state()["counters"]["I"] == 2
    store.close()


def test_second_writer_refused_from_another_process(tmp_path):
    store = Store.create(tmp_path)
    code = ("import sys; from tik_evo.store import Store, StoreLocked\n"
            "try:\n    Store.open_writer(sys.argv[1])\nexcept StoreLocked as e:\n    print('LOCKED', e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 3 and "already being written" in r.stdout and "resume" in r.stdout
    store.close()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr  # lock released with the writer


def test_writer_pid_tells_running_from_interrupted(tmp_path):
    code = ("import sys, time; from tik_evo.store import Store; s = Store.create(sys.argv[1]); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    with Store.open_reader(tmp_path) as reader:
        assert reader.writer_pid() == proc.pid
        proc.kill()
        proc.wait()
        assert reader.writer_pid() is None  # killed: the kernel dropped its lock


def test_writer_waits_out_a_status_probe_of_the_lock(tmp_path):
    # `status` probes the writer's lock by taking it for a moment; a run starting in that moment must not be
    # refused. Here the "probe" holds the lock for 0.1 s: the writer waits and gets it.
    import fcntl
    import os
    import threading

    Store.create(tmp_path).close()
    fd = os.open(tmp_path / "writer.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    threading.Timer(0.1, lambda: os.close(fd)).start()
    with Store.open_writer(tmp_path) as store:
        assert store.writer_pid() == os.getpid()


def test_same_process_second_writer_refused(tmp_path):
    store = Store.create(tmp_path)
    with pytest.raises(StoreLocked):
        Store(tmp_path, writer=True)
    store.close()


def test_reader_in_other_process_sees_consistent_snapshots(tmp_path):
    store = Store.create(tmp_path)
    code = ("import sys, json; from tik_evo.store import Store\n"
            "s = Store.open_reader(sys.argv[1]); snap = s.snapshot()\n"
            "print(json.dumps([len(snap['I']), len(snap['state']['frontier'])]))\n")
    for n in range(3):
        _add(store, 2)
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
        records, frontier = json.loads(r.stdout)
        assert records == frontier == 2 * (n + 1)
    store.close()


def test_reader_errors(tmp_path):
    with pytest.raises(StoreError, match="no IR store"):
        Store.open_reader(tmp_path / "nothing")
    store = Store.create(tmp_path)
    with pytest.raises(StoreError, match="no record I9"):
        store.get("I9")
    with pytest.raises(StoreError, match="not a record id"):
        store.get("X")
    store.close()
