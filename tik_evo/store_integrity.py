"""Integrity of the IR store: checksummed values, a size check before LMDB touches the map, and the wording
of every "damaged store" error (what is wrong, how to salvage, which backup restores it).

LMDB trusts its file: a bit flipped in a value comes back as garbage, and a page past the end of a truncated
`data.mdb` is a SIGBUS in the middle of a read. So every JSON value carries a digest of its bytes, sources are
checked against the hash that is their key, and the file's size is compared with what LMDB's meta page says
the store uses before the first page is read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import lmdb

from tik_evo.records import TABLES, from_dict

# 0xff never begins UTF-8, so a sealed value cannot be mistaken for the bare JSON a schema-1 store holds.
TAG = b"\xff\x01"
DIGEST = 8
INTEGRITY = b"blake2b-8"  # the meta flag of a store that holds only sealed values
MIN_SIZE = 2 * 4096  # LMDB's two meta pages at the smallest page size
BACKUPS = "backups"
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class StoreError(RuntimeError):
    pass


class StoreLocked(StoreError):
    pass


class StoreCorrupt(StoreError):
    """A damaged store: the message names what is damaged and how to get the records back."""


class StoreFull(StoreError):
    """A write that found the disk or the map full; its transaction was rolled back."""


class Damaged(ValueError):
    """One value that is not what was written (turned into a StoreCorrupt naming its table and key)."""


def key_name(table: str, key: bytes | None) -> str:
    """How an error names a key: `implementation I3`, `event 12`, `source 3fa2…`."""
    if key is None or table == "state":
        return f"the {table} table" if key is None else "the state record"
    try:
        k = key.decode()
        if table in TABLES.values():
            return f"{table} {k[0]}{int(k[1:])}"
        return f"{table} {int(k) if table == 'event' else k}"
    except (UnicodeDecodeError, ValueError, IndexError):
        return f"{table} key {key.hex()}"


def seal(payload: bytes) -> bytes:
    return TAG + hashlib.blake2b(payload, digest_size=DIGEST).digest() + payload


def unseal(raw: Any, strict: bool) -> bytes:
    """The payload of a stored value (`strict`: the store holds only sealed values)."""
    raw = bytes(raw)
    if raw[:len(TAG)] == TAG:
        body, digest = raw[len(TAG) + DIGEST:], raw[len(TAG):len(TAG) + DIGEST]
        if hashlib.blake2b(body, digest_size=DIGEST).digest() != digest:
            raise Damaged("its checksum does not match its bytes")
        return body
    if strict or raw[:1] == b"\xff":
        raise Damaged("it has no valid checksum header")
    return raw


def decode_json(raw: Any, strict: bool) -> dict[str, Any]:
    body = unseal(raw, strict)
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Damaged("it is not valid UTF-8") from None
    except ValueError as e:
        raise Damaged(f"it is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise Damaged("it is not a JSON object")
    return data


def decode_record(raw: Any, key: bytes, strict: bool) -> Any:
    data = decode_json(raw, strict)
    k = key.decode(errors="replace")
    if data.get("id") != f"{k[:1]}{k[1:].lstrip('0') or '0'}":
        raise Damaged(f"it holds record {data.get('id')!r}")
    try:
        return from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise Damaged(f"it is not a valid record ({e})") from None


def decode_source(raw: Any, key: bytes) -> str:
    """A source's key is the hash of its text: that is its checksum, in every schema."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise Damaged("it is not valid UTF-8") from None
    if hashlib.sha256(text.encode()).hexdigest()[:16].encode() != key:
        raise Damaged("its text does not match its hash")
    return text


