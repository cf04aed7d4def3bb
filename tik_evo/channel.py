"""The judge <-> runner channel: length-prefixed JSON over a Unix socket pair, file descriptors beside it.

JSON in both directions, never pickle: the judge parses what a candidate's process sends, so a message can only
be data (bounded in size), never code. The runner answers every request once; the judge waits with a deadline.
"""

from __future__ import annotations

import array
import json
import select
import socket
import struct
import time
from typing import Any

MAX_MESSAGE = 16 << 20  # a reply larger than this is a protocol violation, not data
_HEADER = struct.Struct("!I")


class ChannelError(RuntimeError):
    """The other side hung up, overran a deadline or sent something that is not a message."""


class ChannelTimeout(ChannelError):
    pass


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def pair(cls) -> tuple[Channel, Channel]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(a), cls(b)

    def send(self, msg: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(msg).encode()
        frame = _HEADER.pack(len(data)) + data
        try:
            if fds:
                self.sock.sendmsg([frame[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                frame = frame[1:]
            self.sock.sendall(frame)
        except OSError as e:
            raise ChannelError(f"send failed: {e}") from None

    def _read(self, n: int, deadline: float | None, fds: list[int] | None = None) -> bytes:
        buf = b""
        while len(buf) < n:
            if deadline is not None:
                left = deadline - time.time()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise ChannelTimeout("no answer before the deadline")
            if fds is not None and not buf:
                data, anc, _, _ = self.sock.recvmsg(n, socket.CMSG_SPACE(64 * 4))
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        a = array.array("i")
                        a.frombytes(payload[: len(payload) - len(payload) % a.itemsize])
                        fds.extend(a)
            else:
                data = self.sock.recv(n - len(buf))
            if not data:
                raise ChannelError("the other side closed the channel")
            buf += data
        return buf

    def recv(self, timeout: float | None = None, fds: list[int] | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.time() + timeout
        (n,) = _HEADER.unpack(self._read(_HEADER.size, deadline, fds))
        if n > MAX_MESSAGE:
            raise ChannelError(f"message of {n} bytes, over the {MAX_MESSAGE}-byte limit")
        try:
            msg = json.loads(self._read(n, deadline))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ChannelError(f"not a JSON message: {e}") from None
        if not isinstance(msg, dict):
            raise ChannelError("a message must be a JSON object")
        return msg

    def close(self) -> None:
        self.sock.close()
