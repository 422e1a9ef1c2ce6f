"""``llama_kv_cache::state_write`` / ``state_read`` (spec §4 and §7.1), for every layout.

Write: ``[n_stream]`` then per stream ``cell_count``, the cell records and the K / V records of
the selected cells (a per-sequence write skips SWA-masked cells where the layout does). Read: the
checks in llama.cpp's order -- stream count, cell-count bound, ``seq_rm``, cell records,
``find_slot``, layer count, cell bound, transposition, rotation (v11/v4), then per layer type and
row size with the rows handed over layer by layer -- with the policy consulted at the bound and
cleanup points. ``read_kv(..., mirror=...)`` is ``state_read_sinfo(..., sinfos_in)``: the cache takes
another cache's slot layout instead of searching for cells (``llama_memory_hybrid_idx``'s indexer).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from kvscope.core import ggml_types as gt
from kvscope.core.memory.cells import I64, KvCells, SlotInfo, Ubatch, index_runs
from kvscope.core.memory.kv_cache import KvCache
from kvscope.core.memory.layout import Layout
from kvscope.core.memory.policy import ubatch_reserve_bytes
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.spec import SWA_CHUNKED, SWA_NONE, SWA_STANDARD
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.memory.tensors import host_array

# ---------------------------------------------------------------------------------------------
# write


def swa_masked(n_swa: int, swa_type: int, pos: npt.NDArray[np.int32], p1: int) -> npt.NDArray[np.bool_]:
    """``is_masked_swa`` over an array of positions against ``p1``."""
    p = pos.astype(np.int64)
    if swa_type == SWA_STANDARD:
        return (p1 - p) >= n_swa
    if swa_type == SWA_CHUNKED:
        return p < (p1 // n_swa) * n_swa
    if swa_type != SWA_NONE:
        half = n_swa // 2
        return ((p1 - p) < -half) | ((p1 - p) > half)
    return np.zeros(p.shape, dtype=bool)


def select_cells(cache: KvCache, s: int, seq_id: int, masked: bool) -> I64:
    """Cells of stream ``s`` a write of ``seq_id`` (-1: all) selects, ascending."""
    c = cache.cells[s]
    m = c.nonempty()
    if seq_id >= 0:
        m &= c.seq[:, seq_id]
        if masked and cache.swa_type != SWA_NONE and m.any():
            m &= ~swa_masked(cache.n_swa, cache.swa_type, c.pos, c.seq_pos_max(seq_id))
    return np.flatnonzero(m).astype(np.int64)


def meta_words(c: KvCells, idx: I64, seq_id: int, perseq_nseq: int, ext_w: int) -> npt.NDArray[np.int32]:
    """The cell records of ``idx`` as little-endian int32 words."""
    n = int(idx.size)
    pos = c.pos[idx]
    if seq_id >= 0:
        rec = np.empty((n, 2 + ext_w + perseq_nseq), dtype="<i4")
        rec[:, 0] = pos
        rec[:, 1] = perseq_nseq
        rec[:, 2 : 2 + ext_w] = c.ext[idx, :ext_w]
        if perseq_nseq:
            rec[:, -1] = seq_id
        return rec.reshape(-1)
    seqm = c.seq[idx]
    counts = seqm.sum(axis=1).astype(np.int64)
    stride = 2 + ext_w + counts
    starts = np.zeros(n, np.int64)
    if n:
        starts[1:] = np.cumsum(stride)[:-1]
    out = np.empty(int(stride.sum()), dtype="<i4")
    out[starts] = pos
    out[starts + 1] = counts
    for e in range(ext_w):
        out[starts + 2 + e] = c.ext[idx, e]
    rows, cols = np.nonzero(seqm)
    first = np.zeros(n, np.int64)
    if n:
        first[1:] = np.cumsum(counts)[:-1]
    rank = np.arange(rows.size) - first[rows]
    out[starts[rows] + 2 + ext_w + rank] = cols
    return out


def ext_bytes_of(cache: KvCache, layout: Layout, model_ext: int) -> int:
    """Cell ext bytes per record of ``cache``: its own rule where it has one, else the model's."""
    if cache.has_ext is None:
        return model_ext
    return layout.gen.cell_ext if cache.has_ext else 0


