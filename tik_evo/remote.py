"""The judge's handle on a runner: fork it, load a source, and call the candidate as if it were a module.

`RemoteModule` stands where the families expect a loaded candidate module: `impl.decode(q, k, v, ...)` copies
the call's tensors into fresh arena slots, has the runner call the candidate on them and copies the declared
outputs back. The family's own tensors never reach the candidate, so references computed from them afterwards
are computed from the inputs as they were. Each call is also checked the way production uses it:
- every tensor argument the entry point does not declare as written must come back bit-unchanged;
- a call passing an optional output (the fp32 side output) is made a second time without it, as production
  calls are, and the other outputs of the two must agree bit for bit.
Those findings are collected as checks (`take_checks`) beside the family's own.
"""

from __future__ import annotations

import inspect
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tik_evo import checks as C
from tik_evo.arena import Arena
from tik_evo.channel import Channel, ChannelError, ChannelTimeout
from tik_evo.family import Check, EntryPoint, Family


class CandidateError(RuntimeError):
    """The candidate raised (or its runner failed) while serving a request; `kind` is the audit failure kind."""

    def __init__(self, kind: str, type_name: str, text: str):
        super().__init__(text)
        self.kind, self.type_name = kind, type_name


class Runner:
    """One runner process and its arena, seen from the judge."""

    def __init__(self, pid: int, chan: Channel, device: str, private: Path, hello: dict[str, Any]):
        self.pid, self.chan, self.device, self.private = pid, chan, device, private
        self.sandbox = hello.get("sandbox", {})
        self.arena = Arena(device, chan)
        self.timeout = 600.0
        self.spent: dict[str, list[float]] = {}  # op -> [count, seconds] as the judge waited for them

    @classmethod
    def fork(cls, device: str, mode: str = "auto", hide: list[str] | None = None,
             cache_dir: Path | None = None, cache_read: list[Path] = ()) -> Runner:
        """Start a runner (call before this process initialises CUDA: a forked child cannot use its context).
        ``cache_dir``: its Triton cache, which it may write; ``cache_read``: caches it may only read."""
        from tik_evo import runner as runner_main

        if torch.cuda.is_initialized():  # (is_available() would initialise the driver here: never call it first)
            raise RuntimeError("a runner must be forked before the judge initialises CUDA")
        private = Path(tempfile.mkdtemp(prefix="tmp")).resolve()  # as mountinfo spells it (a symlinked /tmp)
        os.chmod(private, 0o700)
        cache = None
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            cache = str(cache_dir.resolve())
        read = [str(p.resolve()) for p in cache_read if p.is_dir()]
        ours, theirs = Channel.pair()
        pid = os.fork()
        if pid == 0:  # the runner
            code = 0
            try:
                ours.close()
                runner_main.main(theirs.sock.detach(), device, private, mode, list(hide or []), cache, read)
            except BaseException:  # noqa: BLE001 - the judge sees the channel close
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        try:
            hello = ours.recv(timeout=120)
        except ChannelError as e:
            cls._reap(pid)
            raise CandidateError("sandbox", "RunnerStart", f"the runner did not start: {e}") from None
        if not hello.get("ok"):
            cls._reap(pid)
            raise CandidateError(hello.get("kind", "sandbox"), hello.get("type", ""), hello.get("error", ""))
        return cls(pid, ours, device, private, hello)

    @staticmethod
    def _reap(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def request(self, msg: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if self.device != "cpu" and torch.cuda.is_initialized():
            # The judge's copies into the arena run on its own stream, the runner's kernels on another process's:
            # nothing orders them but this. Without it a busy GPU lets the runner read a slot before its
            # inputs land (false mismatches, NaNs from stale memory when audits share a card).
            torch.cuda.synchronize()
        t0 = time.time()
        try:
            self.chan.send(msg)
            reply = self.chan.recv(timeout=timeout or self.timeout)
            spent = self.spent.setdefault(str(msg.get("op")), [0, 0.0])
            spent[0] += 1
            spent[1] += time.time() - t0
        except ChannelTimeout:
            raise CandidateError("timeout", "Timeout", f"the runner did not answer {msg.get('op')!r} in time") \
                from None
        except ChannelError as e:
            status = self._status()
            raise CandidateError("crash", "RunnerDied", f"the runner {status} during {msg.get('op')!r}: {e}") \
                from None
        if not reply.get("ok"):
            raise CandidateError(str(reply.get("kind", "exception")), str(reply.get("type", "")),
                                 str(reply.get("error", ""))[:8000])
        return reply

    def _status(self) -> str:
        """How the runner ended, once its channel closed (it may take a moment to exit after closing it)."""
        deadline = time.time() + 5
        while True:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return "is gone"
            if pid or time.time() > deadline:
                break
            time.sleep(0.02)
        if not pid:
            return "closed its channel"
        code = os.waitstatus_to_exitcode(status)
        if code < 0 and -code in signal.valid_signals():
            return f"died of {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def profile(self) -> dict[str, Any]:
        """The runner's own account of its time (tik_evo.runner.Profile: diagnostics only) beside the judge's
        wait per request kind; {} from a runner that cannot answer."""
        try:
            theirs = self.request({"op": "profile"}, timeout=10).get("profile", {})
        except CandidateError as e:
            theirs = {"error": str(e)[:200]}
        return {"judge_wait": {k: [v[0], round(v[1], 3)] for k, v in self.spent.items()}, "runner": theirs}

    def load(self, source: str) -> dict[str, Any]:
        return self.request({"op": "load", "source": source})["functions"]

    def close(self) -> None:
        """Kill the runner (and, through the judge's subreaper sweep, whatever it started)."""
        try:
            self.chan.send({"op": "exit"})
        except ChannelError:
            pass
        self.chan.close()
        self._reap(self.pid)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    return bool(torch.equal(C.bits(a), C.bits(b)))


class RemoteFunction:
    """One of the candidate's functions, called through the runner."""

    def __init__(self, module: RemoteModule, name: str, params: list[str], defaults: list[str]):
        self._m, self.__name__ = module, name
        self.params = params
        ps = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                default=None if p in defaults else inspect.Parameter.empty) for p in params]
        self.__signature__ = inspect.Signature(ps)
        self.__globals__ = {"KNOBS": module.KNOBS}  # families read a function's KNOBS (rope's COS_SIN)

    def __call__(self, *args, **kwargs):
        return self._m._call(self.__name__, args, kwargs)


