"""A misbehaving llama-server for the tests: an HTTP proxy on 127.0.0.1 in front of a real llama-server that
answers every request as the real one does, except the one a test names, which it answers wrongly.

A fault is ``(endpoint, nth, kind, arg)``: the ``nth`` request (from 1) to ``endpoint`` gets ``kind``.
Endpoints: ``health``, ``props``, ``restore``, ``erase``, ``save``, ``prefill`` (a completion with
``n_predict`` 0) and ``next`` (the next-token completion). Kinds:

* ``status``: an HTTP error ``arg`` (500, 404 ...) with llama-server's error JSON; ``message``: the same
  with ``arg`` as the message text (escapes, newlines);
* ``silent``: the request is read and never answered; ``close``: the connection closes unanswered;
* ``invalid``: 200 with a body that is not JSON; ``json``: 200 with ``arg`` as the JSON answer;
* ``trickle_head`` / ``trickle_body``: the answer one byte every 0.5 s (status line and headers, or the body
  of a valid-looking answer);
* ``huge``: 200 with an ``arg``-byte body, streamed;
* ``after``: forwarded, then ``arg(slot_dir, filename)`` is called (to replace what the server saved).

The slot folder is the real server's; the proxy never binds anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

TRICKLE_S = 0.5
HOLD_S = 120.0  # how long a silent or trickling answer lasts at most (the test's client gives up first)


def endpoint_of(method: str, path: str, body: Any) -> str:
    parts = urlsplit(path)
    if parts.path == "/health":
        return "health"
    if parts.path == "/props":
        return "props"
    if parts.path.startswith("/slots/"):
        return parts.query.partition("action=")[2] or "slots"
    if parts.path == "/completion":
        return "prefill" if isinstance(body, dict) and body.get("n_predict") == 0 else "next"
    return parts.path.strip("/")


class FakeServer:
    """Use as a context manager; ``url`` is the proxy's, ``slot_dir`` the real server's."""

    def __init__(self, upstream_url: str, slot_dir: str) -> None:
        self.upstream = urlsplit(upstream_url)
        self.slot_dir = slot_dir
        self.faults: list[tuple[str, int, str, Any]] = []
        self.seen: dict[str, int] = {}
        self.hits: list[str] = []  # "endpoint#n kind" for every fault served
        self._lock = threading.Lock()
        self._stop = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                fake.handle(self, method, raw, body)

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def fault(self, endpoint: str, kind: str, arg: Any = None, nth: int = 1) -> FakeServer:
        self.faults.append((endpoint, nth, kind, arg))
        return self

    # --- answering -----------------------------------------------------------------------------
    def handle(self, h: BaseHTTPRequestHandler, method: str, raw: bytes, body: Any) -> None:
        ep = endpoint_of(method, h.path, body)
        with self._lock:
            self.seen[ep] = n = self.seen.get(ep, 0) + 1
            fault = next(((k, a) for e, i, k, a in self.faults if e == ep and i == n), None)
            if fault is not None:
                self.hits.append(f"{ep}#{n} {fault[0]}")
        if fault is None:
            self._forward(h, method, raw)
            return
        kind, arg = fault
        if kind == "after":
            self._forward(h, method, raw, after=lambda: arg(self.slot_dir, (body or {}).get("filename")))
        elif kind in ("status", "message"):
            code = int(arg) if kind == "status" else 500
            text = f"fake failure {code}" if kind == "status" else str(arg)
            self._send(h, code, json.dumps({"error": {"code": code, "message": text, "type": "server_error"}}).encode())
        elif kind == "silent":
            self._stop.wait(HOLD_S)
        elif kind == "close":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.connection.shutdown(socket.SHUT_RDWR)
        elif kind == "invalid":
            self._send(h, 200, b"<html>not json{")
        elif kind == "json":
            self._send(h, 200, json.dumps(arg).encode())
        elif kind == "trickle_head":
            self._trickle(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"x" * 4096)
        elif kind == "trickle_body":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", "100000")
            h.end_headers()
            h.wfile.flush()
            self._trickle(h, b'{"status": "' + b"o" * 99000)
        elif kind == "huge":
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(int(arg)))
            h.end_headers()
            block = b" " * (1 << 20)
            with contextlib.suppress(OSError):
                for _ in range(int(arg) >> 20):
                    h.wfile.write(block)
        else:
            raise ValueError(f"unknown fault {kind!r}")

    def _send(self, h: BaseHTTPRequestHandler, code: int, data: bytes) -> None:
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _trickle(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        end = time.monotonic() + HOLD_S
        with contextlib.suppress(OSError):
            for i in range(len(data)):
                if self._stop.wait(TRICKLE_S) or time.monotonic() > end:
                    return
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()

    def _forward(self, h: BaseHTTPRequestHandler, method: str, raw: bytes,
                 after: Callable[[], None] | None = None) -> None:
        up = self.upstream
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=120)
        try:
            headers = {"Content-Type": "application/json"} if raw else {}
            conn.request(method, h.path, body=raw or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if after is not None:
            after()
        self._send(h, resp.status, data)

    def close(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