def write_kv(cache: KvCache, w: WriteCtx, seq_id: int) -> None:
    """One KV section: every stream, the cells ``seq_id`` (-1: all) selects."""
    lay, sink = w.layout, w.sink
    ext_w = ext_bytes_of(cache, lay, w.ext_bytes) // 4
    if lay.n_stream:
        sink.u32(cache.n_stream)
    for s in range(cache.n_stream):
        idx = select_cells(cache, s, seq_id, lay.swa_perseq_masked)
        sink.u32(int(idx.size))
        if idx.size == 0 and not lay.empty_section_data:
            continue
        sink.write(meta_words(cache.cells[s], idx, seq_id, lay.perseq_kv_nseq, ext_w))
        _write_data(cache, w, s, idx)


def _write_data(cache: KvCache, w: WriteCtx, s: int, idx: I64) -> None:
    sink = w.sink
    runs = index_runs(idx)
    sink.u32(1 if cache.v_trans else 0)
    sink.u32(w.n_layer if w.layout.kv_n_layer_all else len(cache.layers))
    if w.layout.kv_rot:
        sink.u32(cache.n_rot_k)
        sink.u32(cache.n_rot_v)
    for ly in cache.layers:
        sink.i32(cache.type_k)
        sink.u64(cache.k_row(ly))
        if runs:
            sink.write_rows(host_array(ly.k[s]), runs)
    el = cache.v_el
    for ly in cache.layers:
        if ly.v is None:
            continue
        sink.i32(cache.type_v)
        if not cache.v_trans:
            sink.u64(cache.v_row(ly))
            if runs:
                sink.write_rows(host_array(ly.v[s]), runs)
        else:
            sink.u32(el)
            sink.u32(ly.n_embd_v)
            if runs:
                sink.write_cols(host_array(ly.v[s]), [(a * el, b * el) for a, b in runs])


# ---------------------------------------------------------------------------------------------
# read


def read_kv(cache: KvCache, r: ReadCtx, seq_id: int, mirror: list[SlotInfo] | None = None) -> list[SlotInfo]:
    """Restore a KV section into ``seq_id`` (-1: whole cache); returns the slots used, per stream of
    the state (``sinfos_out``). ``mirror``: adopt these slots (another cache's, per stream) instead
    of searching for cells (``sinfos_in``)."""
    io, lay = r.io, r.layout
    sinfos = [SlotInfo() for _ in range(cache.n_stream)]
    if mirror is not None and len(mirror) != cache.n_stream:
        raise RestoreFailure("mirror_streams", io.pos, "failed to restore kv cache: mirrored slot layout has the "
                             f"wrong stream count ({len(mirror)} for {cache.n_stream})", thrown=True,
                             section=cache.name)
    if lay.n_stream:
        off = io.pos
        n = io.u32("n_stream")
        if n != cache.n_stream:
            raise RestoreFailure("n_stream", off, f"n_stream mismatch: {n} in the state, the cache has "
                                 f"{cache.n_stream}", thrown=True, section=cache.name)
        n_parts = n
    else:
        n_parts = 1
    if seq_id == -1 and not r.policy.clear_whole_per_stream:
        cache.clear(True)
        r.act(f"{cache.name}: clear(data) before the streams")
    for s in range(n_parts):
        off_cc = io.pos
        cell_count = io.u32("cell_count")
        if cell_count == 0 and lay.n_stream:
            if mirror is not None and not mirror[s].empty():
                raise RestoreFailure("mirror_cells", off_cc, "failed to restore kv cache: mirrored cache holds cells "
                                     f"this one does not (stream {s})", thrown=True, section=cache.name, stream=s)
            continue
        strm = s if seq_id == -1 else cache.seq_to_stream(seq_id)
        sinfo = SlotInfo()
        try:
            _read_meta(cache, r, strm, cell_count, off_cc, seq_id, sinfo, None if mirror is None else mirror[s])
        except RestoreFailure as f:
            f.section, f.stream = f.section or cache.name, s
            if not f.thrown:
                r.policy.kv_failure(cache, seq_id, strm, sinfo, r)
            raise
        try:
            _read_data(cache, r, strm, cell_count, off_cc, sinfo)
        except RestoreFailure as f:
            f.section, f.stream = f.section or cache.name, s
            r.policy.kv_failure(cache, seq_id, strm, sinfo, r)
            raise
        sinfos[s] = sinfo
    return sinfos


