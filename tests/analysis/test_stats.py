"""Payload statistics (core/analysis/stats.py): real fixtures, injected NaN/zero rows, every KV cache type.

The tests that take ``scan_path`` run twice: through the compiled kernel (core/_derotate.c, where it
runs) and on the numpy path alone, the reference; others compare the two directly."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvharness.page_cache import drop_cache
from kvscope.core import derotate_kernel as dk
from kvscope.core.analysis.record_values import dequantize_rows, layer_matrix, numpy_dequantize_rows, record_shape
from kvscope.core.analysis.stats import _fast_f16, scan_stats
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, LayerRecord, LayoutChoice, ParseResult, Section
from kvscope.core.reader.tree import Node
from tests.support.value_rows import ELEMENT_TYPES, KERNEL_TYPES, SPECIAL, plain_rows

D = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"
CTX = D / "llama-f16-fa0-unified0-ctx.state.bin"  # 3 streams, v_trans=1, f16
SMALL = [
    CTX,
    D / "llama-f16-fa1-unified1-ctx.state.bin",  # plain V
    D / "llama-f32-fa0-unified0-ctx.state.bin",
    D / "llama-q8_0-fa1-unified0-ctx.state.bin",
    D / "mamba-f32state-n3-ctx.state.bin",
    D / "lfm2-f16-fa0-unified0-ctx.session",  # kv + recurrent, empty s records
    D / "gemma2-f16-fa0-unified0-swafull1-seq1.seqstate",
]


@pytest.fixture(params=["kernel", "numpy"])
def scan_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs through the compiled kernel (where it runs), then with numpy alone (as on a CPU without it)."""
    if request.param == "numpy":
        monkeypatch.setattr(dk, "_MOD", None)
    return str(request.param)


def reference(buf: np.ndarray, rec: LayerRecord) -> tuple[np.ndarray, int]:
    """Straightforward [cell, dim] values and all-zero cell count of one record."""
    n, dim = record_shape(rec, buf.size - rec.data_offset)
    qt = GGMLQuantizationType(rec.type_id)
    if rec.transposed:
        raw = np.array(buf[rec.data_offset : rec.data_offset + n * dim * rec.el_bytes])
        vals = dequantize(raw.reshape(dim, -1), qt).T
        zero = int((~raw.reshape(dim, n, rec.el_bytes).any(axis=(0, 2))).sum())
    else:
        raw = np.array(buf[rec.data_offset : rec.data_offset + n * rec.row_bytes]).reshape(n, -1)
        vals = dequantize(raw, qt)
        zero = int((~raw.any(axis=1)).sum())
    return np.asarray(vals, np.float32), zero


def check_against_reference(res: ParseResult, chunk_bytes: int, buf: np.ndarray | None = None) -> None:
    rep = scan_stats(res, chunk_bytes=chunk_bytes, data=buf)
    buf = np.fromfile(res.path, np.uint8) if buf is None else buf
    assert len(rep.layers) == len(res.layer_records())
    for (_, rec), ls in zip(res.layer_records(), rep.layers, strict=True):
        assert (ls.role, ls.il, ls.type) == (rec.role, rec.il, rec.type)
        n, dim = record_shape(rec, buf.size - rec.data_offset)
        if n == 0 or dim == 0:
            assert ls.n_values == 0 and ls.note
            continue
        vals, zero = reference(buf, rec)
        fin = vals[np.isfinite(vals)].astype(np.float64)
        assert ls.n_values == vals.size
        assert ls.n_nonfinite == vals.size - fin.size
        assert ls.n_nan == int(np.isnan(vals).sum())
        assert ls.zero_rows == zero
        if fin.size:
            assert ls.min == pytest.approx(fin.min()) and ls.max == pytest.approx(fin.max())
            assert ls.mean == pytest.approx(fin.mean(), rel=1e-4, abs=1e-5 * max(1.0, float(np.abs(fin).max())))
            assert ls.rms == pytest.approx(np.sqrt((fin**2).mean()), rel=1e-4)


