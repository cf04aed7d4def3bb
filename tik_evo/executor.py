"""Executors run one audit job in an isolated process group and report (exit code, timed out).

``spawn`` starts a fresh interpreter per job. ``forkserver`` keeps one server process that has imported
torch and Triton once (several seconds per audit otherwise) and forks a child per job; the child starts its
own session, so a timeout kills its whole process group exactly as with spawn. The server never touches
CUDA itself (importing torch does not initialise it), so each forked child initialises CUDA afresh.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies, so a kill -9 of the engine leaves no audit running on."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the timeout still bounds every audit while the engine lives


def forked_child(log_path: str | Path, body) -> NoReturn:
    """The end of a forked child's life: output to ``log_path``, run ``body()``, exit with its status through
    ``os._exit`` (never the parent's exit handlers: atexit, pytest's)."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 0
    try:
        body()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# What `run` returns for a job the executor was closed on (before or while it ran): killed, not timed out.
CLOSED = (-signal.SIGKILL, False)


class InfrastructureError(RuntimeError):
    """Raised by `run` when the executor could not get the job run at all (a remote worker lost every time it
    was tried): the audit fails as `infrastructure`, never as a verdict on the candidate."""


class SpawnExecutor:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.running: set[int] = set()  # worker pids, killed by close()
        self.closed = False  # once closed, no job starts: a run's audit thread may still be on its way to one
        self._lock = threading.Lock()

    def run(self, job_path: Path, log_path: Path, timeout: float) -> tuple[int, bool]:
        if self.closed:
            return CLOSED
        # The worker calls die_with_parent() itself: it is the parent's direct child.
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tik_evo.worker", str(job_path)], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=str(job_path.parent))
            with self._lock:
                self.running.add(proc.pid)
                closed = self.closed
            if closed:  # close() came while the worker was starting, before it could see the pid
                _kill_group(proc.pid)
            try:
                return proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                return proc.wait(), True
            finally:
                with self._lock:
                    self.running.discard(proc.pid)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            pids = list(self.running)
        for pid in pids:
            _kill_group(pid)


class ForkServerExecutor:
    """Protocol over pipes: we write a job path per line; the server answers "pid N", then "exit N CODE"."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.closed = False  # once closed, no server starts again (a closed server's job returns CLOSED)
        self._lock = threading.Lock()
        self._fallback = SpawnExecutor(env)  # runs a job the server failed to start; close() reaches it too

    def _start(self) -> subprocess.Popen | None:
        with self._lock:
            if self.closed:
                return None
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen([sys.executable, "-m", "tik_evo.forkserver"], env=self.env,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, start_new_session=True, bufsize=0)
            return self.proc

    @staticmethod
    def _readline(proc: subprocess.Popen, deadline: float) -> str | None:
        """The server's next line; None past the deadline, "" once the server is gone."""
        assert proc.stdout
        fd = proc.stdout.fileno()
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.time()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1)
            if not chunk:  # the server died
                return ""
            buf += chunk
        return buf.decode().strip()

    def run(self, job_path: Path, log_path: Path, timeout: float) -> tuple[int, bool]:
        proc = self._start()
        if proc is None:
            return CLOSED
        assert proc.stdin
        try:
            proc.stdin.write(f"{job_path}\t{log_path}\n".encode())
        except (BrokenPipeError, ValueError):  # closed (or dead) between the start and the write
            if self.closed:
                return CLOSED
            raise
        deadline = time.time() + timeout
        first = self._readline(proc, time.time() + 60)
        if self.closed:
            return CLOSED
        if not first or not first.startswith("pid "):
            self._stop()
            return self._fallback.run(job_path, log_path, timeout)  # server broken: fall back
        pid = int(first.split()[1])
        line = self._readline(proc, deadline)
        if line is None:
            _kill_group(pid)
            self._readline(proc, time.time() + 30)  # the server reaps the child and reports its exit
            return -signal.SIGKILL, True
        if not line:
            self._stop()
            return -signal.SIGKILL, False
        return int(line.split()[2]), False

    def _stop(self) -> None:
        """Kill the server (its forked children die with it: they asked for SIGKILL at their parent's death)."""
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            _kill_group(proc.pid)
            proc.wait()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._fallback.close()
        self._stop()


EXECUTORS = {"spawn": SpawnExecutor, "forkserver": ForkServerExecutor}
