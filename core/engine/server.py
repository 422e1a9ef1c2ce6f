"""llama-server as an engine: start one on loopback (:class:`ServerProcess`) and talk to it, or to a
server the user runs, over HTTP (:class:`ServerClient`). Stdlib only (``http.client``).

A started server listens on 127.0.0.1 on a free port, saves slots into a temporary folder unless one
is given, runs ``--offline`` and without its web UI where the build has those flags, and is stopped
(terminate, then kill) on close, on garbage collection and at interpreter exit. Its output goes to a
log file whose tail explains a failed start or a crash. Every client request is bounded in time,
and a client makes at most ``max_requests`` of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvscope.core.engine.abi import BINDING_ABI
from kvscope.core.engine.builds import BuildError, LlamaBuild, require_built
from kvscope.core.engine.http_bounded import Timeout, TooLarge, exchange
from kvscope.core.engine.janitor import janitor
from kvscope.core.errors import KvscopeError
from kvscope.core.textsafe import safe_text

_ENV_PREFIXES = ("LLAMA_", "GGML_")  # llama-server reads LLAMA_ARG_* from the environment
_LOG_TAIL = 64 * 1024
MAX_ANSWER = 16 << 20  # bytes of one JSON answer (a completion with top-40 probabilities is a few KiB)
_TEXT_MAX = 400  # characters of a server's message kept


class ServerError(KvscopeError):
    """A llama-server failure: one line for the user."""


class ServerSetupError(ServerError):
    """The server could not be started (no binary, not built, model not loaded, no /health in time)."""


class ServerHTTPError(ServerError):
    """The server answered with an HTTP error; ``message`` is the server's own."""

    def __init__(self, status: int, message: str, error_type: str | None = None, body: Any = None) -> None:
        message = safe_text(message, limit=_TEXT_MAX)  # the server's text: one line, no terminal escapes
        self.status, self.message, self.error_type, self.body = status, message, error_type, body
        super().__init__(f"HTTP {status}: {message}")


class ServerLimitError(ServerError):
    """The client's request budget (``max_requests``) is spent."""


class ServerDied(ServerError):
    """The server process we started is gone (crash or kill); ``log`` is the tail of its output."""

    def __init__(self, aborted: str, log: list[str]) -> None:
        self.aborted, self.log = aborted, log
        picked = [ln for ln in log if "GGML_ASSERT" in ln or "error" in ln.lower()] or log
        last = safe_text(picked[-1], limit=_TEXT_MAX) if picked else ""  # the server's log: no terminal escapes
        super().__init__(f"llama-server aborted: {aborted}" + (f": {last}" if last else ""))


def _exit_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HELP_TIMEOUT_S = 30.0  # seconds ``llama-server --help`` may take when the caller gives no --timeout


