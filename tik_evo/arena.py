"""Memory the judge and a candidate's runner share: the only way tensors cross between them.

The judge owns the arena: it allocates slots, copies a call's arguments in and reads outputs out; the runner maps
the same chunks and builds tensor views from descriptors (chunk, byte offset, dtype, shape). On the CPU a chunk
is a memfd (anonymous: no other process can open it by name), passed to the runner over the channel; on a GPU
it is a CUDA allocation shared by an IPC handle. Slots are bump-allocated: a call's slots are released after it
(`mark`/`release`), a timing plan's stay for the plan's life.
"""

from __future__ import annotations

import base64
import mmap
import os
import re
from dataclasses import dataclass

import torch

from tik_evo.channel import Channel

ALIGN = 256  # every slot: 16-byte alignment for vector loads and TMA descriptors, 256 for good measure
CHUNK_BYTES = 64 << 20
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool)}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"dtype {dtype} cannot cross to the runner")
    return name


class ArenaError(RuntimeError):
    """The runner could not map the judge's memory: no verdict on the candidate."""

    kind = "infrastructure"


@dataclass
class Chunk:
    data: torch.Tensor  # uint8, the whole chunk
    used: int = 0
    keep: object = None  # the mmap behind a CPU chunk


def _cpu_chunk(nbytes: int, fd: int | None = None) -> tuple[Chunk, int]:
    if fd is None:
        fd = os.memfd_create("tik_evo_arena", 0)
        os.ftruncate(fd, nbytes)
    mm = mmap.mmap(fd, nbytes)
    return Chunk(torch.frombuffer(mm, dtype=torch.uint8, count=nbytes), keep=mm), fd


