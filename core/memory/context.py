"""``MemoryContext``: the state API of a ``llama_context`` around a :class:`LlamaMemory`.

Writes return the exact bytes (a ``bytearray`` sized by a counting pass, as llama.cpp sizes its
buffers) or stream them to a file; reads never raise on bad bytes and return a
:class:`ReadResult`. Every read takes a failure ``policy`` (``contained``, ``legacy``,
``transactional``) and a ``reader`` kind (``buffer``: tensor writes deferred to the end, ``file``:
immediate); the default is what the layout's llama.cpp used for that API.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from kvscope.core.fileio import open_regular
from kvscope.core.fsutil import atomic_writer
from kvscope.core.memory.composite import LlamaMemory
from kvscope.core.memory.containers import (
    OutputCaps,
    Outputs,
    read_context_body,
    read_file_header,
    read_seq_blob,
    write_context_body,
    write_seq_blob,
    write_seq_file,
    write_session,
)
from kvscope.core.memory.io import BufferReader, BufferSink, CountingSink, FileReader, FileSink, StateReader, StateSink
from kvscope.core.memory.layout import FLAG_ON_DEVICE, Layout, LayoutError
from kvscope.core.memory.params import ContextParams
from kvscope.core.memory.policy import FailurePolicy, make_policy
from kvscope.core.memory.result import ReadResult, RestoreFailure
from kvscope.core.memory.spec import MemorySpec
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.layouts import SEQ_MAGIC, SESSION_MAGIC

Data = bytes | bytearray | memoryview | np.ndarray


class MemoryContext:
    """A memory plus the context-level facts its files carry: arch name, layout, outputs."""

    def __init__(self, memory: LlamaMemory, layout: str | Layout | None = None, arch: str | None = None,
                 outputs: Outputs | None = None) -> None:
        self.memory = memory
        self.layout = layout if isinstance(layout, Layout) else Layout.named(layout)
        self.arch = arch or memory.spec.arch
        self.outputs = outputs

    @classmethod
    def create(cls, model: ModelProfile | MemorySpec, params: ContextParams | None = None,
               layout: str | Layout | None = None, device: torch.device | str | None = None) -> MemoryContext:
        """A fresh, empty context for ``model`` with llama.cpp's sizing rules."""
        lay = layout if isinstance(layout, Layout) else Layout.named(layout)
        spec = model if isinstance(model, MemorySpec) else MemorySpec.from_profile(model, lay.kv_rot)
        return cls(LlamaMemory(spec, params or ContextParams(), device), lay)

    def _layout(self, layout: str | Layout | None) -> Layout:
        if layout is None:
            return self.layout
        return layout if isinstance(layout, Layout) else Layout.named(layout)

    # -- writing ------------------------------------------------------------------------------------
    def _wctx(self, sink: StateSink, layout: Layout, flags: int) -> WriteCtx:
        spec = self.memory.spec
        return WriteCtx(sink, layout, layout.ext_bytes(spec), spec.n_layer, flags)

    def _render(self, layout: Layout, flags: int, body: Callable[[WriteCtx], None]) -> bytearray:
        count = CountingSink()
        body(self._wctx(count, layout, flags))
        sink = BufferSink(count.n_bytes)
        body(self._wctx(sink, layout, flags))
        return sink.buf

    def _stream(self, path: str | os.PathLike[str], layout: Layout, body: Callable[[WriteCtx], None]) -> int:
        count = CountingSink()
        body(self._wctx(count, layout, 0))
        with atomic_writer(path, "state", buffering=1 << 20) as fh:  # complete or absent, never half-written
            if count.n_bytes and hasattr(os, "posix_fallocate"):
                # allocating the file up front makes the page-cache writes much cheaper
                with contextlib.suppress(OSError):
                    os.posix_fallocate(fh.fileno(), 0, count.n_bytes)
            sink = FileSink(fh)
            body(self._wctx(sink, layout, 0))
            fh.truncate(sink.n_bytes)
            return sink.n_bytes

    def state_write(self, seq_id: int = -1, flags: int = 0, layout: str | Layout | None = None) -> bytearray:
        """The memory state alone (``memory->state_write(io, seq_id, flags)``)."""
        return self._render(self._layout(layout), flags, lambda w: self.memory.state_write(w, seq_id))

    def seq_get_data(self, seq_id: int, flags: int = 0, layout: str | Layout | None = None) -> bytearray:
        """``llama_state_seq_get_data_ext``: the per-sequence buffer blob."""
        return self._render(self._layout(layout), flags, lambda w: write_seq_blob(self.memory, w, seq_id))

    def get_data(self, layout: str | Layout | None = None, outputs: Outputs | None = None) -> bytearray:
        """``llama_state_get_data``: the context blob."""
        out = outputs or self.outputs
        return self._render(self._layout(layout), 0, lambda w: write_context_body(self.memory, w, self.arch, out))

    def session_bytes(self, tokens: Sequence[int], layout: str | Layout | None = None,
                      outputs: Outputs | None = None) -> bytearray:
        """The bytes ``llama_state_save_file`` writes."""
        out = outputs or self.outputs
        return self._render(self._layout(layout), 0, lambda w: write_session(self.memory, w, tokens, self.arch, out))

    def seq_file_bytes(self, seq_id: int, tokens: Sequence[int], layout: str | Layout | None = None) -> bytearray:
        """The bytes ``llama_state_seq_save_file`` writes."""
        return self._render(self._layout(layout), 0, lambda w: write_seq_file(self.memory, w, seq_id, tokens))

    def save_file(self, path: str | os.PathLike[str], tokens: Sequence[int], layout: str | Layout | None = None,
                  outputs: Outputs | None = None) -> int:
        """``llama_state_save_file``, streamed; returns the bytes written."""
        out = outputs or self.outputs
        return self._stream(path, self._layout(layout), lambda w: write_session(self.memory, w, tokens, self.arch, out))

    def seq_save_file(self, path: str | os.PathLike[str], seq_id: int, tokens: Sequence[int],
                      layout: str | Layout | None = None) -> int:
        """``llama_state_seq_save_file``, streamed; returns the bytes written (= the file size)."""
        return self._stream(path, self._layout(layout), lambda w: write_seq_file(self.memory, w, seq_id, tokens))

    # -- reading ------------------------------------------------------------------------------------
    def _caps(self) -> OutputCaps:
        p, s = self.memory.params, self.memory.spec
        return OutputCaps(p.n_batch, p.n_seq_max, s.n_vocab, s.n_embd)

    def _check_dest(self, dest: int) -> None:
        if dest != -1 and not 0 <= dest < self.memory.params.n_seq_max:
            raise ValueError(f"destination seq_id {dest} out of range [0, {self.memory.params.n_seq_max})")

    def _restore(self, io: StateReader, layout: Layout, flags: int, policy: str | FailurePolicy,
                 body: Callable[[ReadCtx], list[int] | None], returns_bool: bool = False) -> ReadResult:
        pol = make_policy(policy)
        spec = self.memory.spec
        layout.check_spec(spec, self.memory.n_stream)
        if flags & FLAG_ON_DEVICE:
            raise LayoutError("ON_DEVICE blobs (payloads kept in device buffers) are not modelled")
        r = ReadCtx(io, layout, pol, layout.ext_bytes(spec), spec.n_layer, spec.n_pos_per_embd, flags)
        pol.begin(self.memory)
        try:
            tokens = body(r)
        except RestoreFailure as f:
            pol.io_failure(io, self.memory, r)
            io.finish()
            res = ReadResult.failure(f, io.n_bytes, False if returns_bool else 0, pol.name, io.kind, r.actions)
            res.alloc_bytes = f.alloc_bytes if f.alloc_bytes is not None else r.alloc_bytes
            return res
        pol.success(self.memory)
        io.finish()
        res = ReadResult(True, True if returns_bool else io.n_bytes, io.n_bytes, policy=pol.name, reader=io.kind,
                         actions=r.actions, alloc_bytes=r.alloc_bytes, tokens=tokens)
        if returns_bool and io.pos != io.size:
            extra = io.size - io.pos
            res.ok, res.returned, res.check, res.offset = False, False, "trailing", io.pos
            res.message = f"did not read all of the session file data: {extra} bytes follow (the state is restored)"
        return res

    def _reader(self, data: Data, layout: Layout, reader: str | None) -> BufferReader:
        kind = reader or ("buffer" if layout.blob_header else "file")
        if kind not in ("buffer", "file"):
            raise ValueError(f"unknown reader kind {kind!r} (buffer, file)")
        return BufferReader(data, deferred=kind == "buffer")

    def state_read(self, data: Data, dest_seq_id: int = -1, flags: int = 0, layout: str | Layout | None = None,
                   policy: str | FailurePolicy = "contained", reader: str | None = None) -> ReadResult:
        """``memory->state_read(io, dest_seq_id, flags)`` over the memory state alone."""
        lay = self._layout(layout)
        self._check_dest(dest_seq_id)

        def body(r: ReadCtx) -> None:
            self.memory.state_read(r, dest_seq_id)

        return self._restore(self._reader(data, lay, reader), lay, flags, policy, body)

    def seq_set_data(self, data: Data, dest_seq_id: int, flags: int = 0, layout: str | Layout | None = None,
                     policy: str | FailurePolicy = "contained", reader: str | None = None) -> ReadResult:
        """``llama_state_seq_set_data_ext``."""
        lay = self._layout(layout)
        self._check_dest(dest_seq_id)

        def body(r: ReadCtx) -> None:
            read_seq_blob(self.memory, r, dest_seq_id)

        return self._restore(self._reader(data, lay, reader), lay, flags, policy, body)

    def set_data(self, data: Data, layout: str | Layout | None = None, policy: str | FailurePolicy = "contained",
                 reader: str | None = None) -> ReadResult:
        """``llama_state_set_data``: arch, [outputs], whole memory; keeps the outputs read."""
        lay = self._layout(layout)

        def body(r: ReadCtx) -> None:
            out = read_context_body(self.memory, r, self.arch, self._caps())
            if out is not None:
                self.outputs = out

        return self._restore(self._reader(data, lay, reader), lay, 0, policy, body)

    def _load(self, path: str | os.PathLike[str] | None, data: Data | None, layout: Layout, reader: str | None,
              ) -> tuple[StateReader, Callable[[], None]]:
        if data is not None:
            return self._reader(data, layout, reader or "file"), lambda: None
        assert path is not None
        fd, _ = open_regular(Path(path))  # regular files only: a FIFO would block open()
        fh = os.fdopen(fd, "rb")
        return FileReader(fh), fh.close

    def seq_load_file(self, path: str | os.PathLike[str] | None, dest_seq_id: int, n_token_capacity: int | None = None,
                      layout: str | Layout | None = None, policy: str | FailurePolicy = "contained",
                      data: Data | None = None, reader: str | None = None) -> ReadResult:
        """``llama_state_seq_load_file`` (from ``path``, or from ``data`` in memory)."""
        lay = self._layout(layout)
        self._check_dest(dest_seq_id)
        io, close = self._load(path, data, lay, reader)

        def body(r: ReadCtx) -> list[int]:
            tokens = read_file_header(r, SEQ_MAGIC, lay.seq_version, n_token_capacity)
            self.memory.state_read(r, dest_seq_id)
            return tokens

        try:
            return self._restore(io, lay, 0, policy, body)
        finally:
            close()

    def load_file(self, path: str | os.PathLike[str] | None, n_token_capacity: int | None = None,
                  layout: str | Layout | None = None, policy: str | FailurePolicy = "contained",
                  data: Data | None = None, reader: str | None = None) -> ReadResult:
        """``llama_state_load_file``: returns false (``ok`` False, check ``trailing``) when bytes remain."""
        lay = self._layout(layout)
        io, close = self._load(path, data, lay, reader)

        def body(r: ReadCtx) -> list[int]:
            tokens = read_file_header(r, SESSION_MAGIC, lay.session_version, n_token_capacity)
            out = read_context_body(self.memory, r, self.arch, self._caps())
            if out is not None:
                self.outputs = out
            return tokens

        try:
            return self._restore(io, lay, 0, policy, body, returns_bool=True)
        finally:
            close()
