"""The IR store: one LMDB environment per run directory.

One write transaction per loop step keeps the records and the search state (a ``RunState``) consistent through
a kill -9; readers in other processes (status, the TUI) get LMDB's MVCC snapshots while the run writes. A second
writer on the same run is refused (``store_lock``). Every value is checksummed and the file's size checked on
open (``store_integrity``); the writer keeps compacted backups of the store in RUN/backups (``store_salvage``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb

from tik_evo import store_integrity as integrity
from tik_evo import store_lock
from tik_evo.records import SCHEMA_VERSION, TABLES, to_dict
from tik_evo.run_state import RunState
from tik_evo.store_integrity import Damaged, StoreCorrupt, StoreError, StoreFull, StoreLocked, corrupt, key_name, seal

__all__ = ["Store", "StoreCorrupt", "StoreError", "StoreFull", "StoreLocked", "Txn", "best_of", "source_hash"]

DB_NAMES = (*TABLES.values(), "source", "state", "meta", "event")
# Virtual; the file grows only as records are written. Tests shrink it to fill the map.
MAP_SIZE = int(os.environ.get("TIK_EVO_MAP_SIZE") or 4 << 30)
READABLE_SCHEMAS = (1, SCHEMA_VERSION)  # schema 1: the same records, without checksums
BACKUP_EVERY = 10  # steps between backups of the store (and one when the run finishes)


def _key(record_id: str) -> bytes:
    # Zero-padded so LMDB's byte order is creation order.
    return f"{record_id[0]}{int(record_id[1:]):09d}".encode()


def _id(key: bytes) -> str:
    k = key.decode()
    return f"{k[0]}{int(k[1:])}"


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Txn:
    """A write transaction: every put lands together or not at all."""

    def __init__(self, store: Store, txn: lmdb.Transaction):
        self._s, self._t = store, txn
        self.state: RunState = store._read_state(txn)
        self.began = (self.state.step, bool(self.state.finished))

    def new_id(self, kind: str) -> str:
        n = self.state.counters[kind]
        self.state.counters[kind] = n + 1
        return f"{kind}{n}"

    def put(self, record: Any) -> None:
        data = to_dict(record)
        table = TABLES[data["id"][0]]
        self._t.put(_key(data["id"]), seal(json.dumps(data).encode()), db=self._s._dbs[table])

    def get(self, record_id: str) -> Any:
        table, key = TABLES[record_id[0]], _key(record_id)
        raw = self._t.get(key, db=self._s._dbs[table])
        return self._s._decoded(table, key, raw) if raw is not None else None

    def put_source(self, text: str) -> str:
        h = source_hash(text)
        self._t.put(h.encode(), text.encode(), db=self._s._dbs["source"], overwrite=False)
        return h

    def event(self, kind: str, text: str, **data: Any) -> None:
        db = self._s._dbs["event"]
        n = self.state.events
        self.state.events = n + 1
        payload = {"n": n, "t": time.time(), "step": self.state.step, "kind": kind, "text": text, **data}
        self._t.put(f"{n:09d}".encode(), seal(json.dumps(payload).encode()), db=db)


def runs_under(directory: Path) -> list[Path]:
    """The run directories directly inside `directory` (a sweep's), sorted by name."""
    try:
        return sorted(d for d in Path(directory).iterdir() if (d / "ir.lmdb").is_dir())
    except OSError:
        return []


class Store:
    """Open with :meth:`create`, :meth:`open_writer` or :meth:`open_reader`."""

    def __init__(self, run_dir: Path, writer: bool, map_size: int | None = None):
        self.run_dir = Path(run_dir).resolve()
        self.writer = writer
        self.map_size = map_size or MAP_SIZE
        self.strict = False  # True once the meta table says every value is sealed
        self._lock_fd: int | None = None
        path = self.run_dir / "ir.lmdb"
        self._data = path / "data.mdb"
        if writer:
            self._acquire_lock()
        elif not path.exists():
            hint = ("it holds a sweep's runs: `tik-evo compare` and `tik-evo tui` take the sweep directory"
                    if runs_under(self.run_dir)
                    else "is this a run directory?")
            raise StoreError(f"{self.run_dir}: no IR store here (expected {path}); {hint}")
        try:
            self._env = integrity.open_env(self.run_dir, path, writer, self.map_size, len(DB_NAMES) + 1)
        except BaseException:
            self._release_lock()
            raise
        try:
            self._dbs = self._create_dbs() if writer else self._open_read_dbs()
            self._check_schema()
        except BaseException:
            self.close()
            raise

    # -- opening -------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, map_size: int | None = None) -> Store:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        store = cls(run_dir, writer=True, map_size=map_size)
        with store._writing(0), store._env.begin(write=True) as t:
            if t.get(b"state", db=store._dbs["state"]) is None:
                t.put(b"schema", str(SCHEMA_VERSION).encode(), db=store._dbs["meta"])
                t.put(b"integrity", integrity.INTEGRITY, db=store._dbs["meta"])
                t.put(b"state", seal(json.dumps(RunState().to_dict()).encode()), db=store._dbs["state"])
                store.strict = True
        return store

    @classmethod
    def open_writer(cls, run_dir: Path, map_size: int | None = None) -> Store:
        """The store to continue a run in, after every record in it was read back intact (writing on top of a
        damaged store would bury the damage under new steps, and into the backups)."""
        if not (Path(run_dir) / "ir.lmdb").exists():
            raise StoreError(f"{run_dir}: no IR store here; start a run with `tik-evo run CAMPAIGN`")
        store = cls(run_dir, writer=True, map_size=map_size)
        try:
            store.verify()
            if store.schema != SCHEMA_VERSION:  # it gets sealed values, which a schema-1 reader can't read
                with store._writing(store.state().step), store._env.begin(write=True) as t:
                    t.put(b"schema", str(SCHEMA_VERSION).encode(), db=store._dbs["meta"])
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def open_reader(cls, run_dir: Path) -> Store:
        return cls(run_dir, writer=False)

    def _create_dbs(self) -> dict[str, Any]:
        # One transaction: a reader sees all the tables or none of them (then: "missing table", a run being made).
        with self._writing(None), self._reading("meta"), self._env.begin(write=True) as t:
            return {name: self._env.open_db(name.encode(), txn=t, create=True) for name in DB_NAMES}

    def _open_read_dbs(self) -> dict[str, Any]:
        dbs = {}
        for name in DB_NAMES:
            try:
                dbs[name] = self._env.open_db(name.encode(), create=False)
            except lmdb.NotFoundError as e:
                raise StoreError(f"{self.run_dir}: IR store is missing table {name!r}") from e
            except lmdb.Error as e:
                raise corrupt(self.run_dir, f"the {name} table cannot be opened ({e})") from None
        return dbs

    def _check_schema(self) -> None:
        with self._env.begin(buffers=True) as t:
            raw = self._get(t, "meta", b"schema")
            self.strict = self._get(t, "meta", b"integrity") == integrity.INTEGRITY
        try:
            schema = None if raw is None else int(raw)
        except ValueError:
            raise corrupt(self.run_dir, f"meta schema is {raw[:40]!r}, not a schema number") from None
        self.schema = schema
        if schema is not None and schema not in READABLE_SCHEMAS:
            raise StoreError(f"{self.run_dir}: store schema {schema} but this tik-evo reads schemas "
                             f"{', '.join(map(str, READABLE_SCHEMAS))}; use the matching tik-evo version")

    def _acquire_lock(self) -> None:
        self._lock_fd = store_lock.acquire(self.run_dir)

    def writer_pid(self) -> int | None:
        """The pid of the process writing this run now, or None (finished, interrupted or killed)."""
        return os.getpid() if self._lock_fd is not None else store_lock.writer_pid(self.run_dir)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            store_lock.release(self._lock_fd)
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
        txn: Txn | None = None
        with self._writing(lambda: txn and txn.state.step), self._env.begin(write=True, buffers=True) as t:
            txn = Txn(self, t)
            yield txn
            t.put(b"state", seal(json.dumps(txn.state.to_dict()).encode()), db=self._dbs["state"])
        (step0, finished0), step, finished = txn.began, txn.state.step, bool(txn.state.finished)
        if step // BACKUP_EVERY > step0 // BACKUP_EVERY or (finished and not finished0):
            self.backup()

    @contextmanager
    def _writing(self, step: Any) -> Iterator[None]:
        """A full disk or map, or a damaged page met while writing (in the free-page list, which no read
        visits), aborts the write transaction (LMDB rolls it back) and says so."""
        try:
            yield
        except (lmdb.Error, OSError) as e:
            at = step() if callable(step) else step
            if isinstance(e, integrity.DAMAGE):
                raise corrupt(self.run_dir, f"a write{'' if at is None else f' at step {at}'} met a damaged page "
                                            f"({e})") from None
            if not integrity.is_full(e):
                raise
            raise integrity.full(self.run_dir, e, at, self._env.info()["map_size"]) from None

    def backup(self) -> Path | None:
        """A compacted, verified copy of the store in RUN/backups (the newest two are kept). A backup that
        cannot be made is a warning: the run's records are safe in the store itself."""
        from tik_evo.store_salvage import make_backup

        try:
            return make_backup(self)
        except (StoreError, lmdb.Error, OSError) as e:
            print(f"warning: {self.run_dir}: no backup made this time: {e}", file=sys.stderr)
            return None

    # -- reading (each call is one consistent snapshot) -------------------------------------------------------
    @contextmanager
    def _reading(self, table: str, key: bytes | None = None) -> Iterator[None]:
        try:
            yield
        except lmdb.Error as e:  # a damaged page: LMDB refuses to follow it
            if integrity.is_full(e):
                raise
            raise corrupt(self.run_dir, f"{key_name(table, key)} cannot be read ({e})") from None

    def _limit(self) -> int | None:
        # The longest a committed value can be (a damaged length must not read past the file); values this
        # process wrote in its own transaction are not in the file yet.
        return None if self.writer else os.path.getsize(self._data)

    def _decoded(self, table: str, key: bytes, raw: Any) -> Any:
        """A record, a source's text, or the state's or an event's dict; StoreCorrupt naming it if damaged."""
        try:
            if table == "source":
                return integrity.decode_source(raw, key)
            if table in TABLES.values():
                return integrity.decode_record(raw, key, self.strict)
            return integrity.decode_json(raw, self.strict)
        except Damaged as e:
            raise corrupt(self.run_dir, f"{key_name(table, key)}: {e}") from None

    def _copy(self, table: str, key: bytes, raw: Any, limit: int | None) -> bytes:
        """The bytes of a value the map holds; `raw` is a buffer: its length is checked before it is read."""
        if limit is not None and len(raw) > limit:
            raise corrupt(self.run_dir, f"{key_name(table, key)}: its stored length ({len(raw)} bytes) "
                                        f"is larger than the file")
        return bytes(raw)

    def _scan(self, t: lmdb.Transaction, table: str, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) in key order, from `start`; a damaged page names the last key read before it."""
        key, limit = None, self._limit()
        try:
            cur = t.cursor(db=self._dbs[table])
            if start is not None and not cur.set_range(start):
                return
            for k, v in cur.iternext():
                key = bytes(k)
                yield key, self._copy(table, key, v, limit)
        except lmdb.Error as e:
            after = f"after {key_name(table, key)}" if key else "from its first record"
            raise corrupt(self.run_dir, f"the {table} table cannot be read {after} ({e})") from None

    def _get(self, t: lmdb.Transaction, table: str, key: bytes) -> bytes | None:
        with self._reading(table, key):
            raw = t.get(key, db=self._dbs[table])
            return None if raw is None else self._copy(table, key, raw, self._limit())

    def _read_state(self, t: lmdb.Transaction) -> RunState:
        raw = self._get(t, "state", b"state")
        if raw is None:
            raise StoreError(f"{self.run_dir}: IR store has no state record")
        return RunState.from_dict(self._decoded("state", b"state", raw))

    def state(self) -> RunState:
        with self._env.begin(buffers=True) as t:
            return self._read_state(t)

    def get(self, record_id: str) -> Any:
        try:
            table = TABLES[record_id[0]]
            key = _key(record_id)
        except (KeyError, ValueError, IndexError):
            raise StoreError(f"{record_id!r} is not a record id (I…, O…, A…, U…, D…)") from None
        with self._env.begin(buffers=True) as t:
            raw = self._get(t, table, key)
        if raw is None:
            raise StoreError(f"{self.run_dir}: no record {record_id}")
        return self._decoded(table, key, raw)

    def all(self, kind: str) -> list[Any]:
        table = TABLES[kind]
        with self._env.begin(buffers=True) as t:
            return [self._decoded(table, k, v) for k, v in self._scan(t, table)]

    def snapshot(self) -> dict[str, Any]:
        """State and every record from one read transaction (what a TUI refresh needs)."""
        with self._env.begin(buffers=True) as t:
            out: dict[str, Any] = {"state": self._read_state(t)}
            for kind, table in TABLES.items():
                out[kind] = [self._decoded(table, k, v) for k, v in self._scan(t, table)]
            return out

    def source(self, h: str) -> str:
        with self._env.begin(buffers=True) as t:
            raw = self._get(t, "source", h.encode())
        if raw is None:
            raise StoreError(f"{self.run_dir}: no source {h}")
        return self._decoded("source", h.encode(), raw)

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        with self._env.begin(buffers=True) as t:
            return [self._decoded("event", k, v) for k, v in self._scan(t, "event", f"{since:09d}".encode())]

    def verify(self) -> None:
        """Read every value back; StoreCorrupt naming the damaged ones if any."""
        from tik_evo.store_salvage import scan

        damaged = [f"{key_name(t, k)}: {why}" for t, k, why in
                   scan(self._env, self._dbs, self.strict, self._data).damaged]
        if len(damaged) == 1:
            raise corrupt(self.run_dir, damaged[0])
        if damaged:
            more = f" (and {len(damaged) - 5} more)" if len(damaged) > 5 else ""
            raise corrupt(self.run_dir, f"{len(damaged)} damaged values: {'; '.join(damaged[:5])}{more}")


def best_of(run_dir: Path, family: str | None = None) -> tuple[str, str, str]:
    """(family, id, source) of the best implementation a run directory holds (for benchmarks that time a run's
    best); with `family`, the run must be of that family."""
    with Store.open_reader(Path(run_dir)) as store:
        state = store.state()
        if family is not None and state.family != family:
            raise StoreError(f"{run_dir}: a run of family {state.family!r}, not {family!r}")
        if state.best is None:
            raise StoreError(f"{run_dir}: no best implementation yet (the root audit has not finished)")
        impl = store.get(state.best)
        return state.family, impl.id, store.source(impl.source_hash)
