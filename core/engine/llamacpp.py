"""libllama in a child process, driven from kvscope (parent side: stdlib + numpy only).

:class:`LlamaProcess` starts ``python -m kvscope.core.engine.worker`` with ``LLAMA_CPP_LIB_PATH``
set to a pinned build's ``lib/`` folder (``builds``) or a user's own one, and talks to it over two
pipes (``protocol``: JSON headers, raw payloads). One child holds one model and one context. A
``GGML_ASSERT`` abort, a segfault or a hang (every call has a timeout) ends only the child: the
call returns an :class:`Outcome` with ``aborted`` set and the last llama.cpp log lines, and later
calls raise :class:`EngineDied`. llama-cpp-python is never imported in this process.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from kvscope.core.engine import protocol
from kvscope.core.engine.abi import (
    BINDING_ABI,
    BINDING_LABEL,
    BINDING_PACKAGE,
    BINDING_VERSION,
    INSTALL_HINT,
    ABIMismatch,
    LibIdentity,
    identify,
)
from kvscope.core.engine.builds import BuildError, require_built
from kvscope.core.engine.janitor import janitor
from kvscope.core.errors import KvscopeError

PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (= the older SWA_ONLY)
ON_DEVICE = 2  # LLAMA_STATE_SEQ_FLAGS_ON_DEVICE
_ENV_PREFIXES = ("LLAMA_", "GGML_")  # inherited settings that would change what llama.cpp builds
_STDERR_TAIL = 32 * 1024
# the C types of llama_context_params' integer fields (uint32_t; n_threads is int32_t)
_C_MAX = {"n_ctx": (1 << 32) - 1, "n_batch": (1 << 32) - 1, "n_ubatch": (1 << 32) - 1, "n_seq_max": (1 << 32) - 1,
          "n_threads": (1 << 31) - 1}


def short_line(line: str) -> str:
    """A log line with a leading source path cut to its file name (``/.../llama-context.cpp:3373: ...``
    -> ``llama-context.cpp:3373: ...``; ggml asserts name the folder the build ran in)."""
    return re.sub(r"^\S*/([^/\s]+:\d+: )", r"\1", line.strip())


class EngineError(KvscopeError):
    """A request the engine refused (bad argument); the process stays usable."""


class EngineSetupError(EngineError):
    """The engine cannot start: binding missing, build not built, ABI mismatch, model unloadable."""


class EngineDied(EngineError):
    """The child process is gone (crash, timeout or close); every later call raises this too."""

    def __init__(self, aborted: str, log: list[str], stderr: list[str] | None = None, *, now: bool = False) -> None:
        self.aborted = aborted
        self.log = log
        self.stderr = stderr or []
        self.now = now  # it died during the call that raised this
        last = short_line((log or self.stderr or [""])[-1])
        super().__init__(f"llama.cpp engine {'closed' if aborted == 'closed' else 'aborted: ' + aborted}"
                         + (f": {last}" if last else ""))


class ABIWarning(UserWarning):
    """The library's ABI could not be verified (a build kvscope did not make)."""


@dataclass(frozen=True)
class CtxParams:
    """The llama_context_params kvscope sets; everything else stays at llama.cpp's default."""

    n_ctx: int = 512
    n_batch: int = 256
    n_ubatch: int = 256
    n_seq_max: int = 1
    kv_unified: bool = True
    flash_attn: bool | None = None  # None = auto
    type_k: str = "f16"  # a ggml type name (gguf's GGMLQuantizationType)
    type_v: str = "f16"
    swa_full: bool = True
    n_threads: int = 2
    env: tuple[tuple[str, str], ...] = ()  # set in the child before libllama loads

    def __post_init__(self) -> None:
        for name in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"CtxParams.{name} must be a positive integer, not {v!r}")
            if v > _C_MAX[name]:  # ctypes would cut it silently: 2**32 + 512 would become 512
                raise ValueError(f"CtxParams.{name} {v} is beyond llama.cpp's {_C_MAX[name].bit_length()}-bit field")
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"CtxParams.n_ubatch ({self.n_ubatch}) exceeds n_batch ({self.n_batch})")
        for k, v in self.env:
            if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k + v:
                raise ValueError(f"CtxParams.env entry {(k, v)!r} is not a (NAME, value) pair of strings")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["env"] = dict(self.env)
        return d