@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [64 << 20, 100, 7])
def test_matches_reference_on_real_fixtures(path: Path, chunk: int, scan_path: str) -> None:
    check_against_reference(read_state(path), chunk)


def test_clean_fixture_has_no_findings() -> None:
    res = read_state(CTX)
    before = list(res.findings)
    rep = scan_stats(res)
    assert res.findings == before
    assert rep.layers and all(ls.n_nonfinite == 0 and ls.zero_rows == 0 for ls in rep.layers)
    for ls in rep.layers:
        assert ls.n_values == ls.n_rows * 64 and ls.rms > 0 and ls.min < 0 < ls.max
    assert {ls.stream for ls in rep.layers} == {0, 1, 2}


def _copy(tmp_path: Path, src: Path = CTX) -> Path:
    dst = tmp_path / src.name
    shutil.copyfile(src, dst)
    return dst


def _record(res: ParseResult, role: str, il: int, stream: int = 0) -> LayerRecord:
    st = res.sections[0].streams[stream]
    return next(r for r in (*st.k_layers, *st.v_layers) if r.role == role and r.il == il)


def test_nan_rows_in_k_layer(tmp_path: Path, scan_path: str) -> None:
    path = _copy(tmp_path)
    rec = _record(read_state(path), "k", 2, stream=1)
    data = bytearray(path.read_bytes())
    lo = rec.data_offset + 3 * rec.row_bytes  # cells 3 and 4 of stream 1, layer 2
    data[lo : lo + 2 * rec.row_bytes] = np.full(rec.row_bytes, 0x7E00, "<u2").tobytes()
    path.write_bytes(bytes(data))
    res = read_state(path)
    rep = scan_stats(res)
    bad = [f for f in res.findings if f.code == "nonfinite_values"]
    assert len(bad) == 1
    f = bad[0]
    assert (f.severity, f.layer, f.offset, f.length) == ("error", 2, lo, rec.row_bytes)
    assert "128 non-finite" in f.message and f.path.endswith("/K2")
    ls = next(x for x in rep.layers if x.stream == 1 and x.role == "k" and x.il == 2)
    assert (ls.n_nan, ls.n_inf, ls.first_nonfinite) == (128, 0, 3 * 64)
    assert np.isfinite([ls.min, ls.max, ls.mean, ls.rms]).all()  # over the finite values left
    scan_stats(res)  # a second scan adds no duplicates
    assert len([f for f in res.findings if f.code == "nonfinite_values"]) == 1
    assert res.n_errors == 1


def test_inf_in_transposed_v(tmp_path: Path, scan_path: str) -> None:
    path = _copy(tmp_path)
    rec = _record(read_state(path), "v", 1, stream=1)
    assert rec.transposed
    off = rec.data_offset + (5 * rec.n_rows + 7) * rec.el_bytes  # dim 5 of cell 7
    data = bytearray(path.read_bytes())
    data[off : off + 2] = np.array([0xFC00], "<u2").tobytes()  # -inf
    path.write_bytes(bytes(data))
    res = read_state(path)
    rep = scan_stats(res)
    f = next(f for f in res.findings if f.code == "nonfinite_values")
    assert (f.offset, f.length, f.layer) == (off, 2, 1)
    assert "cell 7, dim 5" in f.message
    ls = next(x for x in rep.layers if x.stream == 1 and x.role == "v" and x.il == 1)
    assert (ls.n_inf, ls.n_nan, ls.first_nonfinite) == (1, 0, 5 * rec.n_rows + 7)


