"""One engine session: a real llama.cpp context that verify, the lab and repair drive the same way.

An :class:`EngineSession` holds one live context and offers what its three users do with it:

* :meth:`~EngineSession.restore` a state of a kind (``seq_file``, ``session_file``, ``seq_blob``,
  ``context_blob``) from bytes or a file into a sequence;
* :meth:`~EngineSession.prefill` a sequence's tokens, in pieces (a schedule's chunks), decoding only the
  rest when the sequence keeps the first piece's prefix;
* :meth:`~EngineSession.logits` of the next token after what a sequence holds;
* :meth:`~EngineSession.save` the state of a kind as bytes;
* :meth:`~EngineSession.clear` a sequence (or everything); :meth:`~EngineSession.tokenize` a text;
  :meth:`~EngineSession.kill`, :meth:`~EngineSession.close`.

Two implementations: :class:`LlamaSession` (libllama through llama-cpp-python in a child process,
:class:`~kvscope.core.engine.llamacpp.LlamaProcess`) and :class:`ServerSession` (a llama-server kvscope
starts, or the user's at a URL with its slot folder: sequences are slots, states are slot files).
Every call answers an :class:`Outcome` (or bytes); a libllama call reports a failure in it (the child may
have died: ``aborted``), a llama-server call raises :class:`ServerError` (``ServerDied``, ``ServerHTTPError``).

This module is the engine's one door for the layers above: ``core/verify`` and ``core/lab`` import the
engine's vocabulary (parameters, outcomes, errors) from here, never ``engine.llamacpp`` or
``engine.server`` (``tests/test_architecture.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.core.engine.janitor import janitor
from kvscope.core.engine.llamacpp import (
    PARTIAL_ONLY,
    ABIWarning,
    CtxParams,
    EngineDied,
    EngineError,
    EngineSetupError,
    LlamaProcess,
    Outcome,
    short_line,
)
from kvscope.core.engine.server import (
    ServerClient,
    ServerDied,
    ServerError,
    ServerHTTPError,
    ServerProcess,
    ServerSetupError,
)
from kvscope.core.fsutil import temporary_folder
from kvscope.core.reader.state_kinds import FILE_KINDS

__all__ = ["PARTIAL_ONLY", "ABIWarning", "CtxParams", "EngineDied", "EngineError", "EngineSession",
           "EngineSetupError", "LlamaProcess", "LlamaSession", "Outcome", "Prefill", "SaveRefused", "ServerClient",
           "ServerDied", "ServerError", "ServerHTTPError", "ServerProcess", "ServerSession", "ServerSetupError",
           "restored", "server_args", "short_line"]

Pieces = Sequence[tuple[int, int]]


class SaveRefused(EngineError):
    """llama.cpp did not write the state file (``writer``: the API that refused; ``outcome``: what it said)."""

    def __init__(self, writer: str, outcome: Outcome) -> None:
        self.writer, self.outcome = writer, outcome
        super().__init__(f"{writer} failed: {outcome.summary()}")


@dataclass
class Prefill:
    """What a prefill did: the last decode (the failing one when ``ok`` is false) and its piece ``a..b``."""

    outcome: Outcome
    piece: tuple[int, int]

    @property
    def ok(self) -> bool:
        return self.outcome.aborted is None and self.outcome.rc == 0


def restored(kind: str, o: Outcome) -> bool:
    """Whether a restore of ``kind`` succeeded: a file's loader returns what it read (``rc``), a blob's setter
    the bytes read (``value``)."""
    return o.ok and bool(o.rc if kind in FILE_KINDS else o.value)


class EngineSession:
    """The interface; see the module docstring."""

    kind = ""

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """What the engine says of itself (build, library, context) or of its server."""
        raise NotImplementedError

    def restore(self, kind: str, seq: int, *, data: bytes | None = None, path: str | None = None,
                n_token_capacity: int = 0, flags: int = 0) -> Outcome:
        """Restore a state of ``kind`` (``data``, or the file at ``path``) into ``seq`` (a whole-context
        kind: the context)."""
        raise NotImplementedError

    def prefill(self, seq: int, tokens: list[int], pieces: Pieces | None = None) -> Prefill:
        """Decode ``tokens`` into ``seq`` piece by piece (default: all at once, from position 0). A first piece
        that starts later keeps the sequence's prefix (a memory that cannot drop a suffix decodes it all);
        stops at the first failing piece."""
        raise NotImplementedError

    def logits(self, seq: int, token: int, before: Sequence[int] = (), **request: Any) -> Outcome:
        """Decode ``token`` after what ``seq`` holds (``before``: its tokens, for an engine that is sent the
        whole prompt); the next token's scores in ``value``."""
        raise NotImplementedError

    def save(self, kind: str, seq: int = 0, *, tokens: Sequence[int] = (), flags: int = 0) -> bytes:
        """The state as the API of ``kind`` writes it (a file's ``tokens``; a blob's ``flags``)."""
        raise NotImplementedError

    def clear(self, seq: int | None = None) -> bool:
        """Empty ``seq`` (None: every sequence)."""
        raise NotImplementedError

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """``text`` in the model's tokens (``add_special``: BOS as the model adds it)."""
        raise NotImplementedError

    def kill(self) -> None:
        """Stop a call in flight (cancel); the session is unusable afterwards."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# libllama


class LlamaSession(EngineSession):
    """libllama in a child process. ``record_abi_warnings``: keep the child's :class:`ABIWarning` in
    :attr:`warnings` instead of letting them through; ``scratch``: the folder its state files go through
    (default: one of its own, made when first needed and removed on close)."""

    kind = "llama.cpp"

    def __init__(self, model: str, ctx: CtxParams, *, build: str | None = None, lib_path: str | None = None,
                 timeout_s: float = 600.0, record_abi_warnings: bool = False, scratch: str | None = None) -> None:
        self.model, self.ctx, self.build, self.lib_path, self.timeout_s = model, ctx, build, lib_path, timeout_s
        self.record_abi_warnings = record_abi_warnings
        self.warnings: list[str] = []
        self._info: dict[str, Any] = {}
        self._scratch = scratch
        self._own_scratch: contextlib.ExitStack | None = None
        self.process: LlamaProcess = self._start()

    def _start(self) -> LlamaProcess:
        if not self.record_abi_warnings:
            p = LlamaProcess(self.model, self.ctx, build=self.build, lib_path=self.lib_path, timeout_s=self.timeout_s)
        else:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", ABIWarning)
                p = LlamaProcess(self.model, self.ctx, build=self.build, lib_path=self.lib_path,
                                 timeout_s=self.timeout_s)
            self.warnings = [str(w.message) for w in seen if issubclass(w.category, ABIWarning)]
        self._info = p.info()
        return p

    def restart(self) -> None:
        """A new child in place of this one (after a crash)."""
        self.process.close()
        self.process = self._start()

    @property
    def alive(self) -> bool:
        return self.process.alive

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def _scratch_path(self, what: str) -> str:
        if self._scratch is None:
            stack = self._own_scratch = contextlib.ExitStack()
            self._scratch = stack.enter_context(temporary_folder(tempfile.gettempdir(), "engine"))
            os.chmod(self._scratch, 0o700)  # copies of the states: the user's alone
            janitor().watch_dir(self._scratch)
        return os.path.join(self._scratch, f"{what}-{uuid.uuid4().hex[:8]}")

    def restore(self, kind: str, seq: int, *, data: bytes | None = None, path: str | None = None,
                n_token_capacity: int = 0, flags: int = 0) -> Outcome:
        p = self.process
        if kind in FILE_KINDS:
            tmp = None
            if path is None:
                path = tmp = self._scratch_path("case")
                Path(path).write_bytes(data or b"")
            try:
                if kind == "seq_file":
                    return p.state_seq_load_file(path, seq, n_token_capacity)
                return p.state_load_file(path, n_token_capacity)
            finally:
                if tmp is not None:
                    os.unlink(tmp)
        if data is None:
            with open(path or "", "rb") as fh:
                data = fh.read()
        return p.state_seq_set_data(data, seq, flags) if kind == "seq_blob" else p.state_set_data(data)

    def prefill(self, seq: int, tokens: list[int], pieces: Pieces | None = None) -> Prefill:
        p = self.process
        chunks = list(pieces) if pieces is not None else [(0, len(tokens))]
        if chunks[0][0] and not p.seq_rm(seq, chunks[0][0], -1):  # a recurrent memory keeps no prefix
            p.seq_rm(seq, -1, -1)
            chunks = [(0, chunks[0][0]), *chunks]
        done: Prefill | None = None
        for a, b in chunks:
            done = Prefill(p.decode(seq, tokens[a:b], pos0=a), (a, b))
            if not done.ok:
                break
        assert done is not None
        return done

    def logits(self, seq: int, token: int, before: Sequence[int] = (), **request: Any) -> Outcome:
        return self.process.decode(seq, [token])

    def positions(self, seq: int) -> tuple[int, int]:
        """The sequence's (``llama_memory_seq_pos_min``, ``..._max``)."""
        return self.process.seq_pos_min(seq), self.process.seq_pos_max(seq)

    def save(self, kind: str, seq: int = 0, *, tokens: Sequence[int] = (), flags: int = 0) -> bytes:
        p = self.process
        if kind == "seq_blob":
            return p.state_seq_get_data(seq, flags)
        if kind == "context_blob":
            return p.state_get_data()
        path = self._scratch_path("save")
        try:
            if kind == "seq_file":
                o, writer = p.state_seq_save_file(path, seq, list(tokens)), "llama_state_seq_save_file"
            else:
                o, writer = p.state_save_file(path, list(tokens)), "llama_state_save_file"
            if not (o.ok and o.value):
                raise SaveRefused(writer, o)
            return Path(path).read_bytes()
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def clear(self, seq: int | None = None) -> bool:
        if seq is None:
            self.process.memory_clear()
            return True
        return self.process.seq_rm(seq, -1, -1)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.process.tokenize(text, add_special)

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.process.close()
        if self._own_scratch is not None and self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._own_scratch.close()
            janitor().forget("dir", self._scratch)
            self._own_scratch = self._scratch = None

    def __enter__(self) -> LlamaSession:
        return self