def open_env(run_dir: Path, path: Path, writer: bool, map_size: int, max_dbs: int) -> Any:
    """LMDB's environment at `path`, once its data file is known to be as long as LMDB's header says."""
    data = path / "data.mdb"
    # An empty or headerless data.mdb would be initialized afresh by a writer: refuse it before LMDB sees it.
    if data.exists() and (size := data.stat().st_size) < MIN_SIZE:
        raise corrupt(run_dir, f"{data} holds {size} bytes, less than LMDB's two header pages")
    try:
        env = lmdb.open(str(path), map_size=map_size, max_dbs=max_dbs, readonly=not writer, lock=True, subdir=True)
    except (lmdb.InvalidError, lmdb.CorruptedError, lmdb.VersionMismatchError, lmdb.PageNotFoundError) as e:
        raise corrupt(run_dir, f"LMDB cannot read {data}'s header ({e})") from None
    except lmdb.Error as e:
        raise StoreError(f"{path}: cannot open the IR store: {e}") from e
    # Before any page is read: a page past the end of a truncated file is a SIGBUS, not an exception.
    problem = size_problem(data, env)
    if problem:
        env.close()
        raise corrupt(run_dir, problem)
    return env


def size_problem(data_path: Path, env: Any) -> str | None:
    """Why `data.mdb` is shorter than the store LMDB describes, or None. Only the meta pages are read here."""
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    have = os.path.getsize(data_path)
    if have < need:
        return (f"{data_path} is {have} bytes but LMDB's header says the store uses {need}: the file was truncated "
                f"(a full disk, or a copy cut short); reading it would crash the process")
    return None


# What LMDB raises on a page that is not what it wrote.
DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.PanicError, lmdb.InvalidError)


def is_full(e: BaseException) -> bool:
    return isinstance(e, (lmdb.MapFullError, lmdb.DiskError)) or (isinstance(e, OSError) and e.errno in FULL_ERRNOS)


def list_backups(run_dir: Path) -> list[Path]:
    """The run's backups, oldest first (only complete ones: a backup is renamed into place once verified)."""
    root = Path(run_dir) / BACKUPS
    try:
        found = [d for d in root.iterdir() if re.fullmatch(r"step-\d+", d.name) and (d / "data.mdb").is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda d: int(d.name[5:]))


def recovery_hint(run_dir: Path) -> str:
    backups = list_backups(run_dir)
    salvage = (f"`tik-evo export {run_dir} --salvage -o salvage.jsonl` exports every intact record and names the "
               f"damaged ones")
    if not backups:
        return f"{salvage}; this run has no backup in {Path(run_dir) / BACKUPS} to restore."
    last = backups[-1]
    return (f"{salvage}; then `tik-evo resume {run_dir} --from-backup {last.name}` restores the newest verified "
            f"backup ({last}, made at step {int(last.name[5:])}; steps after it are lost, the damaged store is kept "
            f"aside) and continues the run ({len(backups)} backup(s) in {last.parent}).")


def corrupt(run_dir: Path, what: str) -> StoreCorrupt:
    return StoreCorrupt(f"{run_dir}: the IR store is damaged: {what}. {recovery_hint(run_dir)}")


def full(run_dir: Path, e: BaseException, step: int | None, map_size: int, in_store: bool = True) -> StoreFull:
    """The message for a write that found the map or the disk full (`in_store`: a write to the store itself,
    whose transaction LMDB rolled back; else a file the step writes beside it, before its transaction)."""
    at = f" at step {step}" if step is not None else ""
    if isinstance(e, lmdb.MapFullError):
        why = (f"a write to the IR store{at} failed: its map is full ({map_size / 2**20:.1f} MiB); set "
               f"TIK_EVO_MAP_SIZE to a larger size in bytes")
    else:
        what = (f"writing {e.filename}" if getattr(e, "filename", None) else
                f"a write to the IR store{at}" if in_store else f"a write under {run_dir}")
        why = f"{what} failed: the disk holding {run_dir} is full ({getattr(e, 'strerror', None) or e}); free space"
    return StoreFull(f"{run_dir}: {why}, then `tik-evo resume {run_dir}` continues. The step in flight was not "
                     f"stored: every record committed before it is intact.")