def test_zero_rows(tmp_path: Path, scan_path: str) -> None:
    path = _copy(tmp_path)
    res0 = read_state(path)
    k = _record(res0, "k", 0, stream=1)
    v = _record(res0, "v", 3, stream=1)
    data = bytearray(path.read_bytes())
    for cell in (2, 9):  # K rows zeroed
        data[k.data_offset + cell * k.row_bytes : k.data_offset + (cell + 1) * k.row_bytes] = bytes(k.row_bytes)
    payload = np.frombuffer(data, np.uint8, v.data_size, v.data_offset).view("<u2").reshape(v.n_embd_v_gqa, -1).copy()
    payload[:, [4, 6, 11]] = 0  # transposed V cells zeroed in every column
    payload[:-1, 1] = 0  # cell 1 zero except in the last column: not a zero row
    data[v.data_offset : v.data_offset + v.data_size] = payload.tobytes()
    path.write_bytes(bytes(data))
    for chunk in (64 << 20, 48, 5):
        res = read_state(path)
        rep = scan_stats(res, chunk_bytes=chunk)
        got = {(ls.role, ls.il, ls.stream): ls.zero_rows for ls in rep.layers if ls.zero_rows}
        assert got == {("k", 0, 1): 2, ("v", 3, 1): 3}
        zf = sorted((f.layer, f.offset, f.length, f.severity) for f in res.findings if f.code == "zero_rows")
        assert zf == [(0, k.data_offset + 2 * k.row_bytes, k.row_bytes, "warning"),
                      (3, v.data_offset + 4 * 2, 2, "warning")]
        assert any("3 of 12 cells" in f.message for f in res.findings)


