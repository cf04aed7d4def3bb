"""The judge/runner arena and channel: what crosses between them, and what the judge refuses from the runner."""

import base64
from pathlib import Path

import pytest
import torch

from tik_evo.arena import ALIGN, ArenaError, Chunk, _open_cuda, view
from tik_evo.channel import MAX_MESSAGE, Channel, ChannelError


def test_a_slot_outside_its_chunk_is_refused():
    chunks = [Chunk(torch.zeros(4 * ALIGN, dtype=torch.uint8))]
    assert view(chunks, {"chunk": 0, "offset": ALIGN, "dtype": "float32", "shape": [2, 4]}).shape == (2, 4)
    for bad in ({"offset": 3 * ALIGN, "shape": [ALIGN]}, {"offset": 1, "shape": [1]}, {"offset": 0, "shape": [-1]}):
        with pytest.raises(ValueError):
            view(chunks, {"chunk": 0, "dtype": "float32", **bad})


@pytest.mark.parametrize("fields", [
    "not a list", [0] * 7,
    [0, base64.b64encode(b"h" * 64).decode(), 1024, 0, base64.b64encode(b"/etc/passwd").decode(), 0,
     base64.b64encode(b"e").decode(), False],
    [0, base64.b64encode(b"h" * 64).decode(), 999, 0, base64.b64encode(b"/torch_1_2").decode(), 0,
     base64.b64encode(b"e").decode(), False],
])
def test_a_cuda_export_that_is_not_the_chunk_asked_for_is_refused(fields):
    # The export comes from the candidate's process: a path outside shared memory, a wrong size, a short list.
    with pytest.raises(ArenaError):
        _open_cuda(fields, 1024)


def test_the_channel_refuses_oversized_and_non_json_replies():
    a, b = Channel.pair()
    b.sock.sendall((MAX_MESSAGE + 1).to_bytes(4, "big"))
    with pytest.raises(ChannelError, match="over the"):
        a.recv(timeout=5)
    a, b = Channel.pair()
    b.sock.sendall((5).to_bytes(4, "big") + b"\xff\xfe{}x")
    with pytest.raises(ChannelError, match="not a JSON"):
        a.recv(timeout=5)
    a, b = Channel.pair()
    b.send({"ok": True})
    assert a.recv(timeout=5) == {"ok": True}


def test_the_judge_waits_for_its_arena_copies_before_the_runner_reads_them(monkeypatch):
    # The judge's copies into the arena and the runner's kernels run in two processes: nothing orders them but the
    # judge's synchronize before each request. Missing, a busy GPU let runners read stale inputs.
    from tik_evo import remote

    events = []
    a, b = Channel.pair()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: events.append("sync"))
    real_send = a.send
    monkeypatch.setattr(a, "send", lambda msg, **kw: (events.append("send"), real_send(msg, **kw)))
    runner = remote.Runner(0, a, "cuda", Path("."), {})
    b.send({"ok": True})
    assert runner.request({"op": "call"}) == {"ok": True}
    assert events == ["sync", "send"]
    cpu = remote.Runner(0, a, "cpu", Path("."), {})
    events.clear()
    b.send({"ok": True})
    cpu.request({"op": "call"})
    assert events == ["send"]


class _Refusing:
    """A runner's end of the channel that fails to make a chunk with `error`."""

    def __init__(self, error: str):
        self.error = error

    def send(self, msg, fds=()):
        pass

    def recv(self, timeout=None):
        return {"ok": False, "error": self.error}


def test_a_full_card_is_out_of_memory_and_other_chunk_failures_are_infrastructure():
    # Out of memory (audits side by side on one card) lets a check shard's case rerun in the worker; any other
    # failure to make a chunk stays an infrastructure failure naming the sandbox as the likely cause.
    from tik_evo.arena import Arena
    from tik_evo.failure import error_kind

    with pytest.raises(ArenaError) as oom:
        Arena("cuda", _Refusing("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256 MiB"))._new_chunk(8)
    assert oom.value.type_name == "OutOfMemoryError" and "out of device memory" in str(oom.value)
    with pytest.raises(ArenaError) as other:
        Arena("cuda", _Refusing("RuntimeError: pidfd_getfd: Operation not permitted"))._new_chunk(8)
    assert getattr(other.value, "type_name", None) is None and "evaluate.sandbox=off" in str(other.value)
    assert error_kind(oom.value) == error_kind(other.value) == "infrastructure"
