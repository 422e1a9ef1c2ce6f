"""``llama_memory_recurrent::state_write`` / ``state_read`` (spec §5 and §7.2).

The section is the same in every layout: ``cell_count``, the cell records (per-sequence:
``n_seq_id = 0`` and no ids), ``s_trans = 0``, ``n_layer`` = the model's layer count (less its MTP/NextN
blocks from b9544: :func:`~kvscope.core.reader.layouts.recurrent_n_layers`), then the r
records of the layers that have state (on a PLE layer each followed by ``u64 p_row`` and the PLE
rows, with no type field), then their s records. Unlike the KV cache an empty
section still carries its data header, and a per-sequence restore of zero cells empties the
destination sequence.
"""

from __future__ import annotations

import numpy as np

from kvscope.core import ggml_types as gt
from kvscope.core.memory.cells import Ubatch, index_runs
from kvscope.core.memory.policy import ubatch_reserve_bytes
from kvscope.core.memory.recurrent import RecurrentMemory
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.memory.tensors import host_array
from kvscope.core.reader.layouts import recurrent_n_layers


def write_recurrent(mem: RecurrentMemory, w: WriteCtx, seq_id: int) -> None:
    """One recurrent section for ``seq_id`` (-1: every non-empty cell)."""
    sink = w.sink
    m = mem.seq.any(axis=1) if seq_id == -1 else mem.seq[:, seq_id]
    idx = np.flatnonzero(m).astype(np.int64)
    sink.u32(int(idx.size))
    if seq_id == -1:
        words: list[int] = []
        for i in idx.tolist():
            ids = np.flatnonzero(mem.seq[i]).tolist()
            words += [int(mem.pos[i]), len(ids), *ids]
        sink.write(np.asarray(words, dtype="<i4"))
    else:
        rec = np.zeros((idx.size, 2), dtype="<i4")
        rec[:, 0] = mem.pos[idx]
        sink.write(rec.reshape(-1))
    sink.u32(0)  # s_trans
    sink.u32(recurrent_n_layers(w.layout.gen, mem.n_layer, mem.n_layer_nextn)[0])
    runs = index_runs(idx)
    for tensors, type_id, row in ((mem.r, mem.type_r, mem.r_row), (mem.s, mem.type_s, mem.s_row)):
        for il in mem.layers:
            sink.i32(type_id)
            sink.u64(row)
            if runs and row:
                sink.write_rows(host_array(tensors[il]), runs)
            if tensors is mem.r and il in mem.p:
                sink.u64(mem.p_row)
                if runs and mem.p_row:
                    sink.write_rows(host_array(mem.p[il]), runs)


def read_recurrent(mem: RecurrentMemory, r: ReadCtx, seq_id: int) -> None:
    """Restore a recurrent section into ``seq_id`` (-1: the whole memory)."""
    io = r.io
    off_cc = io.pos
    count = io.u32("cell_count")
    try:
        _read_meta(mem, r, count, off_cc, seq_id)
    except RestoreFailure as f:
        f.section = f.section or mem.name
        if not f.thrown:
            r.policy.recurrent_failure(mem, seq_id, mem.head, 0, r)
        raise
    head = mem.head
    try:
        _read_data(mem, r, count, off_cc, head)
    except RestoreFailure as f:
        f.section = f.section or mem.name
        r.policy.recurrent_failure(mem, seq_id, head, count, r)
        raise


