"""What the lab reads from the memory core's cache after a restore: inference probes, stale cells, and
the per-component bytes a per-sequence write of a sequence holds.

**Probe.** For each sequence, a deterministic read-out for its next position (``pos_max + 1``, the
largest position the sequence holds in any component), computed with both kernels of
:mod:`~kvscope.core.lab.probe_math`. Per attention layer of every KV cache: the stream holding the
sequence, the cells the kernel reads (``cells_read(size, used_max_p1)`` from cell 0), visible = the
cells holding the sequence at a position <= the next one and, in an SWA cache, not outside the window
(``is_masked_swa``); ``q = probe_queries(il, n_head_kv, head_dim)``; K and V dequantized to float32
rows (a transposed V presented as ``[cell, dim]``). A recurrent layer contributes the r and s rows of
the sequence's cell (zeros when it has none). NaN in a masked or free cell poisons the ``dense``
read-out of every sequence of the stream, not the ``skip-masked`` one (llama.cpp issue #27068).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from kvscope.core.lab.probe_math import KERNELS, attention_readout, cells_read, max_abs_diff, probe_queries
from kvscope.core.memory import KvCache, LlamaMemory, MemoryContext, RecurrentMemory
from kvscope.core.memory.io import BufferSink, CountingSink, StateSink
from kvscope.core.memory.kv_state import swa_masked, write_kv
from kvscope.core.memory.recurrent_state import write_recurrent
from kvscope.core.memory.state_ctx import WriteCtx
from kvscope.core.memory.tensors import dequantize_rows
from kvscope.core.model.profile import ModelProfile

Rows = tuple[torch.Tensor, torch.Tensor, int]  # K, V (float32, cells read), cells read


@dataclass(frozen=True)
class Probe:
    """The read-out of one sequence: one float32 vector per kernel."""

    seq: int
    next_pos: int
    vectors: dict[str, torch.Tensor]
    segments: tuple[tuple[str, int, int, int], ...] = ()  # (component, layer, start, stop) in every vector

    def segment(self, kernel: str, role: str, il: int) -> torch.Tensor:
        """The part of the ``kernel`` vector that layer ``il`` of component ``role`` contributed."""
        for r, i, a, b in self.segments:
            if (r, i) == (role, il):
                return self.vectors[kernel][a:b]
        raise KeyError(f"no layer {il} in {role}")

    def diff(self, baseline: Probe) -> dict[str, float]:
        """Max abs difference per kernel (``inf`` when a value is non-finite where the baseline's is not)."""
        out: dict[str, float] = {}
        for k, v in self.vectors.items():
            out[k] = max_abs_diff(v, baseline.vectors[k])
        return out


def seq_pos_max_any(mem: LlamaMemory, seq: int) -> int:
    """The largest position ``seq`` holds in any component (-1: none)."""
    return max(p.mem.seq_pos_max(seq) for p in mem.parts)


def _heads(profile: ModelProfile | None, il: int, width: int) -> int:
    if profile is None or il >= len(profile.n_head_kv):
        return 1
    n = int(profile.n_head_kv[il])
    return n if n > 0 and width % n == 0 else 1


class _RowCache:
    """Dequantized rows of one measurement, shared by the sequences of a stream."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, int, int], Rows] = {}

    def get(self, part: int, cache: KvCache, il: int, strm: int) -> Rows:
        key = (part, il, strm)
        if key not in self._rows:
            cells = cache.cells[strm]
            used = np.flatnonzero(cells.pos >= 0)
            n = cells_read(cache.size, int(used[-1]) + 1 if used.size else 0)
            k = dequantize_rows(cache.k_rows(il, strm)[:n], cache.type_k)
            ly = cache.layer(il)
            v = dequantize_rows(cache.v_rows(il, strm)[:n], cache.type_v) if ly.v is not None else k
            self._rows[key] = (k, v, n)
        return self._rows[key]


def _kv_readout(part: int, cache: KvCache, profile: ModelProfile | None, seq: int, p_next: int, rows: _RowCache,
                out: dict[str, list[torch.Tensor]]) -> None:
    strm = cache.seq_to_stream(seq)
    cells = cache.cells[strm]
    for ly in cache.layers:
        k, v, n = rows.get(part, cache, ly.il, strm)
        pos = cells.pos[:n]
        vis = cells.seq[:n, seq] & (pos >= 0) & (pos <= p_next)
        if cache.swa_type:
            vis &= ~swa_masked(cache.n_swa, cache.swa_type, pos, p_next)
        visible = torch.from_numpy(np.ascontiguousarray(vis)).to(k.device)
        n_head = _heads(profile, ly.il, ly.n_embd_k)
        q = probe_queries(ly.il, n_head, ly.n_embd_k // n_head, k.device)
        for kernel in KERNELS:
            out[kernel].append(attention_readout(k, v, visible, q, kernel))


def _recurrent_readout(mem: RecurrentMemory, seq: int, out: dict[str, list[torch.Tensor]]) -> None:
    hit = np.flatnonzero(mem.seq[:, seq])
    for il in mem.layers:
        if hit.size:
            cell = [int(hit[0])]
            vec = torch.cat([mem.get_r(il, cell).reshape(-1), mem.get_s(il, cell).reshape(-1)])
        else:
            vec = torch.zeros(mem.n_embd_r + mem.n_embd_s, dtype=torch.float32)
        for kernel in KERNELS:
            out[kernel].append(vec)


def probe_sequences(ctx: MemoryContext, profile: ModelProfile | None, seqs: Iterable[int]) -> dict[int, Probe]:
    """The probe of every sequence in ``seqs`` over the current cache."""
    mem = ctx.memory
    rows = _RowCache()
    result: dict[int, Probe] = {}
    for seq in seqs:
        p_next = seq_pos_max_any(mem, seq) + 1
        out: dict[str, list[torch.Tensor]] = {k: [] for k in KERNELS}
        segments: list[tuple[str, int, int, int]] = []
        for i, part in enumerate(mem.parts):
            n0 = len(out[KERNELS[0]])
            if isinstance(part.mem, KvCache):
                _kv_readout(i, part.mem, profile, seq, p_next, rows, out)
                layers = [ly.il for ly in part.mem.layers]
            elif isinstance(part.mem, RecurrentMemory):
                _recurrent_readout(part.mem, seq, out)
                layers = list(part.mem.layers)
            else:
                continue  # DeepSeek-V4's compressed blocks: no attention readout
            start = sum(int(t.numel()) for t in out[KERNELS[0]][:n0])
            for il, t in zip(layers, out[KERNELS[0]][n0:], strict=True):
                segments.append((part.role, il, start, start + int(t.numel())))
                start += int(t.numel())
        vectors = {k: torch.cat(v) if v else torch.zeros(0) for k, v in out.items()}
        result[seq] = Probe(seq, p_next, vectors, tuple(segments))
    return result


def probe_diffs(probes: dict[int, Probe], baseline: dict[int, Probe]) -> dict[int, dict[str, float]]:
    return {s: p.diff(baseline[s]) for s, p in probes.items() if s in baseline}



# ---------------------------------------------------------------------------------------------
# stale cells


def _nonzero_free(t: torch.Tensor, free: torch.Tensor, transposed: bool, size: int, el: int) -> torch.Tensor:
    nz = (t.view(-1, size, el) != 0).any(dim=2).any(dim=0) if transposed else (t != 0).any(dim=1)
    return nz.cpu() & free


def stale_cells(ctx: MemoryContext, seq: int) -> dict[str, tuple[int, int]]:
    """Per component: (free cells holding any non-zero byte, of those holding a non-finite value), over
    the stream(s) of ``seq`` and every layer."""
    out: dict[str, tuple[int, int]] = {}
    for part in ctx.memory.parts:
        m = part.mem
        if isinstance(m, KvCache):
            strm = m.seq_to_stream(seq)
            free = torch.from_numpy(m.cells[strm].pos < 0)  # bookkeeping on the host, whatever the device
            stale = torch.zeros_like(free)
            bad = torch.zeros_like(free)
            for ly in m.layers:
                for t, is_k in ((ly.k[strm], True), (ly.v[strm] if ly.v is not None else None, False)):
                    if t is None:
                        continue
                    nz = _nonzero_free(t, free, m.v_trans and not is_k, m.size, m.v_el)
                    stale |= nz
                    bad |= _nonfinite(m, ly.il, strm, nz, is_k)
            out[part.role] = (int(stale.sum()), int(bad.sum()))
        elif isinstance(m, RecurrentMemory):
            free_r = torch.from_numpy(~m.seq.any(axis=1))
            stale = torch.zeros_like(free_r)
            bad = torch.zeros_like(free_r)
            for il in m.layers:
                for t, get in ((m.r[il], m.get_r), (m.s[il], m.get_s)):
                    nz = (t != 0).any(dim=1).cpu() & free_r if t.shape[1] else torch.zeros_like(free_r)
                    stale |= nz
                    idx = torch.nonzero(nz).flatten().tolist()
                    if idx:
                        fin = torch.isfinite(get(il, idx)).all(dim=1)
                        bad[idx] |= ~fin
            out[part.role] = (int(stale.sum()), int(bad.sum()))
    return out


def _nonfinite(cache: KvCache, il: int, strm: int, cells: torch.Tensor, is_k: bool) -> torch.Tensor:
    """Which of the flagged cells hold a non-finite K (or V) value."""
    res = torch.zeros_like(cells)
    idx = torch.nonzero(cells).flatten().tolist()
    if not idx:
        return res
    raw = cache.k_rows(il, strm)[idx] if is_k else cache.v_rows(il, strm)[idx]
    res[idx] = ~torch.isfinite(dequantize_rows(raw, cache.type_k if is_k else cache.type_v)).all(dim=1)
    return res


# ---------------------------------------------------------------------------------------------
# per-component bytes of a sequence


def _render(ctx: MemoryContext, part: KvCache | RecurrentMemory, seq: int, sink: StateSink) -> None:
    spec = ctx.memory.spec
    w = WriteCtx(sink, ctx.layout, ctx.layout.ext_bytes(spec), spec.n_layer, 0)
    if isinstance(part, KvCache):
        write_kv(part, w, seq)
    else:
        write_recurrent(part, w, seq)


def component_bytes(ctx: MemoryContext, seq: int) -> dict[str, bytes]:
    """Per component role, the section ``seq_get_data(seq)`` holds for it (flags 0)."""
    out: dict[str, bytes] = {}
    for part in ctx.memory.parts_for(ctx.layout, 0):
        if not isinstance(part.mem, (KvCache, RecurrentMemory)):
            continue  # DeepSeek-V4's blocks only exist inside its own section order
        count = CountingSink()
        _render(ctx, part.mem, seq, count)
        sink = BufferSink(count.n_bytes)
        _render(ctx, part.mem, seq, sink)
        out[part.role] = bytes(sink.buf)
    return out


def seq_cells(ctx: MemoryContext, seq: int) -> dict[str, tuple[int, int, int]]:
    """Per component: (cells holding ``seq``, pos_min, pos_max)."""
    out: dict[str, tuple[int, int, int]] = {}
    for part in ctx.memory.parts:
        m = part.mem
        if isinstance(m, KvCache):
            n = int(m.stream_of(seq).seq[:, seq].sum())
        elif isinstance(m, RecurrentMemory):
            n = int(m.seq[:, seq].sum())
        else:
            continue  # DeepSeek-V4's blocks hold rows, not cells
        out[part.role] = (n, m.seq_pos_min(seq), m.seq_pos_max(seq))
    return out