def test_fast_f16_decode_is_exact_for_every_finite_half() -> None:
    bits = np.arange(65536, dtype=np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    got = _fast_f16(bits.view(np.int16), np.empty(65536, np.int32))
    fin = np.isfinite(ref)
    assert np.array_equal(got[fin].view(np.uint32), ref[fin].view(np.uint32))  # bit-exact, -0.0 included
    assert (np.abs(got[~fin]) >= 65536).all()


# -- synthetic records of every KV cache type ----------------------------------------------------


def synthetic(tmp_path: Path, blobs: list[tuple[int, bytes, int, bool]], pad: int = 3) -> ParseResult:
    """A file of payloads (type_id, bytes, n_rows, transposed) at odd offsets and a result describing it."""
    out = bytearray(b"\xaa" * pad)
    recs = []
    for i, (tid, raw, n_rows, trans) in enumerate(blobs):
        off = len(out)
        out += b"\x55" * 12 + raw
        if trans:
            el = GGML_QUANT_SIZES[GGMLQuantizationType(tid)][1]
            recs.append(LayerRecord("v", i, i, tid, off, off + 12, len(raw), n_rows, 0, True, el,
                                    len(raw) // (el * n_rows)))
        else:
            recs.append(LayerRecord("k", i, i, tid, off, off + 12, len(raw), n_rows, len(raw) // n_rows))
    path = tmp_path / "synthetic.bin"
    path.write_bytes(bytes(out))
    st = KvStream(0, 0, blobs[0][2], None, 1, len(blobs), k_layers=[r for r in recs if r.role == "k"],
                  v_layers=[r for r in recs if r.role == "v"])
    sec = Section("kv", "kv", 0, len(out), streams=[st])
    return ParseResult(str(path), len(out), "seq_blob", Node("f", "file", 0, len(out)), LayoutChoice("x", 1.0),
                       sections=[sec])


QUANT = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def _iq4_nl_rows(rng: np.random.Generator, n_rows: int, n_blocks: int) -> bytes:
    d = (rng.standard_normal((n_rows * n_blocks, 1)) * 0.05).astype("<f2").view(np.uint8)
    qs = rng.integers(0, 256, (n_rows * n_blocks, 16), dtype=np.uint8)
    return np.concatenate([d, qs], axis=1).tobytes()


@pytest.mark.parametrize("chunk", [64 << 20, 200, 40])
def test_every_kv_cache_type(tmp_path: Path, chunk: int, scan_path: str) -> None:
    rng = np.random.default_rng(7)
    n_rows, dim = 37, 128
    blobs = []
    for name in QUANT:
        x = rng.standard_normal((n_rows, dim)).astype(np.float32) * 3
        raw = np.asarray(quantize(x, GGMLQuantizationType[name])).view(np.uint8).copy()
        raw[5] = 0  # an all-zero-bytes row (q4_0 and q5_0 store value 0 as nonzero nibbles)
        blobs.append((int(GGMLQuantizationType[name]), raw.tobytes(), n_rows, False))
    blobs.append((int(GGMLQuantizationType.IQ4_NL), _iq4_nl_rows(rng, n_rows, dim // 32), n_rows, False))
    for name in ("F16", "F32", "BF16"):  # transposed V: [dim][cell]
        x = rng.standard_normal((dim, n_rows)).astype(np.float32)
        x[:, 9] = 0.0
        blobs.append((int(GGMLQuantizationType[name]),
                      np.asarray(quantize(x, GGMLQuantizationType[name])).view(np.uint8).tobytes(), n_rows, True))
    res = synthetic(tmp_path, blobs)
    check_against_reference(res, chunk)
    rep = scan_stats(res, chunk_bytes=chunk)
    types = [ls.type for ls in rep.layers]
    assert types == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f16", "f32", "bf16"]
    assert [ls.zero_rows for ls in rep.layers] == [1] * 8 + [0] + [1] * 3
    assert all(ls.n_values == n_rows * dim for ls in rep.layers)
    assert {f.code for f in res.findings} == {"zero_rows"}


def test_quantized_nan_scale_and_threads(tmp_path: Path, scan_path: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    raw = np.asarray(quantize(x, GGMLQuantizationType.Q8_0)).view(np.uint8).copy()
    raw[123, 34:36] = np.array([0x7E00], "<u2").view(np.uint8)  # scale of block 1 of row 123 = NaN
    res = synthetic(tmp_path, [(int(GGMLQuantizationType.Q8_0), raw.tobytes(), 300, False)])
    rec = res.sections[0].streams[0].k_layers[0]
    serial = scan_stats(res, chunk_bytes=1000, threads=1).layers[0]
    f = next(f for f in res.findings if f.code == "nonfinite_values")
    assert (f.offset, f.length) == (rec.data_offset + 123 * 68, 68)
    assert serial.n_nan == 32 and serial.first_nonfinite == 123 * 64 + 32
    threaded = scan_stats(res, chunk_bytes=1000, threads=3).layers[0]
    for k, v in vars(serial).items():  # threads sum squares without BLAS: last-bit float differences
        assert getattr(threaded, k) == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v)


def test_truncated_and_unknown_records(tmp_path: Path) -> None:
    x = np.arange(40 * 16, dtype=np.float32).reshape(40, 16)
    res = synthetic(tmp_path, [(0, x.tobytes(), 40, False)])
    rec = res.sections[0].streams[0].k_layers[0]
    data = Path(res.path).read_bytes()
    cut = data[: rec.data_offset + 10 * 64 + 17]  # 10 whole rows and a bit
    ls = scan_stats(res, data=np.frombuffer(cut, np.uint8)).layers[0]
    assert ls.note == "truncated: 10 of 40 rows" and ls.n_values == 160 and ls.max == 159.0
    rec.type_id = int(GGMLQuantizationType.Q2_K)  # gguf-py decodes it, but 64-byte rows are not whole blocks
    ls = scan_stats(res).layers[0]
    assert ls.note == "rows are not whole q2_k blocks: values not decoded" and ls.n_values == 0
    rec.type_id = int(GGMLQuantizationType.I32)  # whole blocks, but gguf-py cannot decode it
    x[[3, 30]] = 0
    res = synthetic(tmp_path, [(int(GGMLQuantizationType.I32), x.tobytes(), 40, False)])
    ls = scan_stats(res).layers[0]
    assert ls.note == "i32 values not decoded" and ls.n_values == 0 and ls.zero_rows == 2  # zero rows still counted
    with pytest.raises(ValueError, match="cannot decode i32"):
        layer_matrix(res, res.layer_records()[0][1])


def test_json_and_text(tmp_path: Path) -> None:
    nan_rows = np.full((4, 8), np.nan, np.float32)
    res = synthetic(tmp_path, [(0, nan_rows.tobytes(), 4, False), (1, np.ones((4, 8), "<f2").tobytes(), 4, False)])
    rep = scan_stats(res)
    js = rep.to_json()
    json.dumps(js, allow_nan=False)
    first = js["layers"][0]
    assert first["n_nan"] == 32 and first["min"] is None and first["rms"] is None
    assert js["layers"][1]["mean"] == 1.0
    assert js["roles"][0]["role"] == "k" and js["roles"][0]["n_nonfinite"] == 32
    text = rep.to_text()
    assert "nonfinite" in text and "zero rows" in text and text.count("\n") == 4
    md = rep.to_text(markdown=True)
    assert md.startswith("## payload statistics") and "| section |" in md


def test_layer_matrix(tmp_path: Path) -> None:
    res = read_state(CTX)
    buf = np.fromfile(CTX, np.uint8)
    for _, rec in res.layer_records():
        ref, _ = reference(buf, rec)
        m = layer_matrix(res, rec)
        assert m.dtype == np.float32 and m.shape == (rec.n_rows, 64)
        assert np.array_equal(m, ref)
        small = layer_matrix(res, rec, max_rows=4, max_cols=10)
        rs, cs = -(-rec.n_rows // 4) if rec.n_rows > 4 else 1, 7
        assert np.array_equal(small, ref[::rs, ::cs])
        assert small.shape[0] <= 4 and small.shape[1] <= 10 and small.flags.c_contiguous
    q = read_state(D / "llama-q8_0-fa1-unified0-ctx.state.bin")
    rec = q.layer_records()[0][1]
    assert np.array_equal(layer_matrix(q, rec), reference(np.fromfile(q.path, np.uint8), rec)[0])


def test_dequantize_rows_shapes() -> None:
    x = np.linspace(-1, 1, 3 * 64, dtype=np.float32).reshape(3, 64)
    raw = np.asarray(quantize(x, GGMLQuantizationType.Q4_0)).view(np.uint8)
    out = dequantize_rows(raw, int(GGMLQuantizationType.Q4_0))
    assert out.shape == (3, 64) and out.dtype == np.float32
    assert np.abs(out - x).max() < 0.15


@settings(max_examples=200, deadline=None)
@given(qt=st.sampled_from([GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0]),
       rows=st.integers(1, 5), blocks=st.integers(1, 6), data=st.data())
def test_fast_q8_0_q4_0_decode_is_gguf_py_bit_for_bit(qt: GGMLQuantizationType, rows: int, blocks: int,
                                                      data: st.DataObject) -> None:
    """The one-pass decoders (numpy's and the compiled kernel's) give gguf-py's float32 values bit
    for bit, NaN/Inf/subnormal scales included."""
    ts = GGML_QUANT_SIZES[qt][1]
    raw = np.frombuffer(data.draw(st.binary(min_size=rows * blocks * ts, max_size=rows * blocks * ts)),
                        np.uint8).reshape(rows, blocks * ts)
    with np.errstate(all="ignore"):
        want = np.asarray(dequantize(raw.copy(), qt), np.float32)
    for got in (dequantize_rows(raw, int(qt)), numpy_dequantize_rows(raw, int(qt))):
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qt", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q5_0,
                                GGMLQuantizationType.F16])
def test_no_rows_decode_to_no_values(qt: GGMLQuantizationType) -> None:
    bs, ts = GGML_QUANT_SIZES[qt]
    out = dequantize_rows(np.zeros((0, 3 * ts), np.uint8), int(qt))
    assert out.shape == (0, 3 * bs) and out.dtype == np.float32


def test_f16_sign_and_bit_pattern_edge_cases(tmp_path: Path, scan_path: str) -> None:
    rng = np.random.default_rng(11)
    pos = np.abs(rng.standard_normal((16, 32))).astype("<f2")
    neg_zero = pos.copy()
    neg_zero[3, 4] = -0.0  # the only "negative" value is -0.0
    rand_bits = rng.integers(0, 65536, (16, 32), dtype=np.uint16)  # subnormals, Inf and NaN included
    fin_bits = rand_bits.copy()
    fin_bits[(fin_bits & 0x7C00) == 0x7C00] = 0x3C00
    blobs = [(1, a.tobytes(), 16, t) for a in (pos, -pos, neg_zero, rand_bits, fin_bits) for t in (False, True)]
    res = synthetic(tmp_path, blobs)
    for chunk in (64 << 20, 64):
        check_against_reference(res, chunk)
    rep = scan_stats(res)  # plain (K) records first, then the transposed (V) ones
    assert rep.layers[2].min == 0.0 and rep.layers[2].max > 0 and rep.layers[1].max < 0
    n_bad = int(((rand_bits & 0x7C00) == 0x7C00).sum())
    assert n_bad and rep.layers[3].n_nonfinite == rep.layers[8].n_nonfinite == n_bad


@pytest.mark.parametrize(("readers", "ring", "direct"), [(1, 2, True), (2, 3, True), (4, 6, True), (3, 2, False)])
def test_cold_file_feed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: int, ring: int,
                        direct: bool) -> None:
    """The cold-file feed with one or more reads in flight and a ring of two chunks or more, with
    O_DIRECT and through the page cache, steps inside a chunk and across two, one and three scan
    threads: the statistics of the bytes given in memory, and no thread left behind."""
    import fcntl
    import os
    import threading

    import kvscope.core.analysis.cold_feed as cold_feed

    x = np.random.default_rng(5).standard_normal((400, 256)).astype("<f2")
    q = np.asarray(quantize(x[:, :128].astype(np.float32), GGMLQuantizationType.Q4_0)).view(np.uint8)
    res = synthetic(tmp_path, [(1, x.tobytes(), 400, False), (1, x.tobytes(), 400, True),
                               (int(GGMLQuantizationType.Q4_0), q.tobytes(), 400, False),
                               (0, x[:, :64].astype(np.float32).tobytes(), 400, False)])  # f32 at odd offsets
    monkeypatch.setattr(cold_feed, "FEED_MIN", 0)
    monkeypatch.setattr(cold_feed, "CHUNK", 8192)  # a hundred chunks
    monkeypatch.setattr(cold_feed, "READERS", readers)
    monkeypatch.setattr(cold_feed, "RING", ring)
    o_direct = os.O_DIRECT
    if not direct:
        monkeypatch.delattr(os, "O_DIRECT")
    feeds: list[bool] = []  # per feed: opened with O_DIRECT
    real_open = cold_feed.ColdFeed.open.__func__  # type: ignore[attr-defined]

    def spy(cls: type, *args: object) -> object:
        feed = real_open(cls, *args)
        assert feed is not None
        feeds.append(bool(fcntl.fcntl(feed.fd, fcntl.F_GETFL) & o_direct))
        return feed

    monkeypatch.setattr(cold_feed.ColdFeed, "open", classmethod(spy))
    assert not cold_feed.is_cold(res.path, 0, Path(res.path).stat().st_size)  # just written: cached
    monkeypatch.setattr(cold_feed, "is_cold", lambda *a: True)
    before = threading.active_count()
    for chunk, threads in ((64 << 20, 1), (3000, 1), (3000, 3), (64 << 20, 3)):
        plain = scan_stats(res, chunk, data=np.fromfile(res.path, np.uint8), threads=threads).layers  # no feed
        drop_cache(res.path)
        assert scan_stats(res, chunk_bytes=chunk, threads=threads).layers == plain
    assert feeds == [direct] * 4 and threading.active_count() == before


def test_cold_file_feed_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of the feed that fails leaves its steps to read their own bytes (the same
    statistics); O_DIRECT refused at the first read, the feed reads through the page cache; a step
    that raises stops the scan with the error, whatever the feed was waiting for, and leaves no
    thread behind."""
    import errno
    import fcntl
    import os
    import threading

    import kvscope.core.analysis.cold_feed as cold_feed
    import kvscope.core.analysis.stats as stats_mod

    x = np.random.default_rng(6).standard_normal((300, 256)).astype("<f2")
    res = synthetic(tmp_path, [(1, x.tobytes(), 300, False), (1, x.tobytes(), 300, True)])
    monkeypatch.setattr(cold_feed, "FEED_MIN", 0)
    monkeypatch.setattr(cold_feed, "CHUNK", 8192)
    monkeypatch.setattr(cold_feed, "is_cold", lambda *a: True)
    plain = scan_stats(res, 3000, data=np.fromfile(res.path, np.uint8)).layers
    calls = [0]
    real_pread = cold_feed.pread_into

    def flaky(fd: int, buf: memoryview, off: int) -> int:
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise OSError(5, "Input/output error")
        return real_pread(fd, buf, off)

    before = threading.active_count()
    monkeypatch.setattr(cold_feed, "pread_into", flaky)
    for threads in (1, 3):
        assert scan_stats(res, 3000, threads=threads).layers == plain
    assert calls[0] > 10

    def no_direct(fd: int, buf: memoryview, off: int) -> int:  # a file system that refuses O_DIRECT's reads
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        calls[0] += 1
        return real_pread(fd, buf, off)

    calls[0] = 0
    monkeypatch.setattr(cold_feed, "pread_into", no_direct)
    assert scan_stats(res, 3000).layers == plain and calls[0] > 10  # read through the page cache instead
    monkeypatch.setattr(cold_feed, "pread_into", real_pread)
    steps = [0]
    real_reduce = stats_mod._reduce_step

    def failing(*args: object) -> object:
        steps[0] += 1
        if steps[0] == 40:
            raise ValueError("a step failed")
        return real_reduce(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(stats_mod, "_reduce_step", failing)
    for threads in (1, 3):
        steps[0] = 0
        with pytest.raises(ValueError, match="a step failed"):
            scan_stats(res, 3000, threads=threads)
    assert threading.active_count() == before


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(qt=st.sampled_from(KERNEL_TYPES), transposed=st.booleans(), cells=st.integers(1, 40),
       units=st.integers(1, 80), chunk=st.sampled_from([64 << 20, 1000, 100, 7]), seed=st.integers(0, 2**32 - 1),
       data=st.data())
@pytest.mark.slow  # large random inputs through both paths
def test_the_kernel_gives_the_numpy_paths_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     qt: GGMLQuantizationType, transposed: bool, cells: int,
                                                     units: int, chunk: int, seed: int, data: st.DataObject) -> None:
    """One record of random rows (plain, or a transposed V of an element type), subnormals, the
    largest finite values, zeros, NaN/Inf of any payload anywhere and all-zero cells among them,
    scanned in whole rows or in pieces of rows/columns: the kernel's report and findings are the
    numpy path's, the sums to float32 rounding."""
    transposed = transposed and qt in ELEMENT_TYPES
    n = cells * units
    specials = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIAL[qt])), max_size=6))
    zero = data.draw(st.lists(st.integers(0, cells - 1), max_size=3, unique=True))
    raw = plain_rows(qt, cells, units, seed, specials, zero)  # [cell, dim]
    if transposed:  # stored [dim][cell]
        el = GGML_QUANT_SIZES[qt][1]
        raw = raw.reshape(cells, units, el).transpose(1, 0, 2)
    blobs = [(int(qt), raw.tobytes(), cells, transposed)]
    fast_res = synthetic(tmp_path, blobs)
    fast = scan_stats(fast_res, chunk_bytes=chunk).layers[0]
    with monkeypatch.context() as m:
        m.setattr(dk, "_MOD", None)
        slow_res = synthetic(tmp_path, blobs)
        slow = scan_stats(slow_res, chunk_bytes=chunk).layers[0]
    assert fast_res.findings == slow_res.findings
    for k, v in vars(slow).items():
        if k in ("mean", "rms"):
            scale = max(1.0, abs(slow.min), abs(slow.max)) if math.isfinite(slow.min) else 1.0
            assert np.isclose(getattr(fast, k), v, rtol=1e-5, atol=1e-6 * scale, equal_nan=True), (k, fast, slow)
        else:
            assert getattr(fast, k) == v or (isinstance(v, float) and math.isnan(v) and math.isnan(getattr(fast, k))), \
                (k, fast, slow)