def _read_meta(mem: RecurrentMemory, r: ReadCtx, count: int, off_cc: int, seq_id: int) -> None:
    io = r.io
    if seq_id != -1:
        if r.policy.bound_before_alloc and count > mem.size:
            raise RestoreFailure("cell_count_bound", off_cc, f"cell_count {count} > {mem.size} cells: "
                                 "not enough cells in kv cache")
        mem.seq_rm(seq_id)
        r.act(f"{mem.name}: seq_rm({seq_id})")
        if count == 0:
            return
        if not r.policy.bound_before_alloc:
            r.alloc_bytes = ubatch_reserve_bytes(count, r.n_pos_per_embd)
            if r.policy.alloc_limit is not None and r.alloc_bytes > r.policy.alloc_limit:
                raise RestoreFailure("alloc", off_cc, f"ubatch_reserve({count}) would allocate {r.alloc_bytes} "
                                     "bytes: std::bad_alloc", thrown=True, alloc_bytes=r.alloc_bytes)
        positions: list[int] = []
        for i in range(count):
            off = io.pos
            positions.append(io.i32("pos"))
            n = io.u32("n_seq_id")
            if n != 0:
                raise RestoreFailure("n_seq_id", off, f"cell {i}: n_seq_id {n}, a per-sequence recurrent state "
                                     "needs 0 (invalid seq_id-agnostic kv cell)")
        ub = Ubatch(positions, [[seq_id]] * count)
        if not mem.find_slot(ub):
            raise RestoreFailure("find_slot", off_cc + 4, "failed to find available cells in kv cache")
    else:
        if count > mem.size:
            raise RestoreFailure("cell_count_bound", off_cc, f"cell_count {count} > {mem.size} cells: "
                                 "not enough cells in kv cache")
        mem.clear(True)
        r.act(f"{mem.name}: clear(data)")
        for i in range(count):
            off = io.pos
            pos = io.i32("pos")
            n = io.u32("n_seq_id")
            mem.pos[i] = pos  # set after both reads, as llama.cpp does
            for _ in range(n):
                sid = io.i32("seq_id")
                if not 0 <= sid < mem.n_seq_max:
                    raise RestoreFailure("seq_id_range", off, f"cell {i}: invalid seq_id, {sid} is out of range "
                                         f"[0, {mem.n_seq_max})")
                mem.seq[i, sid] = True
                if sid >= mem.size or mem.tail[sid] != -1:
                    raise RestoreFailure("duplicate_tail", off, f"duplicate tail for seq_id {sid} in cell {i} "
                                         f"and {int(mem.tail[sid]) if sid < mem.size else '?'}")
                mem.tail[sid] = i
        mem.head = 0
    mem.src[mem.head : mem.head + count] = np.arange(mem.head, mem.head + count)


def _read_data(mem: RecurrentMemory, r: ReadCtx, count: int, off_cc: int, head: int) -> None:
    io = r.io
    off = io.pos
    s_trans = io.u32("s_trans")
    n_layer = io.u32("n_layer")
    want = recurrent_n_layers(r.layout.gen, mem.n_layer, mem.n_layer_nextn)[0]
    if n_layer != want:  # llama.cpp compares with its own count: one build accepts one of the two
        raise RestoreFailure("n_layer", off + 4, f"mismatched layer count ({n_layer} instead of {want})")
    if count > mem.size:
        raise RestoreFailure("cell_bound", off_cc, f"not enough cells in kv cache to restore state "
                             f"({count} > {mem.size})")
    if s_trans:
        raise RestoreFailure("s_trans", off, f"incompatible s transposition (s_trans {s_trans})")
    for tensors, type_id, row, what in ((mem.r, mem.type_r, mem.r_row, "r"), (mem.s, mem.type_s, mem.s_row, "s")):
        for il in mem.layers:
            t_off = io.pos
            t = io.i32(f"{what} type")
            if t != type_id:
                raise RestoreFailure(f"{what}_type", t_off, f"mismatched {what} type ({gt.type_name(type_id)} != "
                                     f"{gt.type_name(t)}, layer {il})", layer=il)
            got = io.u64(f"{what} row size")
            if got != row:
                raise RestoreFailure(f"{what}_row_size", t_off, f"mismatched {what} row size ({row} != {got}, "
                                     f"layer {il})", layer=il)
            if count:
                io.read_tensor(mem.store, tensors[il].view(-1), head * row, count * row,
                               what=f"{what} rows of layer {il}")
            if what == "r" and il in mem.p:
                p_off = io.pos
                got = io.u64("p row size")
                if got != mem.p_row:
                    raise RestoreFailure("p_row_size", p_off, f"mismatched ple row size ({mem.p_row} != {got}, "
                                         f"layer {il})", layer=il)
                if count:
                    io.read_tensor(mem.store, mem.p[il].view(-1), head * mem.p_row, count * mem.p_row,
                                   what=f"PLE rows of layer {il}")