# ---------------------------------------------------------------------------------------------
# llama-server


def server_args(ctx: CtxParams) -> list[str]:
    """llama-server flags for a context like ``ctx`` (its slot count is ``n_seq_max``)."""
    fa = {None: "auto", True: "on", False: "off"}[ctx.flash_attn]
    args = ["-b", str(ctx.n_batch), "-ub", str(ctx.n_ubatch), "-fa", fa, "-ctk", ctx.type_k, "-ctv", ctx.type_v,
            "--kv-unified" if ctx.kv_unified else "--no-kv-unified", "--cache-ram", "0", "-ctxcp", "0",
            "--no-warmup", "-lv", "4"]  # -lv 4: the server logs why it re-processes a prompt (verify's reuse)
    if ctx.swa_full:
        args.append("--swa-full")
    return args


def _read_whole(path: str) -> bytes:
    return Path(path).read_bytes()


class ServerSession(EngineSession):
    """A llama-server: one kvscope starts (from ``build`` or ``binary``, one slot per sequence) or the user's at
    ``url`` with its ``--slot-save-path`` folder ``slot_dir``. The files it puts in the slot folder are named
    ``prefix`` + 8 hex digits + ``.bin``, deleted on close (and by the janitor should kvscope be killed)."""

    kind = "server"

    def __init__(self, model: str, ctx: CtxParams, *, url: str | None = None, slot_dir: str | None = None,
                 binary: str | None = None, build: str | None = None, timeout_s: float = 600.0,
                 max_requests: int = 64, prefix: str = "") -> None:
        self.model, self.ctx, self.url, self.binary, self.build = model, ctx, url, binary, build
        self.timeout_s, self.max_requests = timeout_s, max_requests
        self.prefix = prefix or f"kvscope-engine-{os.getpid()}-{uuid.uuid4().hex[:6]}-"
        self.process: ServerProcess | None = None
        self._names: list[str] = []
        self._watched: list[str] = []  # slot folders whose files of ours the janitor deletes if we die
        if url is not None:
            if slot_dir is None:
                raise ServerSetupError("--server needs the server's --slot-save-path folder as --slot-dir")
            self.client = ServerClient(url, slot_dir, max_requests=max_requests, timeout_s=timeout_s)
        else:
            self.client = self._start()
        self._watch()

    @property
    def started(self) -> bool:
        """Whether kvscope started this server (not the user's ``--server``)."""
        return self.url is None

    @property
    def pattern(self) -> str:
        return self.prefix + "*.bin"

    @property
    def slot_dir(self) -> str:
        return str(self.client.slot_dir)

    def _start(self) -> ServerClient:
        ctx = self.ctx
        self.process = ServerProcess(self.model, build=None if self.binary else self.build, binary=self.binary,
                                     n_parallel=ctx.n_seq_max, n_ctx=ctx.n_ctx, threads=ctx.n_threads,
                                     args=server_args(ctx), env=dict(ctx.env), timeout_s=120.0,
                                     help_timeout_s=self.timeout_s)
        return self.process.client(max_requests=self.max_requests, timeout_s=self.timeout_s)

    def _watch(self) -> None:
        if self.slot_dir not in self._watched:  # our copies go even on SIGTERM or SIGKILL
            janitor().watch_files(self.slot_dir, self.pattern)
            self._watched.append(self.slot_dir)

    def restart(self) -> None:
        """A new server in place of the one kvscope started (a user's server cannot be restarted)."""
        if self.process is not None:
            self.process.close()
        self.client = self._start()
        self._watch()

    @property
    def alive(self) -> bool:
        return self.process is None or self.process.alive

    def info(self) -> dict[str, Any]:
        return self.client.props()

    def log_tail(self, n: int = 400) -> list[str]:
        """The last ``n`` lines of the log of a server kvscope started (none for the user's)."""
        return self.process.log_tail(n) if self.process is not None else []

    def new_name(self) -> str:
        """A new file name of ours in the slot folder (deleted on close)."""
        name = f"{self.prefix}{uuid.uuid4().hex[:8]}.bin"
        self._names.append(name)
        return name

    def put(self, data: bytes) -> str:
        """``data`` as a new slot file of ours; its name."""
        name = self.new_name()
        Path(self.slot_dir, name).write_bytes(data)
        return name

    def restore(self, kind: str, seq: int, *, data: bytes | None = None, path: str | None = None,
                n_token_capacity: int = 0, flags: int = 0) -> Outcome:
        """``seq`` is the slot; ``path`` a file in the slot folder, or ``data`` put there first."""
        if kind != "seq_file":
            raise ServerError(f"llama-server restores slot files (sequence files), not a {kind}")
        if path is not None and os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.slot_dir):
            name = os.path.basename(path)
        else:
            name = self.put(data if data is not None else _read_whole(path or ""))
        doc = self.client.slot_restore(seq, name)
        return Outcome(True, doc, [], None, doc.get("n_read"))

    def prefill(self, seq: int, tokens: list[int], pieces: Pieces | None = None) -> Prefill:
        """The prompt grows a piece a request (``n_predict`` 0): the server decodes only the new tokens."""
        chunks = list(pieces) if pieces is not None else [(0, len(tokens))]
        doc: dict[str, Any] = {}
        for _a, b in chunks:
            doc = self.client.complete(tokens[:b], n_predict=0, id_slot=seq)
        return Prefill(Outcome(True, doc, [], None, 0), chunks[-1])

    def logits(self, seq: int, token: int, before: Sequence[int] = (), **request: Any) -> Outcome:
        """One completion of one token (``request``: the completion's fields, e.g. ``n_probs``); ``value`` is
        the server's answer (its ``completion_probabilities``)."""
        doc = self.client.complete([*before, token], n_predict=1, id_slot=seq, **request)
        return Outcome(True, doc, [], None, 0)

    def save(self, kind: str, seq: int = 0, *, tokens: Sequence[int] = (), flags: int = 0,
             reader: Callable[[str], bytes] | None = None) -> bytes:
        """The slot saved by the server into the slot folder, read by ``reader`` (default: whole)."""
        if kind != "seq_file":
            raise ServerError(f"llama-server saves slot files (sequence files), not a {kind}")
        name = self.new_name()
        self.client.slot_save(seq, name)
        return (reader or _read_whole)(os.path.join(self.slot_dir, name))

    def clear(self, seq: int | None = None) -> bool:
        for s in range(self.ctx.n_seq_max) if seq is None else [seq]:
            self.client.slot_erase(s)
        return True

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.client.tokenize(text, add_special)

    def kill(self) -> None:
        if self.process is not None:
            self.process.close()

    def close(self) -> None:
        for name in self._names:
            path = os.path.join(self.slot_dir, name)
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)  # an empty folder that took our name; never one with content
                else:
                    os.unlink(path)
        self._names.clear()
        for folder in self._watched:
            janitor().forget("files", f"{os.path.abspath(folder)}/{self.pattern}")
        self._watched.clear()
        if self.process is not None:
            self.process.close()
            self.process = None

    def __enter__(self) -> ServerSession:
        return self
