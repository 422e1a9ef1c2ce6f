"""DeepSeek-V4's compressed state (``llama_kv_cache_dsv4``): K-cache blocks and compressor states.

The memory is an iSWA pair of raw ``llama_kv_cache`` sections (handled by :mod:`kv_state`) plus
the parts kept here (``docs/state-format-classes.md`` C8, ``src/llama-kv-cache-dsv4.cpp``):

* three compressed K caches (csa, hca, lid): per layer a storage tensor ``[n_stream, size, row]``
  whose row ``i`` holds compressed position ``i`` (``pos / ratio``). Their cell metadata is not part
  of the state (a restore empties it), so only the storage is modelled;
* three compressor states: per layer F32 ``kv`` and ``score`` planes ``[n_stream, state_size,
  n_embd_state]`` (rollback planes are not modelled: ``n_rs_seq = 0``).

Streams are per sequence whatever the context's ``kv_unified`` says. Byte layout::

    u32 0x34565344 ; u32 version 1 ; u32 mode (0 full, 1 PARTIAL_ONLY)
    raw KV sections [base] swa
    if full:  K-cache block csa, hca, lid:   u32 ver 2, n_rows, ns, n_layer; per layer u32 il + record
    always:   compressor block csa, hca, lid: u32 ver 1, ratio, state_size, n_embd_state, ns, n_layer;
                                              per layer u32 il + kv record + score record
    record:   i32 type ; u64 ne0 ; u64 rows ; u64 row_size ; ns x rows x row_size bytes

A per-sequence write holds ``min(size, (pos_max + 1) / ratio)`` rows of the sequence's stream
(``pos_max`` from the raw SWA cache). Reads check in llama.cpp's order with its messages, all of
them thrown (no cleanup of their own); full mode first clears the destination's compressed state.
"""

from __future__ import annotations

import torch

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.memory.io import StateReader
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.spec import Dsv4Spec
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.memory.tensors import TensorStore, host_array

MAGIC = 0x34565344  # "DSV4"
VERSION = 1
MODE_FULL, MODE_PARTIAL = 0, 1
KCACHE_VERSION = 2
KCACHE_VERSIONS = (1, KCACHE_VERSION)
COMP_VERSION = 1
F32 = 0
Dsv4Snap = tuple[()]


class Dsv4Error(InputError, ValueError):
    """A DeepSeek-V4 operation llama.cpp refuses (one-line message)."""


