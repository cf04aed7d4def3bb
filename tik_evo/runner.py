"""The candidate's process: it imports one candidate file and runs its functions on the judge's buffers.

Nothing here judges. The runner receives requests over its channel (JSON: which function, which arena slots),
calls the candidate, synchronises the device and answers "done" or the error. It never sees references,
checks, verdicts, the job, the store or the other implementation it is compared with; it cannot tell a checked
call from a timed one except by what it is asked to run, and timed regions are timed by the judge's own clock.
It is forked by the judge before CUDA is initialised and confined by :mod:`tik_evo.sandbox` before the
candidate is imported.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tik_evo.arena import ALIGN, DTYPES, RunnerArena, dtype_name
from tik_evo.channel import Channel, ChannelError

MAX_TRACE = 6000


def _critical() -> dict[str, Any]:
    """Objects the runner's answers rely on, by identity; compared before each answer (a candidate that
    replaced one has tampered with the runner, whatever the static scan let through)."""
    import json
    import socket

    import torch
    import triton.testing

    from tik_evo import channel, timing

    objs = {"time.perf_counter": time.perf_counter, "json.dumps": json.dumps, "socket.sendall": socket.socket.sendall,
            "Channel.send": channel.Channel.send, "timing._capture": timing._capture,
            "timing.capture_graph": timing.capture_graph, "Tensor.copy_": torch.Tensor.copy_,
            "Tensor.clone": torch.Tensor.clone, "torch.cuda.synchronize": torch.cuda.synchronize,
            "CUDAGraph.replay": torch.cuda.CUDAGraph.replay, "runner.serve": serve, "runner._run": _run,
            # Not used by the runner, but a candidate that replaces them means to fool a timer: refused as such.
            "Event.elapsed_time": torch.cuda.Event.elapsed_time, "Event.record": torch.cuda.Event.record,
            "triton.testing.do_bench": triton.testing.do_bench,
            "triton.testing.do_bench_cudagraph": triton.testing.do_bench_cudagraph}
    return objs


def error_reply(e: BaseException) -> dict[str, Any]:
    from tik_evo.failure import error_kind

    return {"ok": False, "type": type(e).__name__, "kind": error_kind(e),
            "error": traceback.format_exc(limit=8)[-MAX_TRACE:]}


class Runner:
    def __init__(self, chan: Channel, device: str, private: Path):
        self.chan, self.device, self.private = chan, device, private
        self.arena = RunnerArena()
        self.module = None
        self.functions: dict[str, Any] = {}
        self._fns: dict[str, Any] = {}
        self.plans: dict[str, dict[str, Any]] = {}
        self.pristine: dict[str, Any] = {}
        self.profile = Profile()

    def sync(self) -> None:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()

    # -- arguments -------------------------------------------------------------------------------------------
    def decode(self, a: Any) -> Any:
        if isinstance(a, dict):
            kind = a.get("t")
            if kind == "tensor":
                return self.arena.view(a)
            if kind in ("list", "tuple"):
                items = [self.decode(x) for x in a["items"]]
                return items if kind == "list" else tuple(items)
            if kind == "dtype":
                return DTYPES[a["name"]]
            if kind == "meta":  # a warm pass: shape and dtype only (tik_evo.warm)
                from tik_evo.compile_only import meta

                return meta(DTYPES[a["dtype"]], a["shape"])
            raise ValueError(f"unknown argument kind {kind!r}")
        return a

    def encode_result(self, value: Any, region: dict | None, state: list[int]) -> Any:
        """Returned tensors are copied into the judge's return region (``state`` = [bytes used])."""
        import torch

        if isinstance(value, torch.Tensor):
            if region is None:
                raise ValueError("the function returned a tensor, but its entry point is not declared to return one")
            t = value.detach().contiguous()
            nbytes = -(-t.numel() * t.element_size() // ALIGN) * ALIGN or ALIGN
            if state[0] + nbytes > int(region["nbytes"]):
                raise ValueError(f"returned tensors exceed the {region['nbytes']}-byte return region")
            desc = {"t": "tensor", "chunk": region["chunk"], "offset": int(region["offset"]) + state[0],
                    "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
            state[0] += nbytes
            if t.numel():
                self.arena.view(desc).copy_(t)
            return desc
        if isinstance(value, (list, tuple)):
            return {"t": "tuple" if isinstance(value, tuple) else "list",
                    "items": [self.encode_result(v, region, state) for v in value]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise ValueError(f"cannot return a {type(value).__name__} to the judge")

    def closure(self, call: dict[str, Any]):
        fn = self._fns[call["fn"]]
        args = [self.decode(a) for a in call.get("args", [])]
        kwargs = {k: self.decode(v) for k, v in call.get("kwargs", {}).items()}
        return lambda: fn(*args, **kwargs)

    # -- requests --------------------------------------------------------------------------------------------
    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from tik_evo.candidate import load_module

        path = self.private / "kernel.py"
        path.write_text(msg["source"])
        self.pristine = _critical()
        self.module = load_module(path, "kernel")
        for name, obj in vars(self.module).items():
            if not name.startswith("_") and inspect.isfunction(obj) and obj.__module__ == "kernel":
                try:
                    params = list(inspect.signature(obj).parameters.values())
                except (TypeError, ValueError):
                    continue
                self.functions[name] = {"params": [p.name for p in params],
                                        "defaults": [p.name for p in params if p.default is not p.empty]}
        self._fns = {n: getattr(self.module, n) for n in self.functions}
        return {"ok": True, "functions": self.functions}

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        run = self.closure(msg)
        result = run()
        self.sync()
        return {"ok": True, "result": self.encode_result(result, msg.get("ret"), [0])}

    def replay(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Capture the call in a CUDA graph and replay it once (on the CPU: run it again); the judge compares."""
        run = self.closure(msg)
        if self.device == "cpu":
            run()
        else:
            from tik_evo.timing import _capture

            self.sync()
            try:
                graph = _capture(run, 1)
            except Exception as e:  # noqa: BLE001 - a call that cannot be captured is the judge's finding
                return {"ok": True, "captured": False, "error": f"{type(e).__name__}: {e}"[:500]}
            graph.replay()
        self.sync()
        return {"ok": True, "captured": True}

    def plan(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Prepare a timed region: the calls in order, run once eagerly, and on a GPU captured `cycles` times
        in one CUDA graph when asked (decode-sized work, as rollout engines replay it)."""
        calls = [self.closure(c) for c in msg["calls"]]

        def cycle() -> None:
            for c in calls:
                c()

        cycle()
        self.sync()
        graph = None
        if msg.get("graph") and self.device != "cpu":
            from tik_evo.timing import capture_graph

            graph = capture_graph(cycle, int(msg.get("cycles", 1)))
        self.plans[msg["id"]] = {"cycle": cycle, "graph": graph, "cycles": int(msg.get("cycles", 1))}
        return {"ok": True, "graph": graph is not None}

    def time(self, msg: dict[str, Any]) -> dict[str, Any]:
        p = self.plans[msg["id"]]
        reps = int(msg["reps"])
        if p["graph"] is not None:
            for _ in range(reps):
                p["graph"].replay()
        else:
            for _ in range(reps * p["cycles"]):
                p["cycle"]()
        self.sync()
        return {"ok": True}

    def compile_only(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Before `load`, in a runner that sees no GPU: launches compile for this target and run nothing."""
        from tik_evo import compile_only

        compile_only.install(tuple(msg["capability"]), int(msg.get("warp_size", 32)))
        self.device = "compile-only"
        return {"ok": True}

    def warm(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Each call once on meta tensors, compiling what it launches; a call that fails stops only itself."""
        if self.device != "compile-only":
            raise RuntimeError("warm: the runner is not in compile-only mode")
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode

        done, errors = 0, []
        # Triton's asynchronous compile mode: each launch queues its compile and the calls go on, so the
        # kernels of all calls compile at once on `threads` threads (LLVM and ptxas release the GIL).
        with ThreadPoolExecutor(max(1, int(msg.get("threads", 1)))) as pool:
            try:
                with AsyncCompileMode(pool):
                    for c in msg["calls"]:
                        try:
                            self.closure(c)()
                            done += 1
                        except Exception as e:  # noqa: BLE001 - nothing of a warm pass is a verdict
                            errors.append(f"{c.get('fn')}: {_where(e)}")
            except Exception as e:  # noqa: BLE001 - a kernel that did not compile: the audit will say why
                errors.append(f"compile: {_where(e)}")
        return {"ok": True, "calls": done, "failed": len(errors), "errors": errors[:5]}

    def tampered(self) -> list[str]:
        now = _critical()
        return [k for k, v in self.pristine.items() if now.get(k) is not v]


class Profile:
    """Where the runner's time goes, for the audit's `phases`: seconds per request kind, Triton compiles (hits,
    misses, seconds) and the C helpers Triton builds with the host compiler. The candidate runs in this process
    and could falsify these figures: they explain an audit's time and never feed a verdict or a timing."""

    def __init__(self) -> None:
        self.ops: dict[str, list[float]] = {}  # op -> [count, seconds]
        self.compile = {"misses": 0, "hits": 0, "seconds": 0.0}
        self.c_builds = {"count": 0, "seconds": 0.0}
        self.started = time.time()
        self.cuda_init_s: float | None = None

    def init_cuda(self) -> None:
        """Make this process's CUDA context now, right after the fork, while the judge prepares its first
        request (and makes its own): else the first chunk the judge asks for pays for it, after the judge's."""
        import torch

        t0 = time.time()
        try:
            torch.empty(1, device="cuda")
        except Exception:  # noqa: BLE001 - the first chunk tries again and reports it, with the judge's advice
            return
        self.cuda_init_s = time.time() - t0

    def op(self, name: str, seconds: float) -> None:
        n = self.ops.setdefault(name, [0, 0.0])
        n[0] += 1
        n[1] += seconds

    def install(self) -> None:
        """Hooks into Triton (before the candidate is imported); without the hooks (another Triton) only the
        per-request figures are kept."""
        try:
            import triton.knobs
            import triton.runtime.build as build
        except ImportError:
            return

        def listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
            self.compile["hits" if cache_hit else "misses"] += 1
            self.compile["seconds"] += times.total / 1e6

        build_fn = getattr(build, "_build", None)
        if build_fn is not None:
            def timed_build(*a, **k):
                t0 = time.time()
                try:
                    return build_fn(*a, **k)
                finally:
                    self.c_builds["count"] += 1
                    self.c_builds["seconds"] += time.time() - t0

            build._build = timed_build
        if hasattr(triton.knobs, "compilation"):
            triton.knobs.compilation.listener = listener

    def to_dict(self) -> dict[str, Any]:
        return {"alive_s": round(time.time() - self.started, 3),
                "cuda_init_s": None if self.cuda_init_s is None else round(self.cuda_init_s, 3),
                "ops": {k: [v[0], round(v[1], 3)] for k, v in self.ops.items()},
                "triton_compile": {**self.compile, "seconds": round(self.compile["seconds"], 3)},
                "c_builds": {**self.c_builds, "seconds": round(self.c_builds["seconds"], 3)}}


def _where(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" ({Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(e).__name__}: {e}{at}"[:300]


def _run(r: Runner, msg: dict[str, Any]) -> dict[str, Any]:
    op = msg.get("op")
    handlers = {"load": r.load, "call": r.call, "replay": r.replay, "plan": r.plan, "time": r.time,
                "compile_only": r.compile_only, "warm": r.warm}
    if op == "empty":
        r.sync()
        return {"ok": True}
    if op == "profile":
        return {"ok": True, "profile": r.profile.to_dict()}
    if op not in handlers:
        return {"ok": False, "type": "ProtocolError", "kind": "protocol", "error": f"unknown request {op!r}"}
    try:
        return handlers[op](msg)
    except Exception as e:  # noqa: BLE001 - every candidate error goes back to the judge as evidence
        return error_reply(e)


def serve(r: Runner) -> None:
    while True:
        fds: list[int] = []
        try:
            msg = r.chan.recv(fds=fds)
        except ChannelError:
            return  # the judge is gone
        if msg.get("op") == "exit":
            return
        if msg.get("op") == "chunk":
            try:
                reply: dict[str, Any] = {"ok": True, **r.arena.add(msg, fds)}
            except Exception as e:  # noqa: BLE001
                reply = error_reply(e)
        else:
            t0 = time.time()
            reply = _run(r, msg)
            r.profile.op(str(msg.get("op")), time.time() - t0)
        if r.pristine:
            bad = r.tampered()
            if bad:
                reply = {"ok": False, "type": "Tampering", "kind": "tamper",
                         "error": f"the candidate replaced {', '.join(bad)} in its process"}
        r.chan.send(reply)


# Modules the runner itself uses after the fork; every other module of the project (the judge's, the families')
# leaves sys.modules, so a candidate does not find the judge's names there.
RUNNER_MODULES = ("tik_evo", "tik_evo.launch", "tik_evo.interp", "tik_evo.timing", "tik_evo.channel",
                  "tik_evo.arena", "tik_evo.candidate", "tik_evo.failure", "tik_evo.family")


def _forget_the_judge() -> None:
    for name in list(sys.modules):
        if name.startswith(("tik_evo.", "tik_evo_kernels")) and name not in RUNNER_MODULES:
            del sys.modules[name]


def main(sock_fd: int, device: str, private: Path, mode: str, hide: list[str], cache: str | None,
         cache_read: list[str]) -> None:
    """The forked child's life: confine, then serve until the judge says exit or goes away."""
    from tik_evo import sandbox
    from tik_evo.executor import die_with_parent

    die_with_parent()
    chan = Channel.__new__(Channel)
    import socket

    chan.sock = socket.socket(fileno=sock_fd)
    env = sandbox.scrubbed_env(dict(os.environ), private, cache, cache_read)
    if device == "compile-only":  # a warm runner (tik_evo.warm): no GPU, Triton compiling rather than interpreting
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("TRITON_INTERPRET", None)
    try:
        enforced = sandbox.enter(private, mode, device, hide, [cache] if cache else [], cache_read)
    except sandbox.SandboxError as e:
        chan.send({"ok": False, "type": "SandboxError", "kind": "sandbox", "error": str(e)})
        return
    os.environ.clear()
    os.environ.update(env)
    import tempfile

    # The judge's process had already resolved its temp dir (/tmp, read-only here): Triton builds its CUDA
    # driver helper in a temp dir, so it must be the private one.
    tempfile.tempdir = str(private)
    os.chdir(private)
    sys.path[:] = [p for p in sys.path if p]  # no implicit cwd entry
    if device == "cpu":
        from tik_evo import interp

        interp.install()
    _forget_the_judge()
    runner = Runner(chan, device, private)
    runner.profile.install()
    chan.send({"ok": True, "pid": os.getpid(), "sandbox": enforced.to_dict()})
    if device == "cuda":
        runner.profile.init_cuda()
    serve(runner)
