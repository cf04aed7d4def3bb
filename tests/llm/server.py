"""A scripted OpenAI-compatible chat server on 127.0.0.1, reached by litellm over real HTTP.

Each request pops the next scripted reply (or asks ``default(body)`` when the script is empty). A reply is a
dict: ``content`` (the assistant text), ``status`` (HTTP code, 200 unless an error is scripted),
``usage`` ((prompt, completion) tokens), ``model`` (what the response names), ``retry_after`` (a Retry-After
header on an error), ``hang`` (seconds to stall before answering: a server that never answers within the caller's
timeout).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedServer:
    def __init__(self) -> None:
        self.script: deque[dict[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                body["_auth"] = self.headers.get("Authorization", "")
                with server._lock:
                    server.requests.append(body)
                    reply = server.script.popleft() if server.script else None
                if reply is None:
                    reply = server.default(body) if server.default else {"content": "no script left"}
                if reply.get("hang"):
                    server._stop.wait(reply["hang"])
                status = reply.get("status", 200)
                if status != 200:
                    extra = {"Retry-After": reply["retry_after"]} if "retry_after" in reply else {}
                    return self._send(status, {"error": {"message": reply.get("content", f"scripted {status}"),
                                                         "type": "scripted", "code": str(status)}}, extra)
                p, c = reply.get("usage", (100, 20))
                self._send(200, {
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": reply.get("model", body.get("model", "scripted")),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply.get("content", "")}}],
                    "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False  # a hanging handler must not hold up shutdown
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def push(self, *replies: dict[str, Any]) -> None:
        with self._lock:
            self.script.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.script.clear()
            self.requests.clear()
            self.default = None

    def start(self) -> ScriptedServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