@dataclass
class Outcome:
    """What one engine call did."""

    ok: bool  # the call returned normally (its own return value may still say failure)
    value: Any  # the call's return value (bytes read, tokens, logits ...)
    log: list[str]  # llama.cpp log lines emitted during the call (all but DEBUG), and a ggml abort message
    aborted: str | None  # "SIGABRT", "SIGSEGV", "timeout", "exit N" when the child died; None otherwise
    rc: Any = None  # the C function's own return value (llama_decode's code, bytes read, true/false)
    stderr: list[str] = field(default_factory=list)  # the child's stderr during a call that killed it

    def summary(self) -> str:
        """One line: ``ok``, or ``engine aborted: SIGABRT: <last log line>``."""
        if self.aborted is None:
            return "ok" if self.ok else "failed"
        last = short_line((self.log or self.stderr or [""])[-1])
        return f"engine aborted: {self.aborted}" + (f": {last}" if last else "")


def binding_problem() -> str | None:
    """Why the binding cannot be used here (one line), or None. Imports nothing."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed: {INSTALL_HINT}"
    try:
        version = importlib.metadata.version(BINDING_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None  # importable from a source tree: the child checks __version__
    if version != BINDING_VERSION:
        return f"llama-cpp-python {version} is installed; kvscope needs {BINDING_VERSION}: {INSTALL_HINT}"
    return None


def resolve_library(build: str | None = None, lib_path: str | os.PathLike[str] | None = None) -> LibIdentity:
    """The libllama folder to load: a pinned build by name, a user's folder, else the binding's own build."""
    if build is not None and lib_path is not None:
        raise EngineSetupError("give either a build name or a library folder, not both")
    if lib_path is not None:
        lib_dir = Path(lib_path).expanduser().resolve()
        if not (lib_dir / "libllama.so").exists() and (lib_dir / "lib" / "libllama.so").exists():
            lib_dir = lib_dir / "lib"  # the build's root folder was given
        if not (lib_dir / "libllama.so").exists():
            raise EngineSetupError(f"no libllama.so in {lib_dir}")
    else:
        try:
            lib_dir = require_built(build or BINDING_ABI).lib_dir
        except BuildError as e:
            raise EngineSetupError(str(e)) from None
    try:
        return identify(lib_dir)
    except ABIMismatch as e:
        raise EngineSetupError(str(e)) from None


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def _reap(proc: subprocess.Popen[bytes], fds: list[int], err: IO[bytes], scratch: list[str]) -> None:
    """Stop the child, free the pipes and remove the scratch folders (close(), garbage collection and
    interpreter exit)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)  # the child sees EOF and exits
    fds.clear()
    if proc.poll() is None:
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err.close()
    janitor().release(proc.pid, scratch)


def _reap_unstarted(fds: list[int], err: IO[bytes], scratch: list[str]) -> None:
    for fd in fds:
        os.close(fd)
    err.close()
    for d in scratch:
        shutil.rmtree(d, ignore_errors=True)


