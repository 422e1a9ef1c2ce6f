"""One HTTP/1.1 exchange bounded in time and in size, for talking to a llama-server (stdlib only).

``http.client`` checks a timeout per socket read, so a server that trickles a byte every half
second keeps it waiting forever (in the status line, the headers or the body), and it reads a body
of any length into memory. :func:`exchange` sends one request (``Connection: close``) and reads
the answer against one deadline for the whole exchange, connection included, and refuses an
answer larger than ``max_bytes``: :class:`Timeout` or :class:`TooLarge`. The body may come with a
``Content-Length``, chunked, or up to the end of the connection.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass

MAX_HEAD = 64 << 10  # status line and headers


class HTTPFailure(OSError):
    """The exchange failed (connection refused or closed, malformed answer)."""


class Timeout(HTTPFailure):
    """The deadline passed."""


class TooLarge(HTTPFailure):
    """The answer is larger than allowed."""


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


class _Conn:
    def __init__(self, sock: socket.socket, deadline: float, max_bytes: int) -> None:
        self.sock, self.deadline, self.max_bytes = sock, deadline, max_bytes
        self.buf = bytearray()
        self.total = 0
        self.eof = False

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Timeout("no complete answer in time")
        return left

    def fill(self) -> None:
        """Read what arrives next (at least one byte, or EOF), within the deadline."""
        self.sock.settimeout(self._left())
        try:
            chunk = self.sock.recv(1 << 16)
        except TimeoutError:
            raise Timeout("no complete answer in time") from None
        if not chunk:
            self.eof = True
            return
        self.total += len(chunk)
        if self.total > self.max_bytes + MAX_HEAD:
            raise TooLarge(f"the answer exceeds {self.max_bytes >> 20} MiB")
        self.buf += chunk

    def line(self) -> bytes:
        while True:
            at = self.buf.find(b"\r\n")
            if at >= 0:
                out = bytes(self.buf[:at])
                del self.buf[:at + 2]
                return out
            if len(self.buf) > MAX_HEAD:
                raise TooLarge("the answer's headers exceed 64 KiB")
            if self.eof:
                raise HTTPFailure("the connection closed in the middle of the answer")
            self.fill()

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if self.eof:
                raise HTTPFailure("the connection closed in the middle of the answer")
            self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def rest(self) -> bytes:
        while not self.eof:
            self.fill()
        out = bytes(self.buf)
        self.buf.clear()
        return out


def _connect(scheme: str, host: str, port: int, deadline: float) -> socket.socket:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Timeout("no connection in time")
    try:
        sock = socket.create_connection((host, port), timeout=left)
    except TimeoutError:
        raise Timeout("no connection in time") from None
    if scheme == "https":
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except TimeoutError:
            sock.close()
            raise Timeout("no TLS handshake in time") from None
    return sock


def _body(c: _Conn, headers: dict[str, str], method: str, status: int) -> bytes:
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                n = int(c.line().split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                raise HTTPFailure("a malformed chunked body") from None
            if n == 0:
                return b"".join(parts)
            size += n
            if size > c.max_bytes:
                raise TooLarge(f"the answer exceeds {c.max_bytes >> 20} MiB")
            parts.append(c.take(n))
            c.take(2)
    length = headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            raise HTTPFailure(f"a malformed Content-Length {length[:40]!r}") from None
        if n < 0:
            raise HTTPFailure(f"a malformed Content-Length {length[:40]!r}")
        if n > c.max_bytes:
            raise TooLarge(f"the answer is {n} bytes, more than {c.max_bytes >> 20} MiB")
        return c.take(n)
    return c.rest()


def exchange(scheme: str, host: str, port: int, method: str, target: str, body: bytes | None,
             headers: dict[str, str], timeout_s: float, max_bytes: int) -> Answer:
    """Send one request and read the whole answer within ``timeout_s``; see the module docstring."""
    deadline = time.monotonic() + timeout_s
    sock = _connect(scheme, host, port, deadline)
    try:
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
                f"Content-Length: {len(body or b'')}", *(f"{k}: {v}" for k, v in headers.items())]
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            sock.sendall(data)
        except TimeoutError:
            raise Timeout("the request could not be sent in time") from None
        c = _Conn(sock, deadline, max_bytes)
        while True:
            status_line = c.line().decode("latin-1")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise HTTPFailure(f"not an HTTP answer: {status_line[:60]!r}")
            status = int(parts[1])
            fields: dict[str, str] = {}
            while True:
                ln = c.line()
                if not ln:
                    break
                k, sep, v = ln.decode("latin-1").partition(":")
                if sep:
                    fields[k.strip().lower()] = v.strip()
            if status != 100:
                break
        return Answer(status, parts[2] if len(parts) > 2 else "", fields, _body(c, fields, method, status))
    finally:
        sock.close()
