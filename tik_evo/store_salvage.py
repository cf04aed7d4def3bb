"""Reading a damaged IR store value by value (salvage), and the store's backups: make, verify, restore.

A damaged page in LMDB breaks a cursor walk at that page, and LMDB marks the read transaction failed. So the
walk here takes what it can, then looks every key the state says should exist up again, each in a fresh
transaction: a damaged leaf costs only its own records.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from tik_evo.records import TABLES, to_dict
from tik_evo.store import DB_NAMES, Store, _key
from tik_evo.store_integrity import (
    BACKUPS,
    INTEGRITY,
    MIN_SIZE,
    Damaged,
    StoreCorrupt,
    StoreError,
    StoreLocked,
    decode_json,
    decode_record,
    decode_source,
    key_name,
    list_backups,
    size_problem,
)

KEEP = 2  # backups kept: the newest may have been made from a store already damaged in a way no check sees
PROBE_PAST = 64  # without a readable state, ids are looked up this far past the last one found


@dataclass
class Scan:
    state: dict[str, Any] | None = None  # the state record as stored: salvage takes what it holds
    records: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in TABLES})
    sources: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    damaged: list[tuple[str, bytes | None, str]] = field(default_factory=list)  # (table, key or None, problem)

    def damaged_names(self) -> list[str]:
        return [f"{key_name(t, k)}: {why}" for t, k, why in self.damaged]


def _probe(env: lmdb.Environment, db: Any, key: bytes, limit: int) -> tuple[bytes | None, str | None]:
    try:
        with env.begin(buffers=True) as t:
            raw = t.get(key, db=db)
            if raw is None:
                return None, None
            if len(raw) > limit:
                return None, f"its stored length ({len(raw)} bytes) is larger than the file"
            return bytes(raw), None
    except lmdb.Error as e:
        return None, f"it cannot be read ({e})"


def _walk(env: lmdb.Environment, db: Any, limit: int) -> tuple[list[tuple[bytes, bytes | None, str | None]],
                                                                 bytes | None, str | None]:
    """(key, raw, problem) of every value a cursor reaches, the last key, and why the walk stopped early."""
    items: list[tuple[bytes, bytes | None, str | None]] = []
    key = None
    try:
        with env.begin(buffers=True) as t:
            for k, v in t.cursor(db=db):
                key = bytes(k)
                too_long = len(v) > limit
                items.append((key, None if too_long else bytes(v),
                              f"its stored length ({len(v)} bytes) is larger than the file" if too_long else None))
    except lmdb.Error as e:
        return items, key, str(e)
    return items, key, None


Expected = Callable[[set[bytes]], Iterator[tuple[bytes, bool]]]  # keys not walked to, and whether they must exist


def _table(env: lmdb.Environment, db: Any, table: str, limit: int, decode: Callable[[bytes, bytes], Any],
           expected: Expected, out: Scan) -> list[tuple[bytes, Any]]:
    items, last, broken = _walk(env, db, limit)
    found: list[tuple[bytes, Any]] = []

    def take(key: bytes, raw: bytes | None, problem: str | None) -> None:
        if raw is not None and problem is None:
            try:
                found.append((key, decode(key, raw)))
                return
            except Damaged as e:
                problem = str(e)
        if problem is not None:
            out.damaged.append((table, key, problem))

    for item in items:
        take(*item)
    if broken is not None:
        after = f"after {key_name(table, last)}" if last else "from its first record"
        out.damaged.append((table, None, f"it cannot be walked {after} ({broken}); the keys it should hold were "
                                         f"looked up one by one"))
        for key, must_exist in expected({key for key, _, _ in items}):
            raw, problem = _probe(env, db, key, limit)
            if raw is None and problem is None:
                problem = "not found (the table's index is damaged)"
            if must_exist or raw is not None:  # a key that may never have existed is not named damaged
                take(key, raw, problem)
    return found


def _ids(kind: str, count: int | None, seen: set[bytes]) -> Iterator[tuple[bytes, bool]]:
    """The ids a table should hold: 0..count-1, or without a state every id up to the last found, and a few
    past it that may exist."""
    numbers = [k[1:] for k in seen if k[:1] == kind.encode() and k[1:].isdigit()]  # a damaged key is no id
    top = max((int(n) for n in numbers), default=-1)
    stop = count if count is not None else top + 1 + PROBE_PAST
    for n in range(stop):
        key = _key(f"{kind}{n}")
        if key not in seen:
            yield key, count is not None or n <= top


def scan(env: lmdb.Environment, dbs: dict[str, Any] | None, strict: bool | None, data_path: Path) -> Scan:
    """Every value of the store read back and checked; what is damaged is listed, not raised."""
    out = Scan()
    limit = os.path.getsize(data_path)
    if dbs is None:
        dbs = {}
        for name in DB_NAMES:
            try:
                dbs[name] = env.open_db(name.encode(), create=False)
            except lmdb.Error as e:
                out.damaged.append((name, None, f"it cannot be opened ({e})"))
    if strict is None and "meta" in dbs:
        strict = _probe(env, dbs["meta"], b"integrity", limit)[0] == INTEGRITY
    if "state" in dbs:
        raw, problem = _probe(env, dbs["state"], b"state", limit)
        try:
            out.state = decode_json(raw, bool(strict)) if raw is not None else None
        except Damaged as e:
            problem = str(e)
        if problem or raw is None:
            out.damaged.append(("state", b"state", problem or "not found"))
    st = out.state or {}
    for kind, table in TABLES.items():
        if table not in dbs:
            continue

        def record(key: bytes, raw: bytes) -> Any:
            return decode_record(raw, key, bool(strict))

        count = st.get("counters", {}).get(kind) if out.state else None
        found = _table(env, dbs[table], table, limit, record,
                       lambda seen, kind=kind, count=count: _ids(kind, count, seen), out)
        out.records[kind] = [r for _, r in found]
    if "source" in dbs:
        wanted = {h.encode() for h in st.get("sources", {})} | {i.source_hash.encode() for i in out.records["I"]}
        found = _table(env, dbs["source"], "source", limit, lambda key, raw: decode_source(raw, key),
                       lambda seen: ((k, True) for k in sorted(wanted - seen)), out)
        out.sources = {k.decode(): text for k, text in found}
    if "event" in dbs:
        n_events = st.get("events") if out.state else None
        def events(seen: set[bytes]) -> Iterator[tuple[bytes, bool]]:
            keys = (f"{n:09d}".encode() for n in range(n_events or 0))
            return ((k, True) for k in keys if k not in seen)

        found = _table(env, dbs["event"], "event", limit, lambda key, raw: decode_json(raw, bool(strict)), events,
                       out)
        out.events = [e for _, e in found]
    return out


@contextmanager
def _open_copy(env_dir: Path) -> Iterator[tuple[lmdb.Environment, Path, str | None]]:
    """The store read-only, without its lock file (a damaged store's run is not writing it). A truncated
    data.mdb is read from a private copy padded with empty pages: the pages past its end read as damaged
    instead of crashing the process."""
    data = env_dir / "data.mdb"
    if not data.is_file():
        raise StoreError(f"{env_dir}: no IR store here (no data.mdb)")
    if (size := data.stat().st_size) < MIN_SIZE:
        raise StoreCorrupt(f"{data} holds {size} bytes, less than LMDB's two header pages: nothing in it can be "
                           f"read; restore a backup (see docs/ir.md)")
    opts = {"readonly": True, "lock": False, "max_dbs": len(DB_NAMES) + 1, "subdir": True}
    try:
        env = lmdb.open(str(env_dir), **opts)
    except lmdb.Error as e:
        raise StoreCorrupt(f"LMDB cannot read {data}'s header ({e}): nothing in it can be read; restore a "
                           f"backup (see docs/ir.md)") from None
    problem = size_problem(data, env)
    if problem is None:
        try:
            yield env, data, None
        finally:
            env.close()
        return
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    env.close()
    with tempfile.TemporaryDirectory(prefix="tik_evo_salvage_") as tmp:
        shutil.copyfile(data, Path(tmp) / "data.mdb")
        os.truncate(Path(tmp) / "data.mdb", need)
        env = lmdb.open(tmp, **opts)
        try:
            yield env, Path(tmp) / "data.mdb", problem
        finally:
            env.close()


def check(env_dir: Path) -> tuple[Scan, str | None]:
    with _open_copy(env_dir) as (env, data, problem):
        return scan(env, None, None, data), problem


def salvage(path: Path) -> tuple[list[str], list[str]]:
    """Every intact record of the store at `path` (a run directory, or a directory holding a data.mdb: a
    backup, a store set aside) as `tik-evo export` lines, and what is damaged. Damaged values get
    `{"type": "damaged", ...}` lines at the end."""
    path = Path(path)
    env_dir = path if (path / "data.mdb").is_file() else path / "ir.lmdb"
    found, truncated = check(env_dir)
    lines = [json.dumps({"type": "state", **found.state})] if found.state else []
    for kind, table in TABLES.items():
        for r in found.records[kind]:
            d = to_dict(r)
            if kind == "I":
                d["source"] = found.sources.get(r.source_hash)
            lines.append(json.dumps({"type": table, **d}))
    lines += [json.dumps({"type": "event", **e}) for e in found.events]
    damaged = ([truncated] if truncated else []) + found.damaged_names()
    if truncated:
        lines.append(json.dumps({"type": "damaged", "table": None, "key": None, "problem": truncated}))
    for table, key, why in found.damaged:
        name = key_name(table, key).split(" ", 1)[-1] if key is not None and table != "state" else None
        lines.append(json.dumps({"type": "damaged", "table": table, "key": name, "problem": why}))
    return lines, damaged


def make_backup(store: Store) -> Path:
    """Copy the store compacted into RUN/backups/step-NNNNNN, read every value of the copy back, and only then
    let it replace the oldest backup."""
    root = store.run_dir / BACKUPS
    root.mkdir(exist_ok=True)
    step = store.state().step
    tmp = root / f".partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        store._env.copy(str(tmp), compact=True)
        found, problem = check(tmp)
        if problem or found.damaged:
            raise StoreCorrupt(f"the copy did not read back intact ({problem or found.damaged_names()[0]})")
        final = root / f"step-{step:06d}"
        if final.exists():  # the run finished at a step that was just backed up: the newer copy wins
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_backups(store.run_dir)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def restore_backup(run_dir: Path, name: str) -> str:
    """Put backup `name` (or `latest`) in place of the run's store, the store it replaces moved aside."""
    run_dir = Path(run_dir)
    backups = list_backups(run_dir)
    if not backups:
        raise StoreError(f"{run_dir}: no backups in {run_dir / BACKUPS} to restore")
    chosen = backups[-1] if name == "latest" else next((b for b in backups if b.name == name), None)
    if chosen is None:
        raise StoreError(f"{run_dir}: no backup {name!r}; its backups: {', '.join(b.name for b in backups)}")
    found, problem = check(chosen)
    if problem or found.damaged:
        others = ", ".join(b.name for b in backups if b != chosen) or "none"
        raise StoreCorrupt(f"backup {chosen} is damaged too ({problem or found.damaged_names()[0]}); other "
                           f"backups: {others}")
    fd = os.open(run_dir / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreLocked(f"{run_dir} is being written by another tik-evo process; stop it before restoring "
                              f"a backup") from None
        store_dir, aside = run_dir / "ir.lmdb", None
        if store_dir.exists():
            aside = run_dir / f"ir.lmdb.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            while aside.exists():
                aside = aside.with_name(aside.name + "+")
            store_dir.rename(aside)
        store_dir.mkdir()
        shutil.copyfile(chosen / "data.mdb", store_dir / "data.mdb")
    finally:
        os.close(fd)
    kept = (f"; the store it replaces is in {aside} (`tik-evo export {aside} --salvage` reads what is intact in "
            f"it)") if aside else ""
    return (f"restored {chosen} (step {found.state['step']}, {len(found.records['I'])} implementations, "
            f"{found.state['evaluations']} evaluations) as {store_dir}{kept}")
