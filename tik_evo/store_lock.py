"""The single writer of a run: an exclusive ``flock`` on RUN/writer.lock, which the kernel drops when the holder
dies (a kill -9 frees it), with the holder's pid in the file for messages and the `running (pid N)` status."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from tik_evo.store_integrity import StoreLocked

LOCK_WAIT_S = 0.5  # how long a writer waits for the lock before refusing (outlasts a status probe)


def acquire(run_dir: Path) -> int:
    """Take the run's writer lock; its file descriptor (held until `release`), or StoreLocked naming the holder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / "writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
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
        raise StoreLocked(f"{run_dir} is already being written by another tik-evo process "
                          f"(pid {holder}); wait for it to finish or stop it, then `tik-evo resume "
                          f"{run_dir}`. Read-only commands (status, show, tui) work meanwhile.") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
    except OSError:  # the pid only names the writer in messages: a full disk must not stop the run here
        pass
    return fd


def release(fd: int) -> None:
    os.close(fd)


def writer_pid(run_dir: Path) -> int | None:
    """The pid of another process holding the run's writer lock now, or None (finished, interrupted or killed)."""
    try:
        fd = os.open(run_dir / "writer.lock", os.O_RDWR)
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
