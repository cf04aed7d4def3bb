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


class SpawnExecutor:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.running: set[int] = set()  # worker pids, killed by close()

    def run(self, job_path: Path, log_path: Path, timeout: float) -> tuple[int, bool]:
        # The worker calls die_with_parent() itself: it is the parent's direct child.
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tik_evo.worker", str(job_path)], env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=str(job_path.parent))
            self.running.add(proc.pid)
            try:
                return proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                return proc.wait(), True
            finally:
                self.running.discard(proc.pid)

    def close(self) -> None:
        for pid in list(self.running):
            _kill_group(pid)


class ForkServerExecutor:
    """Protocol over pipes: we write a job path per line; the server answers "pid N", then "exit N CODE"."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", "tik_evo.forkserver"], env=self.env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         start_new_session=True, bufsize=0)
        return self.proc

    def _readline(self, deadline: float) -> str | None:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
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
        assert proc.stdin
        proc.stdin.write(f"{job_path}\t{log_path}\n".encode())
        deadline = time.time() + timeout
        first = self._readline(time.time() + 60)
        if not first or not first.startswith("pid "):
            self.close()
            return SpawnExecutor(self.env).run(job_path, log_path, timeout)  # server broken: fall back
        pid = int(first.split()[1])
        line = self._readline(deadline)
        if line is None:
            _kill_group(pid)
            self._readline(time.time() + 30)  # the server reaps the child and reports its exit
            return -signal.SIGKILL, True
        if not line:
            self.close()
            return -signal.SIGKILL, False
        return int(line.split()[2]), False

    def close(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc.pid)
            self.proc.wait()
            self.proc = None


EXECUTORS = {"spawn": SpawnExecutor, "forkserver": ForkServerExecutor}
