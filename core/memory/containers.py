"""The wrappers around a memory state (spec §2, §3): session file, sequence file, per-sequence
buffer blob, context blob; and the pre-PR #18862 outputs sections, kept as bytes.

Writers take a :class:`WriteCtx`, readers a :class:`ReadCtx`; both delegate the memory state to
:class:`LlamaMemory`. The checks the wrappers make come first in llama.cpp, so a failure here
leaves the memory untouched.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvscope.core.memory.composite import LlamaMemory
from kvscope.core.memory.layout import LayoutError
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.reader.layouts import BLOB_IO_MAGIC, SEQ_MAGIC, SESSION_MAGIC

_OUT_HEAD = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Outputs:
    """``n_outputs``, output ids, logits and embeddings of a context state, as the bytes read."""

    raw: bytes

    @classmethod
    def empty(cls) -> Outputs:
        """What a context with no outputs writes: ``n_outputs = 0``, no logits, no embeddings."""
        return cls(struct.pack("<IQQ", 0, 0, 0))

    @property
    def n_outputs(self) -> int:
        """Number of outputs recorded."""
        return int(_OUT_HEAD.unpack_from(self.raw, 0)[0])

    @property
    def logits_size(self) -> int:
        """Number of logits floats recorded."""
        return int(_U64.unpack_from(self.raw, 4 + 4 * self.n_outputs)[0])

    @property
    def embd_size(self) -> int:
        """Number of embedding floats recorded."""
        return int(_U64.unpack_from(self.raw, 4 + 4 * self.n_outputs + 8 + 4 * self.logits_size)[0])


@dataclass(frozen=True)
class OutputCaps:
    """What the context can hold: output ids below ``n_batch``, logits / embeddings per output."""

    n_batch: int
    n_seq_max: int
    n_vocab: int = 0  # 0: unknown, not checked
    n_embd: int = 0


def token_words(tokens: Sequence[int]) -> npt.NDArray[np.uint32]:
    """Token ids (or the raw words of a packed llama-server payload) as little-endian 32-bit words."""
    arr = np.asarray(list(tokens), dtype=np.int64)
    if arr.size and (int(arr.min()) < -(1 << 31) or int(arr.max()) >= 1 << 32):
        raise ValueError("token words must fit in 32 bits")
    return (arr & 0xFFFFFFFF).astype("<u4")


# ---------------------------------------------------------------------------------------------
# write


def write_context_body(mem: LlamaMemory, w: WriteCtx, arch: str, outputs: Outputs | None) -> None:
    """``state_write_data``: arch string, [outputs sections], the whole memory."""
    name = arch.encode()
    w.sink.u32(len(name))
    w.sink.write(name)
    if w.layout.ctx_outputs:
        if outputs is None:
            raise LayoutError(f"layout {w.layout.name}: the context state holds n_outputs / output ids / logits / "
                              "embeddings sections, and this context has none to write")
        w.sink.write(outputs.raw)
    mem.state_write(w, -1)


def write_session(mem: LlamaMemory, w: WriteCtx, tokens: Sequence[int], arch: str, outputs: Outputs | None) -> None:
    """``llama_state_save_file``."""
    words = token_words(tokens)
    w.sink.u32(SESSION_MAGIC)
    w.sink.u32(w.layout.session_version)
    w.sink.u32(int(words.size))
    w.sink.write(words.view(np.uint8))
    write_context_body(mem, w, arch, outputs)


def write_seq_file(mem: LlamaMemory, w: WriteCtx, seq_id: int, tokens: Sequence[int]) -> None:
    """``llama_state_seq_save_file`` (flags are always 0 there)."""
    words = token_words(tokens)
    w.sink.u32(SEQ_MAGIC)
    w.sink.u32(w.layout.seq_version)
    w.sink.u32(int(words.size))
    w.sink.write(words.view(np.uint8))
    mem.state_write(w, seq_id)


def write_seq_blob(mem: LlamaMemory, w: WriteCtx, seq_id: int) -> None:
    """``llama_state_seq_get_data_ext``: [io magic + seq id where the layout has them] + memory."""
    if w.layout.blob_header:
        w.sink.u32(BLOB_IO_MAGIC)
        w.sink.i32(seq_id)
    mem.state_write(w, seq_id)


# ---------------------------------------------------------------------------------------------
# read


def _read_outputs(r: ReadCtx, caps: OutputCaps) -> Outputs:
    """The outputs sections, checked as llama.cpp did before PR #18862 (all before the memory)."""
    io = r.io
    raw = bytearray(io.read(4, "n_outputs"))
    n_out = int(_OUT_HEAD.unpack_from(raw, 0)[0])
    ids_off = io.pos
    ids_raw = io.read(4 * n_out, "output ids")
    raw += bytes(ids_raw)
    ids = np.frombuffer(bytes(ids_raw), dtype="<i4")
    bad = np.flatnonzero((ids < 0) | (ids >= caps.n_batch))
    if bad.size:
        i = int(bad[0])
        raise RestoreFailure("output_id", ids_off + 4 * i, f"invalid output id {int(ids[i])} (n_batch "
                             f"{caps.n_batch})", thrown=True, section="outputs")
    n_max = max(n_out, caps.n_seq_max)
    for what, per in (("logits", caps.n_vocab), ("embd", caps.n_embd)):
        off = io.pos
        head = io.read(8, f"{what}_size")
        size = int(_U64.unpack(bytes(head))[0])
        if per and size > per * n_max:
            raise RestoreFailure(f"{what}_size", off, f"{what}_size {size} > capacity {per * n_max}: buffer too small",
                                 thrown=True, section="outputs")
        raw += bytes(head)
        raw += bytes(io.read(4 * size, what))
    return Outputs(bytes(raw))


