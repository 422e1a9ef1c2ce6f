"""State diff (core/analysis/diff.py): real fixtures, single-value edits (plain and transposed), cell reordering."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import kvscope.core.analysis.diff as diffmod
from kvscope.core.analysis.diff import diff_states, first_differing_byte
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult

D = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"
CTX = D / "llama-f16-fa0-unified0-ctx.state.bin"  # 3 streams (5, 12, 2 cells), v_trans=1, f16, 4 layers


def _record(res: ParseResult, role: str, il: int, stream: int) -> LayerRecord:
    st = res.sections[0].streams[stream]
    return next(r for r in (*st.k_layers, *st.v_layers) if r.role == role and r.il == il)


def _edit(tmp_path: Path, off: int, value: float, src: Path = CTX) -> tuple[Path, float]:
    """Copy ``src`` with the f16 at ``off`` replaced; returns the copy and the old value."""
    dst = tmp_path / f"edited-{src.name}"
    shutil.copyfile(src, dst)
    data = bytearray(dst.read_bytes())
    old = float(np.frombuffer(bytes(data[off : off + 2]), "<f2")[0])
    data[off : off + 2] = np.array([value], "<f2").tobytes()
    dst.write_bytes(bytes(data))
    return dst, old


@pytest.mark.parametrize("name", [CTX.name, "lfm2-f16-fa0-unified0-ctx.session", "mamba-f32state-n3-seq1.seqstate",
                                  "gemma2-f16-fa0-unified1-swafull0-ctx.state.bin"])
def test_self_diff_is_identical(name: str) -> None:
    a, b = read_state(D / name), read_state(D / name)
    d = diff_states(a, b)
    assert d.identical and d.differences == [] and d.first_byte is None
    layers = [ld for s in d.sections for ld in s.layers]
    assert layers and all(not ld.differs for ld in layers) and all(ld.n_cells > 0 for ld in layers if ld.role != "s")
    assert d.to_json()["identical"] is True
    assert d.to_text().rstrip().endswith("identical")


def test_two_sequences_of_one_context() -> None:
    a = read_state(D / "llama-f16-fa0-unified0-seq0.seqstate")
    b = read_state(D / "llama-f16-fa0-unified0-seq1.seqstate")
    d = diff_states(a, b)
    assert not d.identical
    kinds = [x.kind for x in d.differences]
    assert kinds[0] == "bytes" and {"header", "token", "cell", "layer"} <= set(kinds)
    # tokens
    ta, tb = a.tokens, b.tokens
    first = next(i for i in range(min(len(ta), len(tb))) if ta[i] != tb[i])
    assert d.tokens["first_diff"] == first and (d.tokens["len_a"], d.tokens["len_b"]) == (len(ta), len(tb))
    tok = next(x for x in d.differences if x.kind == "token")
    assert tok.offset_a == 12 + 4 * first  # magic, version, n_token_count, then the tokens
    # cells: one sequence each (0 vs 1), so cells pair by position; B has 7 more
    (sec,) = d.sections
    assert sec.matched_by.startswith("pos") and (sec.cells_both, sec.cells_only_a, sec.cells_only_b) == (5, 0, 7)
    assert any(x.kind == "cell" and "7 cells only in B (pos 5..11)" in x.description for x in d.differences)
    assert {"stream_b": 1, "only_b": 7} in sec.streams and {"stream_a": 0, "stream_b": 1, "paired": 5} in sec.streams
    # layers: every K/V layer pair compared over the 5 paired cells; cell 0 (same BOS at pos 0) agrees
    assert len(sec.layers) == 8
    for ld in sec.layers:
        assert (ld.stream_a, ld.stream_b, ld.n_cells, ld.cells_differ) == (0, 1, 5, 4)
        assert ld.max_abs > 0.1 and 0 < ld.max_rel <= 2 and ld.first_cell_a == 1
    json.dumps(d.to_json(), allow_nan=False)
    assert "only in B" in d.to_text()


def test_one_k_value_changed(tmp_path: Path) -> None:
    res = read_state(CTX)
    rec = _record(res, "k", 2, stream=1)
    cell, dim = 6, 17
    off = rec.data_offset + cell * rec.row_bytes + 2 * dim
    path, old = _edit(tmp_path, off, 3.5)
    d = diff_states(res, read_state(path))
    assert d.first_byte == off
    layers = [ld for s in d.sections for ld in s.layers if ld.differs]
    assert len(layers) == 1
    ld = layers[0]
    assert (ld.role, ld.il, ld.stream_a, ld.stream_b) == ("k", 2, 1, 1)
    assert (ld.cells_differ, ld.n_cells, ld.first_cell_a, ld.first_cell_b) == (1, 12, cell, cell)
    assert ld.max_abs == abs(3.5 - old)
    assert ld.max_rel == pytest.approx(abs(3.5 - old) / max(3.5, abs(old)))
    assert (ld.offset_a, ld.offset_b) == (off, off)
    assert [(x.kind, x.offset_a, x.layer) for x in d.differences] == [("bytes", off, None), ("layer", off, 2)]


def test_one_transposed_v_value_changed(tmp_path: Path) -> None:
    res = read_state(CTX)
    rec = _record(res, "v", 1, stream=1)
    assert rec.transposed
    cell, dim = 9, 40
    off = rec.data_offset + (dim * rec.n_rows + cell) * rec.el_bytes
    path, old = _edit(tmp_path, off, -2.25)
    d = diff_states(read_state(path), res)
    (ld,) = [ld for s in d.sections for ld in s.layers if ld.differs]
    assert (ld.role, ld.il, ld.cells_differ, ld.first_cell_a) == ("v", 1, 1, cell)
    assert ld.max_abs == abs(-2.25 - old) and ld.offset_a == off and d.first_byte == off


def test_nan_counts_as_different(tmp_path: Path) -> None:
    res = read_state(CTX)
    rec = _record(res, "k", 0, stream=0)
    off = rec.data_offset + 2 * rec.row_bytes + 10
    path, _ = _edit(tmp_path, off, float("nan"))
    d = diff_states(res, read_state(path))
    (ld,) = [ld for s in d.sections for ld in s.layers if ld.differs]
    assert (ld.nan_a, ld.nan_b, ld.nonfinite_mismatch, ld.cells_differ) == (0, 1, 1, 1)
    assert ld.max_abs == 0.0  # only finite pairs enter max abs
    assert "NaN 0/1" in next(x.description for x in d.differences if x.kind == "layer")
    both = diff_states(read_state(path), read_state(path))
    assert both.identical  # NaN on both sides, same bytes: no difference


def _cell_span(t: CellTable, i: int) -> tuple[int, int]:
    rec = 8 + (t.ext_bytes if t.ext is not None else 0)
    s = t.seq_start
    return int(t.offset + i * rec + 4 * s[i]), int(t.offset + (i + 1) * rec + 4 * s[i + 1])


def test_cells_pair_by_sequence_and_position_not_file_order(tmp_path: Path) -> None:
    """Swap two cells (meta, K rows and transposed V columns' elements): values are the same."""
    res = read_state(CTX)
    st = res.sections[0].streams[1]
    i, j = 2, 8
    data = bytearray(CTX.read_bytes())
    (ai, bi), (aj, bj) = _cell_span(st.cells, i), _cell_span(st.cells, j)
    assert bi - ai == bj - aj
    data[ai:bi], data[aj:bj] = data[aj:bj], data[ai:bi]
    for rec in (*st.k_layers, *st.v_layers):
        p = np.frombuffer(data, np.uint8, rec.data_size, rec.data_offset).copy()
        if rec.transposed:
            m = p.view("<u2").reshape(rec.n_embd_v_gqa, rec.n_rows)
            m[:, [i, j]] = m[:, [j, i]]
        else:
            m = p.reshape(rec.n_rows, rec.row_bytes)
            m[[i, j]] = m[[j, i]]
        data[rec.data_offset : rec.data_offset + rec.data_size] = p.tobytes()
    path = tmp_path / "swapped.bin"
    path.write_bytes(bytes(data))
    b = read_state(path)
    assert b.sections[0].streams[1].cells.pos[i] == st.cells.pos[j]
    d = diff_states(res, b)
    assert [x.kind for x in d.differences] == ["bytes"] and not d.identical
    assert d.first_byte == _cell_span(st.cells, i)[0]
    assert all(ld.cells_differ == 0 and ld.n_cells > 0 for ld in d.sections[0].layers)


def test_sections_streams_and_sizes(tmp_path: Path) -> None:
    full = read_state(D / "lfm2-f16-fa0-unified0-seq0.seqdata.bin")
    part = read_state(D / "lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin")
    d = diff_states(full, part)
    assert [(s.role, s.in_a, s.in_b) for s in d.sections] == [("kv_attn", True, False), ("recurrent", True, True)]
    assert any(x.description == "section kv_attn only in A" for x in d.differences)
    # unified (1 stream) vs per-sequence streams (3): cells still pair across streams, values agree
    d = diff_states(read_state(CTX), read_state(D / "llama-f16-fa0-unified1-ctx.state.bin"))
    assert [x.kind for x in d.differences] == ["bytes", "cell"]
    assert d.sections[0].cells_both == 19 and {(ld.stream_a, ld.stream_b) for ld in d.sections[0].layers} == {
        (0, 0), (1, 0), (2, 0)}
    # a truncated copy: the first differing byte is where it ends
    cut = tmp_path / "cut.bin"
    cut.write_bytes(CTX.read_bytes()[:-100])
    d = diff_states(read_state(CTX), read_state(cut))
    assert d.first_byte == d.size_b == d.size_a - 100


def test_first_differing_byte_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffmod, "_BYTES_CHUNK", 7)
    a = np.arange(100, dtype=np.uint8)
    for k in (0, 6, 7, 50, 99):
        b = a.copy()
        b[k] ^= 1
        assert first_differing_byte(a, b) == k
    assert first_differing_byte(a, a.copy()) is None
    assert first_differing_byte(a, a[:40]) == 40 and first_differing_byte(a[:0], a) == 0
