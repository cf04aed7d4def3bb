"""Fork server for audits (see :mod:`tik_evo.executor`): imports torch and Triton once, forks per job."""

from __future__ import annotations

import os
import sys

import torch  # noqa: F401  - the point of the server: pay these imports once
import triton  # noqa: F401
import triton.language  # noqa: F401

from tik_evo import worker
from tik_evo.executor import die_with_parent, forked_child
from tik_evo.worker_io import WorkerJob


def _child(job_path: str, log_path: str, proto: int) -> None:
    os.setsid()  # own process group: a timeout kills the job and anything it started
    die_with_parent()  # the server dies with the engine, the job with the server
    os.close(proto)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.chdir(os.path.dirname(job_path))

    def job() -> None:
        with open(job_path) as fh:
            worker.run(WorkerJob.from_json(fh.read()))

    forked_child(log_path, job)


def main() -> None:
    from tik_evo import sandbox

    die_with_parent()
    # Whatever a job leaves behind when it is killed (a candidate's detached process) becomes ours, and dies below.
    sandbox.become_subreaper()
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
        sandbox.kill_descendants()
        os.write(proto, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    main()