def _records(r: ReadCtx, count: int, ext_w: int, want_nseq: int, what: str) -> npt.NDArray[np.int32]:
    """``count`` per-sequence records, the n_seq_id check made record by record as llama.cpp does."""
    io = r.io
    rec_words = 2 + ext_w + want_nseq
    rec = 4 * rec_words
    start = io.pos
    fit = min(count, max(0, io.size - start) // rec)
    words = io.i32_array(fit * rec_words, what).reshape(fit, rec_words)
    bad = np.flatnonzero(words[:, 1] != want_nseq)
    if bad.size:
        i = int(bad[0])
        raise RestoreFailure("n_seq_id", start + i * rec, f"cell {i}: n_seq_id {int(words[i, 1])}, a "
                             f"per-sequence state needs {want_nseq} (invalid seq_id-agnostic kv cell)")
    if fit < count:  # the record cut short: read field by field to fail where llama.cpp does
        rec_off = io.pos
        io.i32("pos")
        n = io.u32("n_seq_id")
        if n != want_nseq:
            raise RestoreFailure("n_seq_id", rec_off, f"cell {fit}: n_seq_id {n}, a per-sequence state needs "
                                 f"{want_nseq} (invalid seq_id-agnostic kv cell)")
        io.read(4 * ext_w, "cell ext")
        io.read(4 * want_nseq, "seq_id")
    return words


def _mirror_size(mirror: SlotInfo, cell_count: int, off_cc: int) -> None:
    held = 0 if mirror.empty() else int(mirror.idxs[0].size)
    if mirror.empty() or len(mirror.strm) != 1 or held != cell_count:
        raise RestoreFailure("mirror_count", off_cc, f"mirrored slot layout holds {held} cells, this cache "
                             f"restores {cell_count}")


def _read_meta(cache: KvCache, r: ReadCtx, strm: int, cell_count: int, off_cc: int, seq_id: int,
               sinfo: SlotInfo, mirror: SlotInfo | None = None) -> None:
    io, lay = r.io, r.layout
    c = cache.cells[strm]
    ext_w = ext_bytes_of(cache, lay, r.ext_bytes) // 4
    if seq_id != -1:
        if r.policy.bound_before_alloc and cell_count > c.size:
            raise RestoreFailure("cell_count_bound", off_cc, f"cell_count {cell_count} > {c.size} cells: "
                                 "not enough cells in kv cache")
        cache.seq_rm(seq_id)
        r.act(f"{cache.name}: seq_rm({seq_id})")
        if not r.policy.bound_before_alloc:
            r.alloc_bytes = ubatch_reserve_bytes(cell_count, r.n_pos_per_embd)
            if r.policy.alloc_limit is not None and r.alloc_bytes > r.policy.alloc_limit:
                raise RestoreFailure("alloc", off_cc, f"ubatch_reserve({cell_count}) would allocate "
                                     f"{r.alloc_bytes} bytes: std::bad_alloc", thrown=True, alloc_bytes=r.alloc_bytes)
        if cell_count == 0:
            return
        k = lay.perseq_kv_nseq
        words = _records(r, cell_count, ext_w, k, "cell records")
        pos = words[:, 0]
        ub = Ubatch(pos.tolist(), [[seq_id]] * cell_count)
        if mirror is not None:
            _mirror_size(mirror, cell_count, off_cc)
            found = SlotInfo([strm], [mirror.idxs[0].copy()])
            # adopted before the checks, so a failure zeroes these cells (cells past the end are left out)
            sinfo.strm, sinfo.idxs = [strm], [found.idxs[0][found.idxs[0] < c.size]]
            busy = found.idxs[0][(found.idxs[0] >= c.size) | (c.pos[np.minimum(found.idxs[0], c.size - 1)] != -1)]
            if busy.size:
                raise RestoreFailure("mirror_busy", off_cc + 4, f"cell {int(busy[0])} of the mirrored slot layout "
                                     "is not free")
        else:
            found = cache.find_slot(ub, cont=lay.contiguous_restore)
            if found.empty():
                raise RestoreFailure("find_slot", off_cc + 4, f"failed to find {cell_count} available cells in kv "
                                     "cache" + (" (contiguous)" if lay.contiguous_restore else ""))
            sinfo.strm, sinfo.idxs = found.strm, found.idxs
        cache.apply_ubatch(found, ub)
        if ext_w:
            idx = found.idxs[0]
            c.ext[idx, :ext_w] = words[:, 2 : 2 + ext_w]
            if ext_w < 3:
                c.ext[idx, 2] = -1
        return
    if cell_count > c.size:
        raise RestoreFailure("cell_count_bound", off_cc, f"cell_count {cell_count} > {c.size} cells: "
                             "not enough cells in kv cache")
    if mirror is not None:
        _mirror_size(mirror, cell_count, off_cc)
    if r.policy.clear_whole_per_stream:
        cache.clear(True)
        r.act(f"{cache.name}: clear(data) in stream {strm}")
    for i in range(cell_count):
        rec_off = io.pos
        pos_i = io.i32("pos")
        n = io.u32("n_seq_id")
        c.pos[i] = pos_i  # pos_set() after both reads: a record cut short leaves the cell empty
        if ext_w:
            c.ext[i, :ext_w] = io.i32_array(ext_w, "cell ext")
        for _ in range(n):
            sid = io.i32("seq_id")
            if sid < 0 or sid >= cache.n_seq_max:
                raise RestoreFailure("seq_id_range", rec_off, f"cell {i}: invalid seq_id, {sid} is out of range "
                                     f"[0, {cache.n_seq_max})")
            c.seq[i, sid] = True
    sinfo.strm = [strm]
    sinfo.idxs = [np.arange(cell_count, dtype=np.int64)]
    c.head = 0


def _check(cond: bool, check: str, off: int, msg: str, layer: int | None = None) -> None:
    if cond:
        raise RestoreFailure(check, off, msg, layer=layer)


def _read_data(cache: KvCache, r: ReadCtx, strm: int, cell_count: int, off_cc: int, sinfo: SlotInfo) -> None:
    io, lay = r.io, r.layout
    c = cache.cells[strm]
    off = io.pos
    v_trans = io.u32("v_trans")
    n_layer = io.u32("n_layer")
    rot_k = io.u32("n_rot_k") if lay.kv_rot else cache.n_rot_k
    rot_v = io.u32("n_rot_v") if lay.kv_rot else cache.n_rot_v
    want = r.n_layer if lay.kv_n_layer_all else len(cache.layers)
    _check(n_layer != want, "n_layer", off + 4, f"mismatched layer count ({n_layer} instead of {want})")
    _check(cell_count > c.size, "cell_bound", off_cc, f"not enough cells in kv cache to restore state "
           f"({cell_count} > {c.size})")
    _check(bool(v_trans) != cache.v_trans, "v_trans", off, f"incompatible V transposition (v_trans {v_trans})")
    _check(rot_k != cache.n_rot_k, "n_rot_k", off + 8, f"incompatible key rotation ({rot_k} instead of "
           f"{cache.n_rot_k})")
    _check(rot_v != cache.n_rot_v, "n_rot_v", off + 12, f"incompatible value rotation ({rot_v} instead of "
           f"{cache.n_rot_v})")
    runs = sinfo.runs(0) if cell_count else []
    store, size = cache.store, c.size
    for ly in cache.layers:
        t_off = io.pos
        t = io.i32("K type")
        _check(t != cache.type_k, "k_type", t_off, f"mismatched key type ({gt.type_name(cache.type_k)} != "
               f"{gt.type_name(t)}, layer {ly.il})", ly.il)
        row = io.u64("K row size")
        kr = cache.k_row(ly)
        _check(row != kr, "k_row_size", t_off, f"mismatched key row size ({kr} != {row}, layer {ly.il})", ly.il)
        kf = ly.k[strm].view(-1)
        for a, b in runs:
            io.read_tensor(store, kf, a * kr, (b - a) * kr, what=f"K rows of layer {ly.il}")
    el = cache.v_el
    for ly in cache.layers:
        if ly.v is None:
            continue
        t_off = io.pos
        t = io.i32("V type")
        _check(t != cache.type_v, "v_type", t_off, f"mismatched value type ({gt.type_name(cache.type_v)} != "
               f"{gt.type_name(t)}, layer {ly.il})", ly.il)
        vf = ly.v[strm].view(-1)
        if not cache.v_trans:
            row = io.u64("V row size")
            vr = cache.v_row(ly)
            _check(row != vr, "v_row_size", t_off, f"mismatched value row size ({vr} != {row}, layer {ly.il})",
                   ly.il)
            for a, b in runs:
                io.read_tensor(store, vf, a * vr, (b - a) * vr, what=f"V rows of layer {ly.il}")
            continue
        got_el = io.u32("V element size")
        _check(got_el != el, "v_el_size", t_off, f"mismatched value element size ({el} != {got_el}, "
               f"layer {ly.il})", ly.il)
        n_embd = io.u32("n_embd_v_gqa")
        _check(n_embd != ly.n_embd_v, "v_n_embd", t_off, f"mismatched GQA embedding size ({ly.n_embd_v} != "
               f"{n_embd}, layer {ly.il})", ly.il)
        what = f"transposed V of layer {ly.il}"
        if len(runs) == 1:
            a, b = runs[0]
            io.read_tensor(store, vf, a * el, (b - a) * el, ly.n_embd_v, size * el, what=what)
        else:
            for j in range(ly.n_embd_v):
                for a, b in runs:
                    io.read_tensor(store, vf, (a + j * size) * el, (b - a) * el, what=what)