class Dsv4Blocks:
    """The compressed caches and compressor states of a ``llama_kv_cache_dsv4``."""

    kind = "dsv4"

    def __init__(self, spec: Dsv4Spec, type_k: int, sizes: tuple[int, ...], n_seq_max: int,
                 store: TensorStore | None = None, name: str = "dsv4") -> None:
        if len(sizes) != len(spec.kcaches):
            raise Dsv4Error(f"{len(sizes)} K-cache sizes for {len(spec.kcaches)} K caches")
        self.name = name
        self.spec = spec
        self.store = store or TensorStore()
        self.type_k = type_k
        self.n_stream = n_seq_max
        self.sizes = tuple(sizes)
        self.kcache: list[dict[int, torch.Tensor]] = []
        for blk, size in zip(spec.kcaches, sizes, strict=True):
            if blk.ne0 % gt.block_size(type_k):
                raise Dsv4Error(f"{blk.role}: rows of {blk.ne0} elements are not whole {gt.type_name(type_k)} blocks")
            self.kcache.append({il: self.store.alloc(self.n_stream, size, gt.row_size(type_k, blk.ne0))
                                for il in blk.layers})
        self.comp: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [
            {il: (self.store.alloc(self.n_stream, b.state_size, gt.row_size(F32, b.n_embd_state)),
                  self.store.alloc(self.n_stream, b.state_size, gt.row_size(F32, b.n_embd_state)))
             for il in b.layers}
            for b in spec.comps
        ]

    # -- memory operations ----------------------------------------------------------------------
    def tensors(self) -> list[torch.Tensor]:
        """Every storage tensor (K caches, then compressor kv/score planes)."""
        out = [t for d in self.kcache for t in d.values()]
        return out + [t for d in self.comp for pair in d.values() for t in pair]

    def clear(self, data: bool = True) -> None:
        """``clear_compressed(-1)``: everything zero (llama.cpp clears the data whatever ``data`` says)."""
        for t in self.tensors():
            self.store.zero_all(t)

    def _stream(self, seq_id: int) -> int:
        if not 0 <= seq_id < self.n_stream:
            raise Dsv4Error(f"seq_id {seq_id} out of range [0, {self.n_stream})")
        return seq_id

    def clear_seq(self, seq_id: int) -> None:
        """``clear_compressed(seq_id)``: zero the sequence's stream of every K cache and compressor state."""
        s = self._stream(seq_id)
        for t in self.tensors():
            row = t.shape[1] * t.shape[2]
            self.store.zero(t.view(-1), s * row, row)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """The compressed part of ``llama_kv_cache_dsv4::seq_rm`` (whole-sequence removal clears it)."""
        if seq_id < 0:
            self.clear(True)
        elif p0 <= 0 and p1 < 0:
            self.clear_seq(seq_id)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Whole-sequence copy: the destination's streams become the source's."""
        s0, s1 = self._stream(src), self._stream(dst)
        if s0 == s1:
            return
        for t in self.tensors():
            t[s1].copy_(t[s0])

    def seq_keep(self, seq_id: int) -> None:
        """Clear every other sequence's compressed state."""
        for s in range(self.n_stream):
            if s != seq_id:
                self.clear_seq(s)

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        """Positions live in the raw cache only (llama.cpp shifts nothing here)."""

    def seq_pos_min(self, seq_id: int) -> int:
        """No positions of its own (-1)."""
        return -1

    def seq_pos_max(self, seq_id: int) -> int:
        """No positions of its own (-1)."""
        return -1

    def apply(self, ub: object) -> list[int]:
        """The graph fills these rows; placing a ubatch changes nothing here."""
        return []

    def snapshot(self) -> Dsv4Snap:
        """No metadata (the transactional journal covers the bytes)."""
        return ()

    def restore(self, snap: Dsv4Snap) -> None:
        """Nothing to put back."""


# ---------------------------------------------------------------------------------------------
# write