class RemoteModule:
    """A candidate module living in a runner. ``recording`` (a list) makes calls recorded, not run: how the
    judge learns a bench's timed calls without running them."""

    def __init__(self, runner: Runner, family: Family, functions: dict[str, Any], knobs: dict[str, Any]):
        self._runner, self._family = runner, family
        self.KNOBS = knobs
        self._fns = {n: RemoteFunction(self, n, f["params"], f["defaults"]) for n, f in functions.items()}
        self._checks: list[Check] = []
        self._counts = {"calls": 0, "production": 0}
        self.recording: list[tuple[str, tuple, dict]] | None = None
        # Graph stage: each call is also captured in a CUDA graph and replayed, and the replay's writes
        # compared with the eager call's; outcomes summed here per entry point.
        self.replay_tally: dict[str, dict[str, Any]] | None = None
        # Repeat stage: executed calls logged with their arguments as they were before the call.
        self.log: list[tuple[str, dict[str, Any]]] | None = None
        self.small_log: list[tuple[str, dict[str, Any]]] | None = None  # the small stage's log, kept
        self.notes = None  # a tik_evo.warm.Notes: the calls made, for later audits' warm passes

    def __getattr__(self, name: str):
        fns = self.__dict__.get("_fns", {})
        if name in fns:
            return fns[name]
        raise AttributeError(name)

    def take_checks(self, tag: str = "", summary: bool = True) -> list[Check]:
        """The findings since the last take: each failure, and one passing check per kind that held (its name
        ends in ``tag``, so checks of several cases stay apart)."""
        out, self._checks = self._checks, []
        kinds = {c.kind for c in out}
        n, p = self._counts["calls"], self._counts["production"]
        if not summary:
            n = p = 0
        if n and "inputs" not in kinds:
            out.append(Check(f"inputs unchanged by every call ({n} calls) {tag}".rstrip(), True, "inputs",
                             {"calls": n}))
        if p and "consistency" not in kinds:
            out.append(Check(f"production calls (optional outputs left out) == checked calls ({p} calls) {tag}"
                             .rstrip(), True, "consistency", {"calls": p}))
        self._counts = {"calls": 0, "production": 0}
        return out

    def signature(self, name: str) -> EntryPoint:
        sig = self._family.signature(name)
        if sig is None:  # undeclared: every tensor may be written, nothing is checked unchanged
            params = tuple(self._fns[name].params)
            sig = EntryPoint(name, params, writes=params)
        return sig

    def bind(self, name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
        params = self._fns[name].params
        if len(args) > len(params):
            raise TypeError(f"{name}() takes {len(params)} arguments, {len(args)} given")
        bound = dict(zip(params, args))
        for k, v in kwargs.items():
            if k not in params or k in bound:
                raise TypeError(f"{name}() got an unexpected or repeated argument {k!r}")
            bound[k] = v
        return bound

    # -- one call --------------------------------------------------------------------------------------------
    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        if self.notes is not None:
            try:
                self.notes.add(name, self.bind(name, args, kwargs), self.signature(name).optional)
            except TypeError:
                pass  # a call the entry point cannot take: reported by the call itself below
        if self.recording is not None:
            self.recording.append((name, args, kwargs))
            return None
        self._counts["calls"] += 1
        sig, bound = self.signature(name), self.bind(name, args, kwargs)
        pre = None
        if self.log is not None or self.replay_tally is not None:
            pre = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in bound.items()}
            if self.log is not None:
                self.log.append((name, pre))
        production = [p for p in sig.optional if bound.get(p) is not None]
        prod_out = None
        if production:  # first as production calls it: without the optional outputs
            self._counts["production"] += 1
            prod_bound = {k: (None if k in production else v) for k, v in bound.items()}
            prod_out, _ = self._run(name, sig, prod_bound, copy_back=False)
        outs, result = self._run(name, sig, bound, copy_back=True)
        if self.replay_tally is not None and not sig.backward:
            self._replay(name, sig, pre, outs)
        if prod_out is not None:
            for p, t in prod_out.items():
                same = bits_equal(t, outs[p])
                if not same:
                    self._checks.append(Check(f"{name}: call without {'/'.join(production)} == with it ({p})",
                                              False, "consistency", {"param": p, "without": production}))
        return result

    def _replay(self, name: str, sig: EntryPoint, pre: dict[str, Any], eager: dict[str, torch.Tensor]) -> None:
        t = self.replay_tally.setdefault(name, {"calls": 0, "written": 0, "elements": 0, "differ": 0,
                                                "capture_failures": 0})
        t["calls"] += 1
        replayed, reply = self._run(name, sig, pre, copy_back=False, op="replay")
        if not reply.get("captured", True):
            t["capture_failures"] += 1
            t.setdefault("first_failure", reply.get("error", ""))
            return
        for p, e in eager.items():
            r = replayed[p]
            t["written"] += 1
            t["elements"] += e.numel()
            if not bits_equal(r, e):
                same_kind = r.shape == e.shape and r.dtype == e.dtype and r.dtype != torch.bool
                t["differ"] += int((C.bits(r) != C.bits(e)).sum()) if same_kind else e.numel()

    def _run(self, name: str, sig: EntryPoint, bound: dict[str, Any], copy_back: bool, op: str = "call"):
        """One runner call on fresh slots: the written outputs (as judge tensors) and the decoded result."""
        arena = self._runner.arena
        mark = arena.mark()
        placed: dict[int, tuple[str, torch.Tensor, dict]] = {}

        def enc(param: str, v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                if id(v) not in placed:
                    placed[id(v)] = (param, v, arena.place(v.detach()))
                return placed[id(v)][2]
            if isinstance(v, (list, tuple)):
                return {"t": "tuple" if isinstance(v, tuple) else "list", "items": [enc(param, x) for x in v]}
            if isinstance(v, torch.dtype):
                return {"t": "dtype", "name": str(v).removeprefix("torch.")}
            return v

        try:
            msg: dict[str, Any] = {"op": op, "fn": name, "args": [],
                                   "kwargs": {k: enc(k, v) for k, v in bound.items()}}
            if sig.returns:
                nbytes = 2 * sum(t.numel() * t.element_size() for _, t, _ in placed.values()) + (1 << 20)
                chunk, off = arena.alloc(nbytes)
                msg["ret"] = {"chunk": chunk, "offset": off, "nbytes": nbytes}
            reply = self._runner.request(msg)
            outs: dict[str, torch.Tensor] = {}
            for param, t, desc in placed.values():
                got = arena.view(desc)
                if param in sig.writes:
                    outs[param] = got.clone()
                    if copy_back:
                        t.copy_(got)
                elif not bits_equal(got, t.detach().contiguous()):
                    self._checks.append(Check(f"{name}: input {param!r} unchanged by the call", False, "inputs",
                                              {"param": param, "shape": list(t.shape)}))
            if op == "replay":
                return outs, reply
            result = self._decode(reply.get("result"), msg.get("ret"))
            return outs, result
        finally:
            arena.release(mark)

    def _decode(self, value: Any, region: dict | None) -> Any:
        if isinstance(value, dict):
            if value.get("t") == "tensor":
                if region is None or value.get("chunk") != region["chunk"]:
                    raise CandidateError("protocol", "ProtocolError", "a returned tensor outside its region")
                lo, hi = region["offset"], region["offset"] + region["nbytes"]
                t = self._runner.arena.view(value)
                off = int(value["offset"])
                if not (lo <= off and off + t.numel() * t.element_size() <= hi):
                    raise CandidateError("protocol", "ProtocolError", "a returned tensor outside its region")
                return t.clone()
            items = [self._decode(v, region) for v in value.get("items", [])]
            return tuple(items) if value.get("t") == "tuple" else items
        return value


def connect(runner: Runner, family: Family, source: str) -> RemoteModule:
    """Load ``source`` in ``runner`` and return the module stand-in (KNOBS read from the text, never run)."""
    from tik_evo.knobs import KnobsError, read_knobs

    functions = runner.load(source)
    try:
        knobs = read_knobs(source)
    except KnobsError:
        knobs = {}
    return RemoteModule(runner, family, functions, knobs)