class Arena:
    """The judge's side."""

    def __init__(self, device: str, channel: Channel):
        self.device, self.channel = device, channel
        self.chunks: list[Chunk] = []

    def _new_chunk(self, nbytes: int) -> None:
        nbytes = max(CHUNK_BYTES, -(-nbytes // ALIGN) * ALIGN)
        msg: dict = {"op": "chunk", "id": len(self.chunks), "nbytes": nbytes}
        if self.device == "cpu":
            chunk, fd = _cpu_chunk(nbytes)
            self.channel.send(msg, fds=[fd])
            os.close(fd)
        else:
            self.channel.send({**msg, "cuda": True})
        reply = self.channel.recv(timeout=120)
        if not reply.get("ok"):
            error = str(reply.get("error"))
            if "OutOfMemoryError" in error:  # the card is full (audits side by side): no sandbox problem
                e = ArenaError(f"the runner could not make arena chunk {msg['id']} ({self.device}): out of device "
                               f"memory:\n{error}")
                e.type_name = "OutOfMemoryError"  # a check shard's case is then rerun in the worker (tik_evo.shards)
                raise e
            raise ArenaError(f"the runner could not make arena chunk {msg['id']} ({self.device}); if this machine "
                             "keeps CUDA IPC from a confined process, evaluate.sandbox=off runs the audit without "
                             f"the namespaces and capability drop:\n{error}")
        if self.device != "cpu":
            chunk = Chunk(_open_cuda(reply.get("cuda"), nbytes))
        self.chunks.append(chunk)

    def mark(self) -> tuple[int, int]:
        return len(self.chunks), (self.chunks[-1].used if self.chunks else 0)

    def release(self, mark: tuple[int, int]) -> None:
        n, used = mark
        for c in self.chunks[n:]:
            c.used = 0
        if n:
            self.chunks[n - 1].used = used

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """(chunk, byte offset) of a fresh slot of ``nbytes``: the first chunk with room after the last used."""
        nbytes = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for i, c in enumerate(self.chunks):
            later_used = any(d.used for d in self.chunks[i + 1:])
            if not later_used and c.used + nbytes <= c.data.numel():
                off = c.used
                c.used += nbytes
                return i, off
        self._new_chunk(nbytes)
        self.chunks[-1].used = nbytes
        return len(self.chunks) - 1, 0

    def view(self, desc: dict) -> torch.Tensor:
        return view(self.chunks, desc)

    def place(self, t: torch.Tensor) -> dict:
        """A slot holding a contiguous copy of ``t``; its descriptor."""
        nbytes = t.numel() * t.element_size()
        chunk, off = self.alloc(nbytes)
        desc = {"t": "tensor", "chunk": chunk, "offset": off, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
        if t.numel():
            self.view(desc).copy_(t)
        return desc


# The runner's export of a chunk: (device, handle, size, offset, ref-counter name, its offset, event handle,
# event sync flag), as torch's CUDA IPC shares a storage. It comes from the candidate's process, so every field is
# checked before the judge opens it: the judge only ever maps what the runner allocated for it.
_REF_NAME = re.compile(rb"/torch_[0-9A-Za-z_]+")


def _open_cuda(fields: object, nbytes: int) -> torch.Tensor:
    if not isinstance(fields, list) or len(fields) != 8:
        raise ArenaError(f"a CUDA chunk export of {type(fields).__name__}, not 8 fields")
    dev, handle, size, off, ref, ref_off, event, sync = (base64.b64decode(x) if isinstance(x, str) else x
                                                         for x in fields)
    if (not isinstance(handle, bytes) or size != nbytes or not isinstance(off, int) or off < 0
            or not isinstance(ref, bytes) or not _REF_NAME.fullmatch(ref) or not isinstance(ref_off, int)
            or not isinstance(event, bytes) or not isinstance(sync, bool) or dev != torch.cuda.current_device()):
        raise ArenaError("a CUDA chunk export that is not the chunk asked for")
    storage = torch.UntypedStorage._new_shared_cuda(dev, handle, size, off, ref, ref_off, event, sync)
    return torch.empty(0, dtype=torch.uint8, device=f"cuda:{dev}").set_(storage)


def view(chunks: list[Chunk], desc: dict) -> torch.Tensor:
    """The tensor a descriptor names, as a view of its chunk (bounds checked: descriptors come over a channel)."""
    dtype = DTYPES[desc["dtype"]]
    shape = [int(s) for s in desc["shape"]]
    if any(s < 0 for s in shape):
        raise ValueError(f"negative size in {shape}")
    chunk = chunks[int(desc["chunk"])].data
    off = int(desc["offset"])
    numel = 1
    for s in shape:
        numel *= s
    size = dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty(0, dtype=dtype).element_size()
    end = off + numel * size
    if off < 0 or off % ALIGN or end > chunk.numel():
        raise ValueError(f"slot [{off}, {end}) outside its chunk of {chunk.numel()} bytes")
    return chunk[off:end].view(dtype).view(shape)


class RunnerArena:
    """The runner's side: the judge's chunks, mapped."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def add(self, msg: dict, fds: list[int]) -> dict:
        """Map (CPU) or allocate and export (GPU) chunk ``msg["id"]``; the reply's extra fields."""
        if int(msg["id"]) != len(self.chunks):
            raise ValueError(f"chunk {msg['id']} out of order")
        if msg.get("cuda"):
            # Allocated here and opened by the judge, not the other way round: opening an IPC handle may need
            # ptrace-like access to the exporting process, which the judge has to this one and not back.
            data = torch.empty(int(msg["nbytes"]), dtype=torch.uint8, device="cuda")
            self.chunks.append(Chunk(data))
            share = data.untyped_storage()._share_cuda_()
            return {"cuda": [base64.b64encode(x).decode() if isinstance(x, bytes) else x for x in share]}
        else:
            chunk, fd = _cpu_chunk(int(msg["nbytes"]), fds[0])
            os.close(fd)
            self.chunks.append(chunk)
            return {}

    def view(self, desc: dict) -> torch.Tensor:
        return view(self.chunks, desc)