def n_used_rows(pos_max: int, ratio: int, size: int) -> int:
    """``dsv4_state_n_used_k_rows``: rows of a sequence whose last position is ``pos_max``."""
    return 0 if pos_max < 0 else min(size, (pos_max + 1) // ratio)


def _src_range(n_stream: int, seq_id: int) -> tuple[int, int]:
    """``dsv4_state_src_stream_range``: (first stream, stream count) a write covers."""
    if seq_id >= 0 and n_stream > 1:
        if seq_id >= n_stream:
            raise Dsv4Error("DSV4 state sequence id out of stream range")
        return seq_id, 1
    return 0, 1 if seq_id >= 0 else n_stream


def write_header(w: WriteCtx, partial: bool) -> None:
    """Magic, version and mode."""
    w.sink.u32(MAGIC)
    w.sink.u32(VERSION)
    w.sink.u32(MODE_PARTIAL if partial else MODE_FULL)


def _write_record(w: WriteCtx, t: torch.Tensor, type_id: int, ne0: int, n_rows: int, s0: int, ns: int) -> None:
    sink = w.sink
    row = gt.row_size(type_id, ne0)
    sink.i32(type_id)
    sink.u64(ne0)
    sink.u64(n_rows)
    sink.u64(row)
    if n_rows:
        for s in range(s0, s0 + ns):
            sink.write(host_array(t[s])[:n_rows].reshape(-1))


def write_kcaches(blocks: Dsv4Blocks, w: WriteCtx, seq_id: int, pos_max: int) -> None:
    """The three K-cache blocks (full mode only)."""
    for blk, size, tensors in zip(blocks.spec.kcaches, blocks.sizes, blocks.kcache, strict=True):
        s0, ns = _src_range(blocks.n_stream, seq_id)
        n_rows = n_used_rows(pos_max, blk.ratio, size) if seq_id >= 0 else size
        for v in (KCACHE_VERSION, n_rows, ns, len(blk.layers)):
            w.sink.u32(v)
        for il in blk.layers:
            w.sink.u32(il)
            _write_record(w, tensors[il], blocks.type_k, blk.ne0, n_rows, s0, ns)


def write_comps(blocks: Dsv4Blocks, w: WriteCtx, seq_id: int) -> None:
    """The three compressor blocks (always written, also under PARTIAL_ONLY)."""
    for blk, tensors in zip(blocks.spec.comps, blocks.comp, strict=True):
        s0, ns = _src_range(blocks.n_stream, seq_id)
        for v in (COMP_VERSION, blk.ratio, blk.state_size, blk.n_embd_state, ns, len(blk.layers)):
            w.sink.u32(v)
        for il in blk.layers:
            w.sink.u32(il)
            kv, score = tensors[il]
            _write_record(w, kv, F32, blk.n_embd_state, blk.state_size, s0, ns)
            _write_record(w, score, F32, blk.n_embd_state, blk.state_size, s0, ns)


# ---------------------------------------------------------------------------------------------
# read


def _fail(check: str, off: int, msg: str, section: str) -> RestoreFailure:
    return RestoreFailure(check, off, msg, thrown=True, section=section)


def read_header(r: ReadCtx, partial_flag: bool) -> bool:
    """The header checks, in order; returns whether the state is in partial mode."""
    io = r.io
    off = io.pos
    magic = io.u32("DSV4 magic")
    version = io.u32("DSV4 version")
    if magic != MAGIC:
        raise _fail("dsv4_magic", off, f"DSV4 state magic mismatch (0x{magic:08x})", "dsv4")
    if version != VERSION:
        raise _fail("dsv4_version", off + 4, f"DSV4 state version mismatch ({version})", "dsv4")
    mode = io.u32("DSV4 mode")
    if mode not in (MODE_FULL, MODE_PARTIAL):
        raise _fail("dsv4_mode", off + 8, f"DSV4 state mode mismatch ({mode})", "dsv4")
    if (mode == MODE_PARTIAL) != partial_flag:
        raise _fail("dsv4_flags", off + 8, f"DSV4 state flags mismatch (mode {mode}, PARTIAL_ONLY "
                    f"{'set' if partial_flag else 'not set'})", "dsv4")
    return mode == MODE_PARTIAL


def _dst_stream(n_stream: int, seq_id: int, ns: int, off: int, section: str) -> int:
    """``dsv4_state_dst_stream_range``: the first stream a read fills."""
    if seq_id >= 0:
        if ns != 1:
            raise _fail("dsv4_stream_count", off, f"DSV4 sequence state stream count mismatch (ns {ns})", section)
        if n_stream > 1 and seq_id >= n_stream:
            raise _fail("dsv4_seq_stream", off, "DSV4 state sequence id out of stream range", section)
        return seq_id if n_stream > 1 else 0
    if ns != n_stream:
        raise _fail("dsv4_stream_count", off, f"DSV4 full state stream count mismatch ({ns} instead of {n_stream})",
                    section)
    return 0


def _read_record(io: StateReader, store: TensorStore, t: torch.Tensor, type_id: int, ne0: int, tensor_rows: int,
                 n_rows: int, s0: int, ns: int, section: str) -> None:
    """``dsv4_state_read_tensor_streams``: the header must match the storage exactly."""
    off = io.pos
    got_type = io.i32("record type")
    got_ne0 = io.u64("record ne0")
    got_rows = io.u64("record rows")
    got_row = io.u64("record row size")
    row = gt.row_size(type_id, ne0)
    if (got_type, got_ne0, got_rows, got_row) != (type_id, ne0, n_rows, row):
        raise _fail("dsv4_tensor_meta", off, f"DSV4 state tensor metadata mismatch (type {got_type}, ne0 {got_ne0}, "
                    f"rows {got_rows}, row size {got_row}; expected {type_id}, {ne0}, {n_rows}, {row})", section)
    if n_rows > tensor_rows:
        raise _fail("dsv4_tensor_rows", off, f"DSV4 state tensor row count exceeds storage ({n_rows} > "
                    f"{tensor_rows})", section)
    size = n_rows * row
    if not size:
        return
    flat = t.view(-1)
    for s in range(s0, s0 + ns):
        io.read_tensor(store, flat, s * tensor_rows * row, size, what=f"{section} rows")


def read_kcaches(blocks: Dsv4Blocks, r: ReadCtx, seq_id: int) -> None:
    """The three K-cache blocks, each checked as ``dsv4_state_read_k_cache`` does."""
    io = r.io
    for blk, size, tensors in zip(blocks.spec.kcaches, blocks.sizes, blocks.kcache, strict=True):
        off = io.pos
        version, n_rows, ns, n_layer = (io.u32(w) for w in ("version", "n_rows", "ns", "n_layer"))
        if version not in KCACHE_VERSIONS:
            raise _fail("dsv4_kcache_version", off, f"DSV4 K-cache state version mismatch ({version})", blk.role)
        if (version == 1 and n_rows != size) or n_rows > size:
            raise _fail("dsv4_kcache_size", off + 4, f"DSV4 K-cache state size mismatch ({n_rows} rows, the cache "
                        f"has {size})", blk.role)
        s0 = _dst_stream(blocks.n_stream, seq_id, ns, off + 8, blk.role)
        if n_layer != len(blk.layers):
            raise _fail("dsv4_layer_count", off + 12, f"DSV4 K-cache layer count mismatch ({n_layer} instead of "
                        f"{len(blk.layers)})", blk.role)
        for il in blk.layers:
            il_off = io.pos
            got = io.u32("layer id")
            if got != il:
                raise _fail("dsv4_layer_id", il_off, f"DSV4 K-cache layer id mismatch ({got} instead of {il})",
                            blk.role)
            _read_record(io, blocks.store, tensors[il], blocks.type_k, blk.ne0, size, n_rows, s0, ns, blk.role)


def read_comps(blocks: Dsv4Blocks, r: ReadCtx, seq_id: int) -> None:
    """The three compressor blocks (``llama_dsv4_comp_state::state_read``); rows go to plane 0."""
    io = r.io
    for blk, tensors in zip(blocks.spec.comps, blocks.comp, strict=True):
        off = io.pos
        names = ("version", "ratio", "state_size", "n_embd_state", "ns", "n_layer")
        version, ratio, state_size, n_embd_state, ns, n_layer = (io.u32(n) for n in names)
        if version != COMP_VERSION:
            raise _fail("dsv4_comp_version", off, f"DSV4 compressor state version mismatch ({version})", blk.role)
        if (ratio, state_size, n_embd_state) != (blk.ratio, blk.state_size, blk.n_embd_state):
            raise _fail("dsv4_comp_meta", off + 4, f"DSV4 compressor state metadata mismatch (ratio {ratio}, state "
                        f"{state_size} x {n_embd_state}; expected {blk.ratio}, {blk.state_size} x {blk.n_embd_state})",
                        blk.role)
        if n_layer != len(blk.layers):
            raise _fail("dsv4_layer_count", off + 20, f"DSV4 compressor state layer count mismatch ({n_layer} instead "
                        f"of {len(blk.layers)})", blk.role)
        s0 = _dst_stream(blocks.n_stream, seq_id, ns, off + 16, blk.role)
        for il in blk.layers:
            il_off = io.pos
            got = io.u32("layer id")
            if got != il:
                raise _fail("dsv4_layer_id", il_off, f"DSV4 compressor state layer id mismatch ({got} instead of {il})",
                            blk.role)
            kv, score = tensors[il]
            for t in (kv, score):
                _read_record(io, blocks.store, t, F32, blk.n_embd_state, blk.state_size, blk.state_size, s0, ns,
                             blk.role)