@cache
def _help_text(binary: str, mtime: float, timeout_s: float) -> str:
    """``binary --help``'s output, run in its own process group with its output in a file (a pipe would be
    held open by a child it leaves). No answer within ``timeout_s``: the group is killed and
    :class:`ServerSetupError` says so in one line (it was an internal error after a fixed 30 s, the
    process left running). Whatever the probe leaves running is killed too."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([binary, "--help"], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)},
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ServerSetupError(f"{binary} --help gave no answer within {timeout_s:g} s (it was stopped): not a "
                                   "llama-server kvscope can run") from None
        finally:
            if proc.poll() is None:  # not reaped yet, so its pid (the group's id) cannot have been reused
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the group: the probe and anything it started
                proc.wait()
        out.seek(0)
        return out.read(1 << 20).decode("utf-8", "replace")


def server_flags(binary: str | os.PathLike[str], timeout_s: float = HELP_TIMEOUT_S) -> set[str]:
    """Which of the optional flags kvscope uses (``--no-webui``, ``--offline``) this binary has (asked with
    ``--help``, given ``timeout_s`` seconds; :class:`ServerSetupError` when it does not answer)."""
    path = os.fspath(binary)
    text = _help_text(path, os.stat(path).st_mtime, float(timeout_s))
    return {f for f in ("--no-webui", "--offline") if f in text}


class ServerClient:
    """Talks to a running llama-server (ours, or the user's ``--server URL`` with its ``--slot-dir``)."""

    def __init__(self, url: str, slot_dir: str | os.PathLike[str] | None = None, *, max_requests: int = 100,
                 timeout_s: float = 60.0, process: ServerProcess | None = None) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{url!r} is not an http:// server address")
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self.slot_dir = os.fspath(slot_dir) if slot_dir is not None else None
        self.max_requests = max_requests
        self.timeout_s = timeout_s
        self.max_answer = MAX_ANSWER
        self.requests = 0  # made so far
        self._process = process

    # --- transport ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request; returns the decoded JSON. Raises ServerHTTPError, ServerDied, ServerLimitError, and
        ServerError when there is no complete answer within ``timeout_s`` (the whole exchange: a server
        trickling bytes is cut off), when the answer exceeds ``max_answer`` bytes, or on a broken connection."""
        if self.requests >= self.max_requests:
            raise ServerLimitError(f"request limit reached: {self.max_requests} requests to {self.url}")
        self.requests += 1
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        where = f"{method} {self.url}{path}"
        try:
            ans = exchange(self._scheme, self._host, self._port, method, self._prefix + path, data, headers,
                           self.timeout_s, self.max_answer)
        except Timeout:
            self._raise_if_dead()
            raise ServerError(f"{where}: no answer within {self.timeout_s:g} s") from None
        except TooLarge as e:
            raise ServerError(f"{where}: {e}") from None
        except OSError as e:
            self._raise_if_dead()
            raise ServerError(f"{where}: {safe_text(e.strerror or e, limit=_TEXT_MAX)}") from None
        raw = ans.body
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw.decode("utf-8", "replace")
        if ans.status >= 400:
            err = doc.get("error") if isinstance(doc, dict) else None
            if isinstance(err, dict):
                etype = err.get("type")
                raise ServerHTTPError(ans.status, str(err.get("message")), etype if isinstance(etype, str) else None,
                                      doc)
            raise ServerHTTPError(ans.status, str(err or doc or ans.reason), None, doc)
        if isinstance(doc, str):
            raise ServerError(f"{where}: the answer is not JSON: {safe_text(doc, limit=80)}")
        return doc

    def _raise_if_dead(self) -> None:
        """After a transport error: when our server is dying (it closes its sockets before its exit
        status is there), wait for it briefly and raise ServerDied."""
        p = self._process
        if p is not None and p.wait_exit(2.0) is not None:
            raise ServerDied(p.exit_reason or "exited", p.log_tail())

    # --- endpoints -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return _as_dict(self.request("GET", "/health"))

    def props(self) -> dict[str, Any]:
        return _as_dict(self.request("GET", "/props"))

    def slots(self) -> list[dict[str, Any]]:
        doc = self.request("GET", "/slots")
        if not isinstance(doc, list):
            raise ServerError(f"GET {self.url}/slots: expected a list, got {type(doc).__name__}")
        return doc

    def tokenize(self, content: str, add_special: bool = True) -> list[int]:
        doc = _as_dict(self.request("POST", "/tokenize", {"content": content, "add_special": add_special}))
        return [int(t if isinstance(t, int) else t["id"]) for t in doc.get("tokens", [])]

    def complete(self, prompt: str | list[int], n_predict: int = 1, id_slot: int = 0, **kw: Any) -> dict[str, Any]:
        """``POST /completion`` in ``id_slot`` with ``cache_prompt`` on (override either through ``kw``)."""
        body = {"prompt": prompt, "n_predict": n_predict, "id_slot": id_slot, "cache_prompt": True, **kw}
        return _as_dict(self.request("POST", "/completion", body))

    def slot_save(self, id_slot: int, filename: str) -> dict[str, Any]:
        return _as_dict(self.request("POST", f"/slots/{int(id_slot)}?action=save", {"filename": filename}))

    def slot_restore(self, id_slot: int, filename: str) -> dict[str, Any]:
        return _as_dict(self.request("POST", f"/slots/{int(id_slot)}?action=restore", {"filename": filename}))

    def slot_erase(self, id_slot: int) -> dict[str, Any]:
        return _as_dict(self.request("POST", f"/slots/{int(id_slot)}?action=erase", {}))

    def slot_path(self, filename: str) -> str:
        """Where the server keeps ``filename`` (needs the slot folder)."""
        if self.slot_dir is None:
            raise ServerError("the server's slot folder is not known (give --slot-dir)")
        return os.path.join(self.slot_dir, filename)


def _as_dict(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ServerError(f"expected a JSON object from the server, got {type(doc).__name__}")
    return doc


def _stop(proc: subprocess.Popen[bytes], log: Any, remove: list[str]) -> None:
    """Terminate, then kill, the server; close its log and remove our temporary folders."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
    janitor().release(proc.pid, remove)


class ServerProcess:
    """A llama-server we started on 127.0.0.1; a context manager. ``url`` and ``slot_dir`` say where it is."""

    def __init__(self, model: str | os.PathLike[str], *, build: str | None = None,
                 binary: str | os.PathLike[str] | None = None, slot_dir: str | os.PathLike[str] | None = None,
                 args: Sequence[str] = (), timeout_s: float = 60.0, n_parallel: int = 1, n_ctx: int | None = None,
                 threads: int | None = 2, env: Mapping[str, str] | None = None,
                 help_timeout_s: float = HELP_TIMEOUT_S) -> None:
        self.model = os.path.abspath(model)
        if not os.path.isfile(self.model):
            raise ServerSetupError(f"{model}: no such model file")
        self.build, self.binary = self._resolve_binary(build, binary)
        flags = server_flags(self.binary, help_timeout_s)  # before anything is made that would need removing
        self.timeout_s = timeout_s
        self._tmp = tempfile.mkdtemp(prefix="kvscope-server-")
        janitor().watch_dir(self._tmp)  # removed even when kvscope is killed
        remove = [self._tmp]
        if slot_dir is None:
            self.slot_dir = os.path.join(self._tmp, "slots")
        else:
            self.slot_dir = os.path.abspath(slot_dir)
        os.makedirs(self.slot_dir, exist_ok=True)
        self.log_path = os.path.join(self._tmp, "server.log")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by _stop)
        run_env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
        run_env["GGML_NO_BACKTRACE"] = "1"  # an assert would otherwise attach gdb for seconds
        run_env.update(env or {})
        self.env = {k: v for k, v in run_env.items() if k.startswith(_ENV_PREFIXES)}
        base = [self.binary, "-m", self.model, "--host", "127.0.0.1", "-np", str(n_parallel),
                "--slot-save-path", self.slot_dir]
        if n_ctx is not None:
            base += ["-c", str(n_ctx)]
        if threads is not None:
            base += ["-t", str(threads)]
        base += sorted(flags)
        self.exit_reason: str | None = None
        for attempt in range(3):  # a port taken between our probe and the server's bind: try another
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.command = [*base, "--port", str(self.port), *args]
            start = self._log.tell()
            # its own process group, stopped by the janitor should kvscope die without closing it
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, env=run_env, start_new_session=True)
            janitor().watch_group(self._proc.pid)
            self._finalizer = weakref.finalize(self, _stop, self._proc, self._log, remove)
            try:
                self._wait_healthy()
                return
            except ServerSetupError:
                self._proc.wait()
                retry = "couldn't bind" in self._log_text(start) and attempt < 2
                if not retry:
                    self._finalizer()
                    raise
                self._finalizer.detach()
                janitor().forget("group", self._proc.pid)

    @staticmethod
    def _resolve_binary(build: str | None, binary: str | os.PathLike[str] | None) -> tuple[LlamaBuild | None, str]:
        if build is not None and binary is not None:
            raise ServerSetupError("give either a build name or a llama-server binary, not both")
        if binary is not None:
            path = Path(binary).expanduser().resolve()
            if not path.is_file() or not os.access(path, os.X_OK):
                raise ServerSetupError(f"{binary}: not an executable llama-server")
            return None, str(path)
        try:
            have = require_built(build or BINDING_ABI)
        except BuildError as e:
            raise ServerSetupError(str(e)) from None
        return have.build, str(have.server)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        probe = ServerClient(self.url, max_requests=1 << 30, timeout_s=2.0)
        while True:
            rc = self._proc.poll()
            if rc is not None:
                self.exit_reason = _exit_name(rc)
                raise ServerSetupError(f"llama-server exited ({self.exit_reason}) while starting: {self._why()}")
            try:
                if probe.health().get("status") == "ok":
                    return
            except ServerHTTPError as e:
                if e.status != 503:  # 503 = still loading the model
                    raise ServerSetupError(f"llama-server /health answered HTTP {e.status}: {e.message}") from None
            except ServerError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                self._proc.kill()
                raise ServerSetupError(f"llama-server was not healthy within {self.timeout_s:g} s: {self._why()}")
            time.sleep(0.05)

    def _log_text(self, start: int = 0) -> str:
        self._log.flush()
        try:
            with open(self.log_path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(start, size - _LOG_TAIL))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _why(self) -> str:
        lines = self.log_tail()
        bad = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower() or "GGML_ASSERT" in ln]
        return (bad or lines or ["no output"])[-1]

    def log_tail(self, n: int = 40) -> list[str]:
        """The last ``n`` lines of the server's output."""
        return [ln.rstrip() for ln in self._log_text().splitlines() if ln.strip()][-n:]

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._note_exit() is None

    def wait_exit(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the server to exit: its exit code, or None while it runs."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self._note_exit()

    def _note_exit(self) -> int | None:
        rc = self._proc.poll()
        if rc is not None and self.exit_reason is None:
            self.exit_reason = _exit_name(rc)
        return rc

    def client(self, *, max_requests: int = 100, timeout_s: float | None = None) -> ServerClient:
        """A client for this server; its errors name the server's crash when it died."""
        return ServerClient(self.url, self.slot_dir, max_requests=max_requests,
                            timeout_s=self.timeout_s if timeout_s is None else timeout_s, process=self)

    def close(self) -> None:
        """Stop the server and remove its temporary folder (the slot folder too, unless it was given)."""
        if self._note_exit() is None:
            self.exit_reason = "stopped"
        self._finalizer()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
