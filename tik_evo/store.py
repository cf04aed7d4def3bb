"""The IR store: one LMDB environment per run directory.

One write transaction per loop step keeps the records and the search state consistent through a kill -9;
readers in other processes (status, the TUI) get LMDB's MVCC snapshots while the run writes. A second
writer on the same run is refused through an exclusive ``flock`` that the kernel drops when a process dies.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb

from tik_evo.records import SCHEMA_VERSION, TABLES, from_dict, to_dict

DB_NAMES = (*TABLES.values(), "source", "state", "meta", "event")
MAP_SIZE = 4 << 30  # virtual; the file grows only as records are written
LOCK_WAIT_S = 0.5  # how long a writer waits for the lock before refusing (outlasts a status probe)


class StoreError(RuntimeError):
    pass


class StoreLocked(StoreError):
    pass


def _key(record_id: str) -> bytes:
    # Zero-padded so LMDB's byte order is creation order.
    return f"{record_id[0]}{int(record_id[1:]):09d}".encode()


def _id(key: bytes) -> str:
    k = key.decode()
    return f"{k[0]}{int(k[1:])}"


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def initial_state() -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION, "root": None, "best": None, "frontier": [], "archive": [],
        "pending_opportunities": [], "kappa": 0, "step": 0, "evaluations": 0, "duplicates": 0,
        "failures_by_kind": {}, "budgets": {"wall_s": 0.0, "tokens": 0, "usd": 0.0},
        "counters": {k: 0 for k in TABLES}, "finished": None, "root_latencies": {}, "limits": {},
        "weights": {}, "best_objective": None, "root_objective": None, "sources": {},
        "engine_overhead_s": [], "history": [],
    }


class Txn:
    """A write transaction: every put lands together or not at all."""

    def __init__(self, store: Store, txn: lmdb.Transaction):
        self._s, self._t = store, txn
        self.state: dict[str, Any] = store._read_state(txn)

    def new_id(self, kind: str) -> str:
        n = self.state["counters"][kind]
        self.state["counters"][kind] = n + 1
        return f"{kind}{n}"

    def put(self, record: Any) -> None:
        data = to_dict(record)
        table = TABLES[data["id"][0]]
        self._t.put(_key(data["id"]), json.dumps(data).encode(), db=self._s._dbs[table])

    def get(self, record_id: str) -> Any:
        raw = self._t.get(_key(record_id), db=self._s._dbs[TABLES[record_id[0]]])
        return from_dict(json.loads(raw)) if raw else None

    def put_source(self, text: str) -> str:
        h = source_hash(text)
        self._t.put(h.encode(), text.encode(), db=self._s._dbs["source"], overwrite=False)
        return h

    def event(self, kind: str, text: str, **data: Any) -> None:
        db = self._s._dbs["event"]
        n = self.state.setdefault("events", 0)
        self.state["events"] = n + 1
        payload = {"n": n, "t": time.time(), "step": self.state["step"], "kind": kind, "text": text, **data}
        self._t.put(f"{n:09d}".encode(), json.dumps(payload).encode(), db=db)


def runs_under(directory: Path) -> list[Path]:
    """The run directories directly inside `directory` (a sweep's), sorted by name."""
    try:
        return sorted(d for d in Path(directory).iterdir() if (d / "ir.lmdb").is_dir())
    except OSError:
        return []


class Store:
    """Open with :meth:`create`, :meth:`open_writer` or :meth:`open_reader`."""

    def __init__(self, run_dir: Path, writer: bool):
        self.run_dir = Path(run_dir).resolve()
        self.writer = writer
        self._lock_fd: int | None = None
        path = self.run_dir / "ir.lmdb"
        if writer:
            self._acquire_lock()
        elif not path.exists():
            hint = ("it holds a sweep's runs: `tik-evo compare` and `tik-evo tui` take the sweep directory"
                    if runs_under(self.run_dir)
                    else "is this a run directory?")
            raise StoreError(f"{self.run_dir}: no IR store here (expected {path}); {hint}")
        try:
            self._env = lmdb.open(str(path), map_size=MAP_SIZE, max_dbs=len(DB_NAMES) + 1,
                                  readonly=not writer, lock=True, subdir=True)
        except lmdb.Error as e:
            self._release_lock()
            raise StoreError(f"{path}: cannot open the IR store: {e}") from e
        self._dbs = self._create_dbs() if writer else self._open_read_dbs()
        self._check_schema()

    # -- opening -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path) -> Store:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        store = cls(run_dir, writer=True)
        with store._env.begin(write=True) as t:
            if t.get(b"state", db=store._dbs["state"]) is None:
                t.put(b"schema", str(SCHEMA_VERSION).encode(), db=store._dbs["meta"])
                t.put(b"state", json.dumps(initial_state()).encode(), db=store._dbs["state"])
        return store

    @classmethod
    def open_writer(cls, run_dir: Path) -> Store:
        if not (Path(run_dir) / "ir.lmdb").exists():
            raise StoreError(f"{run_dir}: no IR store here; start a run with `tik-evo run CAMPAIGN`")
        return cls(run_dir, writer=True)

    @classmethod
    def open_reader(cls, run_dir: Path) -> Store:
        return cls(run_dir, writer=False)

    def _create_dbs(self) -> dict[str, Any]:
        # One transaction: a reader sees all the tables or none of them (then: "missing table", a run being made).
        with self._env.begin(write=True) as t:
            return {name: self._env.open_db(name.encode(), txn=t, create=True) for name in DB_NAMES}

    def _open_read_dbs(self) -> dict[str, Any]:
        dbs = {}
        for name in DB_NAMES:
            try:
                dbs[name] = self._env.open_db(name.encode(), create=False)
            except lmdb.NotFoundError as e:
                raise StoreError(f"{self.run_dir}: IR store is missing table {name!r}") from e
        return dbs

    def _check_schema(self) -> None:
        with self._env.begin() as t:
            raw = t.get(b"schema", db=self._dbs["meta"])
        if raw is not None and int(raw) != SCHEMA_VERSION:
            raise StoreError(f"{self.run_dir}: store schema {int(raw)} but this tik-evo reads schema "
                             f"{SCHEMA_VERSION}; use the matching tik-evo version")

    def _acquire_lock(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "writer.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # A reader's `writer_pid` probe holds the lock for microseconds: wait that out, not a real writer.
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreLocked(f"{self.run_dir} is already being written by another tik-evo process "
                              f"(pid {holder}); wait for it to finish or stop it, then `tik-evo resume "
                              f"{self.run_dir}`. Read-only commands (status, show, tui) work meanwhile.") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def writer_pid(self) -> int | None:
        """The pid of the process writing this run now, or None (finished, interrupted or killed)."""
        path = self.run_dir / "writer.lock"
        if self._lock_fd is not None:
            return os.getpid()
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None  # nobody holds it
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        self._env.close()
        self._release_lock()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[Txn]:
        if not self.writer:
            raise StoreError("store opened read-only")
        with self._env.begin(write=True) as t:
            txn = Txn(self, t)
            yield txn
            t.put(b"state", json.dumps(txn.state).encode(), db=self._dbs["state"])

    # -- reading (each call is one consistent snapshot) -------------------------------------------------------
    def _read_state(self, t: lmdb.Transaction) -> dict[str, Any]:
        raw = t.get(b"state", db=self._dbs["state"])
        if raw is None:
            raise StoreError(f"{self.run_dir}: IR store has no state record")
        return json.loads(raw)

    def state(self) -> dict[str, Any]:
        with self._env.begin() as t:
            return self._read_state(t)

    def get(self, record_id: str) -> Any:
        try:
            table = TABLES[record_id[0]]
            key = _key(record_id)
        except (KeyError, ValueError, IndexError):
            raise StoreError(f"{record_id!r} is not a record id (I…, O…, A…, U…, D…)") from None
        with self._env.begin() as t:
            raw = t.get(key, db=self._dbs[table])
        if raw is None:
            raise StoreError(f"{self.run_dir}: no record {record_id}")
        return from_dict(json.loads(raw))

    def all(self, kind: str) -> list[Any]:
        with self._env.begin() as t:
            return [from_dict(json.loads(v)) for _, v in t.cursor(db=self._dbs[TABLES[kind]])]

    def snapshot(self) -> dict[str, Any]:
        """State and every record from one read transaction (what a TUI refresh needs)."""
        with self._env.begin() as t:
            out: dict[str, Any] = {"state": self._read_state(t)}
            for kind, table in TABLES.items():
                out[kind] = [from_dict(json.loads(v)) for _, v in t.cursor(db=self._dbs[table])]
            return out

    def source(self, h: str) -> str:
        with self._env.begin() as t:
            raw = t.get(h.encode(), db=self._dbs["source"])
        if raw is None:
            raise StoreError(f"{self.run_dir}: no source {h}")
        return raw.decode()

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        with self._env.begin() as t:
            cur = t.cursor(db=self._dbs["event"])
            if not cur.set_range(f"{since:09d}".encode()):
                return []
            return [json.loads(v) for _, v in cur]


def best_of(run_dir: Path, family: str | None = None) -> tuple[str, str, str]:
    """(family, id, source) of the best implementation a run directory holds (for benchmarks that time a run's
    best); with `family`, the run must be of that family."""
    with Store.open_reader(Path(run_dir)) as store:
        state = store.state()
        if family is not None and state.get("family") != family:
            raise StoreError(f"{run_dir}: a run of family {state.get('family')!r}, not {family!r}")
        if state.get("best") is None:
            raise StoreError(f"{run_dir}: no best implementation yet (the root audit has not finished)")
        impl = store.get(state["best"])
        return state.get("family"), impl.id, store.source(impl.source_hash)
