"""Fork server for audits (see :mod:`tik_evo.executor`): imports torch and Triton once, forks per job."""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch  # noqa: F401  - the point of the server: pay these imports once
import triton  # noqa: F401
import triton.language  # noqa: F401

from tik_evo import worker
from tik_evo.executor import die_with_parent


def _child(job_path: str, log_path: str, proto: int) -> None:
    os.setsid()  # own process group: a timeout kills the job and anything it started
    die_with_parent()  # the server dies with the engine, the job with the server
    os.close(proto)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(os.path.dirname(job_path))
    code = 0
    try:
        with open(job_path) as fh:
            worker.run(json.load(fh))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    die_with_parent()
    proto = os.dup(1)  # the protocol channel; fd 1 is redirected to each job's log in the child
    for line in sys.stdin.buffer:
        job_path, log_path = line.decode().rstrip("\n").split("\t")
        if torch.cuda.is_initialized():  # a forked child cannot use a CUDA context its parent created
            raise SystemExit("fork server: CUDA was initialised in the server; use evaluate.executor=spawn")
        pid = os.fork()
        if pid == 0:
            _child(job_path, log_path, proto)
        os.write(proto, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(proto, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    main()