def read_context_body(mem: LlamaMemory, r: ReadCtx, arch: str, caps: OutputCaps) -> Outputs | None:
    """``state_read_data``: arch check, [outputs], the whole memory. Returns the outputs read."""
    io = r.io
    off = io.pos
    n = io.u32("arch length")
    name = bytes(io.read(n, "arch name"))
    if name != arch.encode():
        raise RestoreFailure("arch", off, f"wrong model arch: {name.decode(errors='replace')!r}, this context "
                             f"is {arch!r}", thrown=True)
    outputs = _read_outputs(r, caps) if r.layout.ctx_outputs else None
    mem.state_read(r, -1)
    return outputs


def read_file_header(r: ReadCtx, magic: int, version: int, capacity: int | None) -> list[int]:
    """Magic, version (exact match), token count (against ``capacity``) and the token words."""
    io = r.io
    got = io.u32("magic")
    if got != magic:
        raise RestoreFailure("magic", 0, f"unknown magic 0x{got:08x}, expected 0x{magic:08x}", thrown=True)
    ver = io.u32("version")
    if ver != version:
        raise RestoreFailure("version", 4, f"version {ver}, this build reads only {version}", thrown=True)
    n = io.u32("n_token_count")
    if capacity is not None and n > capacity:
        raise RestoreFailure("token_count", 8, f"token count in file exceeded capacity {n} > {capacity}",
                             thrown=True)
    return [int(x) for x in io.i32_array(n, "tokens").tolist()]


def read_seq_blob(mem: LlamaMemory, r: ReadCtx, dest: int) -> None:
    """``llama_state_seq_set_data_ext``: the header (magic checked, seq id ignored), the memory."""
    io = r.io
    if r.layout.blob_header:
        off = io.pos
        got = io.u32("io magic")
        if got != BLOB_IO_MAGIC:
            raise RestoreFailure("io_magic", off, f"wrong sequence state magic 0x{got:08x}", thrown=True)
        io.i32("seq_id")
    mem.state_read(r, dest)