class LlamaProcess:
    """One child process = one model + one context. Use as a context manager (or call close())."""

    def __init__(self, model: str | os.PathLike[str], ctx: CtxParams | None = None, *, build: str | None = None,
                 lib_path: str | os.PathLike[str] | None = None, timeout_s: float = 120.0) -> None:
        self.ctx_params = ctx = ctx if ctx is not None else CtxParams()
        self.timeout_s = timeout_s  # for every call, model loading included; may be changed later
        self.model = os.path.abspath(model)
        problem = binding_problem()
        if problem:
            raise EngineSetupError(problem)
        if not os.path.isfile(self.model):
            raise EngineSetupError(f"{model}: no such model file")
        self.identity = ident = resolve_library(build, lib_path)
        if ident.warning:
            warnings.warn(ident.warning, ABIWarning, stacklevel=2)
        self._lock = threading.Lock()
        self._dead: EngineDied | None = None
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
        env["LLAMA_CPP_LIB_PATH"] = str(ident.lib_dir)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(ident.lib_dir), os.environ.get("LD_LIBRARY_PATH"))
                                                 if p)
        env["GGML_NO_BACKTRACE"] = "1"  # no gdb attach on std::terminate; the abort callback reports asserts
        env.update(dict(ctx.env))
        self.env = {k: v for k, v in env.items() if k.startswith(_ENV_PREFIXES)}
        req_r, self._wfd = os.pipe()
        self._rfd, rep_w = os.pipe()
        for fd in (req_r, rep_w):
            protocol.enlarge_pipe(fd)
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)
        self._err = tempfile.TemporaryFile(prefix="kvscope-llama-")  # noqa: SIM115 (closed by _reap)
        self._err_mark = 0  # stderr size at the last reply
        self._scratch = protocol.make_scratch()  # large payloads travel through files here
        for d in self._scratch:
            janitor().watch_dir(d)  # removed even when kvscope is killed
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kvscope.core.engine.worker", str(req_r), str(rep_w)], pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL, stdout=self._err, stderr=self._err, env=env, close_fds=True,
                start_new_session=True)  # its own group: the janitor stops it should kvscope be killed
        except OSError as e:
            _reap_unstarted([self._wfd, self._rfd], self._err, self._scratch)
            raise EngineSetupError(f"cannot start the engine process: {e}") from None
        finally:
            os.close(req_r)  # the child holds its own copies
            os.close(rep_w)
        janitor().watch_group(self._proc.pid)
        self._fds = [self._wfd, self._rfd]
        self._finalizer = weakref.finalize(self, _reap, self._proc, self._fds, self._err, self._scratch)
        self._reader = protocol.Reader(self._rfd)
        self._info = self._start()

    # --- plumbing ----------------------------------------------------------------------------
    def _start(self) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            setup = {"model": self.model, "ctx": self.ctx_params.to_json(), "scratch": self._scratch}
            reply, _payload, log = self._exchange("setup", setup, None, t0 + self.timeout_s)
        except EngineDied as e:
            self.close()
            c = self.ctx_params
            # llama.cpp names its context in every line it logs while building one: past the model, then
            stage = (f"creating its context (n_ctx {c.n_ctx}, n_seq_max {c.n_seq_max}, n_threads {c.n_threads})"
                     if any("llama_context" in ln or "llama_kv_cache" in ln for ln in e.log + e.stderr)
                     else f"loading the model {self.model}")
            if e.aborted == "timeout":  # killed by us: it was alive, only slower than the caller allowed
                raise EngineSetupError(f"the engine did not finish {stage} within the timeout of "
                                       f"{self.timeout_s:g} s: it was stopped before reading the file") from None
            raise EngineSetupError(f"the engine died before reading the file, while {stage}: {e}") from None
        if not reply.get("ok"):
            self.close()
            raise EngineSetupError(str(reply.get("setup_error") or reply.get("error")))
        info: dict[str, Any] = reply["info"]
        build = self.identity.build
        info.update({
            "build": build.name if build else None, "commit": build.commit if build else None,
            "writes": build.writes if build else None, "lib_dir": str(self.identity.lib_dir),
            "abi": self.identity.to_json(), "binding": BINDING_LABEL, "model": self.model,
            "params": self.ctx_params.to_json(), "env": dict(self.env), "startup_s": round(time.monotonic() - t0, 3),
        })
        return info

    def _stderr_size(self) -> int:
        return os.fstat(self._err.fileno()).st_size

    def _stderr_since(self, offset: int) -> list[str]:
        end = self._stderr_size()
        start = max(offset, end - _STDERR_TAIL)
        text = os.pread(self._err.fileno(), end - start, start).decode("utf-8", "replace")
        return [ln.rstrip() for ln in text.splitlines() if ln.strip()]

    def _exchange(self, op: str, args: dict[str, Any], payload: Any,
                  deadline: float) -> tuple[dict[str, Any], bytes | None, list[str]]:
        """Send one request and read frames up to its reply; a dead or hung child raises EngineDied
        with what the child wrote to stderr since the previous reply."""
        log: list[str] = []
        timed_out = False
        header = {"op": op, **args}
        if payload is not None and memoryview(payload).nbytes > protocol.INLINE_MAX:
            header["file"] = protocol.spill(self._scratch, payload, "in")
            payload = None
        try:
            protocol.send(self._wfd, protocol.REQUEST, header, payload, deadline)
            while True:
                kind, reply, body = self._reader.read(deadline)
                if kind == protocol.REPLY:
                    if "file" in reply:
                        body = protocol.take_file(str(reply.pop("file")))
                    self._err_mark = self._stderr_size()
                    return reply, body, log
                log.append(str(reply.get("t", "")))
        except TimeoutError:
            timed_out = True
        except EOFError:
            pass
        proc = self._proc
        if timed_out:
            proc.kill()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        reason = "timeout" if timed_out else _signal_name(rc)
        self._dead = EngineDied(reason, log, self._stderr_since(self._err_mark), now=True)
        self._finalizer()  # closes the pipes and the stderr file, removes the scratch folders
        raise self._dead

    def _call(self, op: str, args: dict[str, Any], payload: Any = None) -> tuple[Any, bytes | None, list[str]]:
        with self._lock:
            if self._dead is not None:
                d = self._dead
                raise EngineDied(d.aborted, d.log, d.stderr)
            reply, body, log = self._exchange(op, args, payload, time.monotonic() + self.timeout_s)
        if not reply.get("ok"):
            raise EngineError(f"{op}: {reply.get('error')}")
        return reply.get("v"), body, log

    def _outcome(self, op: str, args: dict[str, Any], payload: Any = None) -> tuple[Outcome, Any]:
        """(Outcome with value = the raw return value, reply payload); a crash in this call is an Outcome."""
        try:
            value, body, log = self._call(op, args, payload)
        except EngineDied as e:
            if not e.now:
                raise
            return Outcome(False, None, e.log, e.aborted, stderr=e.stderr), None
        return Outcome(True, value, log, None, rc=value), body

    def _seq(self, seq_id: int, *, allow_all: bool = False) -> int:
        n = int(self._info["n_seq_max"])
        if not isinstance(seq_id, int) or not (0 <= seq_id < n or (allow_all and seq_id == -1)):
            raise ValueError(f"seq_id {seq_id!r} is outside 0..{n - 1} (n_seq_max = {n})"
                             + (" (or -1 for all)" if allow_all else ""))
        return seq_id

    # --- the contract --------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.poll() is None

    def info(self) -> dict[str, Any]:
        """Build, library, binding, model and what llama.cpp actually built (n_ctx, n_ctx_seq, KV caches,
        rotation, the context-creation log)."""
        return dict(self._info)

    def decode(self, seq_id: int, tokens: list[int], pos0: int | None = None) -> Outcome:
        """Decode ``tokens`` into ``seq_id`` (in n_batch chunks) from ``pos0`` (default: after the
        sequence's last position). value: the last token's logits (float32[n_vocab]) when rc == 0."""
        self._seq(seq_id)
        toks = [int(t) for t in tokens]
        if not toks:
            raise ValueError("decode needs at least one token")
        out, body = self._outcome("decode", {"seq_id": seq_id, "tokens": toks, "pos0": pos0})
        if out.ok:
            out.rc = out.value["rc"]
            out.value = np.frombuffer(body, dtype=np.float32).copy() if out.rc == 0 and body is not None else None
        return out

    def state_get_size(self) -> int:
        return int(self._call("state_get_size", {})[0])

    def state_get_data(self) -> bytes:
        return _payload(self._call("state_get_data", {})[1])

    def state_set_data(self, data: bytes) -> Outcome:
        """value: bytes read (0 = failure)."""
        return self._outcome("state_set_data", {}, data)[0]

    def state_seq_get_size(self, seq_id: int, flags: int = 0) -> int:
        return int(self._call("state_seq_get_size", {"seq_id": self._seq(seq_id), "flags": int(flags)})[0])

    def state_seq_get_data(self, seq_id: int, flags: int = 0) -> bytes:
        return _payload(self._call("state_seq_get_data", {"seq_id": self._seq(seq_id), "flags": int(flags)})[1])

    def state_seq_set_data(self, data: bytes, dest_seq_id: int, flags: int = 0) -> Outcome:
        """value: bytes read (0 = failure)."""
        args = {"dest_seq_id": self._seq(dest_seq_id), "flags": int(flags)}
        return self._outcome("state_seq_set_data", args, data)[0]

    def state_save_file(self, path: str | os.PathLike[str], tokens: list[int]) -> Outcome:
        """value: True when llama.cpp wrote the session file."""
        return self._outcome("state_save_file", {"path": os.fspath(path), "tokens": [int(t) for t in tokens]})[0]

    def state_load_file(self, path: str | os.PathLike[str], n_token_capacity: int) -> Outcome:
        """value: the file's tokens, or None when llama.cpp returned false."""
        out, _ = self._outcome("state_load_file", {"path": os.fspath(path), "n_token_capacity": int(n_token_capacity)})
        if out.ok:
            out.rc, out.value = out.value["rc"], out.value["tokens"]
        return out

    def state_seq_save_file(self, path: str | os.PathLike[str], seq_id: int, tokens: list[int]) -> Outcome:
        """value: bytes written (0 = failure)."""
        args = {"path": os.fspath(path), "seq_id": self._seq(seq_id), "tokens": [int(t) for t in tokens]}
        return self._outcome("state_seq_save_file", args)[0]

    def state_seq_load_file(self, path: str | os.PathLike[str], dest_seq_id: int, n_token_capacity: int) -> Outcome:
        """value: the file's tokens, or None when llama.cpp returned 0; rc: bytes read."""
        args = {"path": os.fspath(path), "dest_seq_id": self._seq(dest_seq_id),
                "n_token_capacity": int(n_token_capacity)}
        out, _ = self._outcome("state_seq_load_file", args)
        if out.ok:
            out.rc, out.value = out.value["rc"], out.value["tokens"]
        return out

    def seq_pos_min(self, seq_id: int) -> int:
        return int(self._call("seq_pos_min", {"seq_id": self._seq(seq_id)})[0])

    def seq_pos_max(self, seq_id: int) -> int:
        return int(self._call("seq_pos_max", {"seq_id": self._seq(seq_id)})[0])

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        args = {"seq_id": self._seq(seq_id, allow_all=True), "p0": int(p0), "p1": int(p1)}
        return bool(self._call("seq_rm", args)[0])

    def memory_clear(self) -> None:
        self._call("memory_clear", {})

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """The model's tokens for ``text`` (``llama_tokenize``; ``add_special``: BOS/EOS as the model adds them)."""
        return [int(t) for t in self._call("tokenize", {"text": text, "add_special": add_special})[0]]

    def echo(self, data: bytes) -> bytes:
        """Send ``data`` to the child and back (a transport check and benchmark; llama.cpp is not involved)."""
        return _payload(self._call("echo", {}, data)[1])

    def kill(self) -> None:
        """Kill the child now, from any thread (to cancel a long call): the call in flight returns an
        Outcome with ``aborted="SIGKILL"``, and later calls raise EngineDied."""
        with contextlib.suppress(OSError):
            self._proc.kill()

    def close(self) -> None:
        """Stop the child (it exits when its request pipe closes; killed after 3 s). Idempotent."""
        with self._lock:
            if self._dead is None:
                self._dead = EngineDied("closed", [])
            self._finalizer()

    def __enter__(self) -> LlamaProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _payload(body: bytes | None) -> bytes:
    return body if body is not None else b""
