"""Corrupted copies of real fixtures: right finding code at the right offset, partial results kept.

Offsets come from the clean file's structure tree (node paths), never from hand arithmetic.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kvharness.fixtures import DATA, profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.tree import check_tiling, coverage

SEQ_FILE = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
CTX_3STREAM = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.state.bin"
SESSION_OLD = DATA / "llamacpp-2025-05-08/llama-f16-fa0-ctx.session"
LFM2_SEQ = DATA / "llamacpp-2026-10-01/lfm2-f16-fa0-unified0-seq0.seqdata.bin"
GEMMA2_SEQ = DATA / "llamacpp-2026-10-01/gemma2-f16-fa0-unified1-swafull0-seq0.seqdata.bin"
MAMBA_CTX = DATA / "llamacpp-2026-10-01/mamba-f32state-n3-ctx.state.bin"
LAB = DATA / "lab/llamacpp-2026-10-01"


def _model(path: Path) -> str:
    return path.name.split("-")[0]


def _parse(data: bytes, key: str | None) -> ParseResult:
    res = read_state(data=data, profile=profile(key) if key else None)
    assert check_tiling(res.root) == []
    cov = coverage(res.root)
    assert sum(v for k, v in cov.items() if k != "size") == len(data)
    return res


def _node_offset(path: Path, node_path: str) -> tuple[int, int]:
    res = read_state(path, profile=profile(_model(path)))
    node = res.root.find(node_path)
    assert node is not None, node_path
    return node.offset, node.size


def _put(data: bytes, off: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def _codes(res: ParseResult) -> list[tuple[str, int]]:
    return [(f.code, f.offset) for f in res.findings if f.severity == "error"]


# --- truncation ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [SEQ_FILE, CTX_3STREAM, SESSION_OLD, LFM2_SEQ, GEMMA2_SEQ, MAMBA_CTX],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("with_model", [True, False])
def test_truncation_everywhere(path: Path, with_model: bool) -> None:
    data = path.read_bytes()
    clean = read_state(path, profile=profile(_model(path)))
    rows = [lr for _, lr in clean.layer_records()]
    for cut in sorted(set(np.linspace(1, len(data) - 1, 120, dtype=int).tolist())):
        res = _parse(data[:cut], _model(path) if with_model else None)
        errors = [f for f in res.findings if f.severity == "error"]
        assert errors, cut
        if res.kind == "unknown":  # a few bytes cannot be told apart from any other file
            assert cut < 8 or not with_model or path.suffix == ".bin", cut
            continue
        assert any(f.code in ("truncated", "missing_layer") for f in errors), (cut, _codes(res))
        # records that end before the cut are all still there
        if with_model:
            want = [r for r in rows if r.data_offset + r.data_size <= cut]
            got = {(r.header_offset, r.data_size) for _, r in res.layer_records()}
            assert {(r.header_offset, r.data_size) for r in want} <= got, cut


def test_truncated_payload_offset_and_partial_layers() -> None:
    data = SEQ_FILE.read_bytes()
    k2, _ = _node_offset(SEQ_FILE, "/memory/kv/stream0/K2/rows")
    res = _parse(data[: k2 + 100], "llama")
    f = next(f for f in res.findings if f.code == "truncated")
    assert f.offset == k2 and f.length == 100 and f.layer == 2
    stream = res.sections[0].streams[0]
    assert [r.il for r in stream.k_layers] == [0, 1]  # layer 2's rows are cut: reported, not listed
    assert stream.cells is not None and stream.cells.count == 5


# --- header and meta fields ------------------------------------------------------------------

FIELD_CASES = [
    # (node path, struct format, value, expected code, finding at the node's offset?)
    ("/n_token_count", "<I", 10**6, "truncated", False),
    ("/memory/kv/n_stream", "<I", 0, "stream_count_invalid", True),
    ("/memory/kv/n_stream", "<I", 0x7FFFFFFF, "stream_count_invalid", True),
    ("/memory/kv/stream0/cell_count", "<I", 0x7FFFFFFF, "cell_count_invalid", True),
    ("/memory/kv/stream0/cell_count", "<I", 6, "cell_count_invalid", True),
    ("/memory/kv/stream0/cell_count", "<I", 4, "cell_count_invalid", True),
    ("/memory/kv/stream0/v_trans", "<I", 5, "value_invalid", True),
    ("/memory/kv/stream0/n_layer", "<I", 3, "layer_count_mismatch", True),
    ("/memory/kv/stream0/n_layer", "<I", 5, "layer_count_mismatch", True),
    ("/memory/kv/stream0/K1/header", "<i", 99, "type_mismatch", True),
    ("/memory/kv/stream0/K1/header", "<i", 0, "row_size_mismatch", True),
    ("/memory/kv/stream0/V2/header", "<i", 8, "row_size_mismatch", True),
    ("/version", "<I", 1, "value_invalid", True),  # never written (#27: above the newest is "newer")
]


@pytest.mark.parametrize(("node_path", "fmt", "value", "code", "at_node"), FIELD_CASES,
                         ids=[f"{c[0]}={c[2]}" for c in FIELD_CASES])
def test_field_altered(node_path: str, fmt: str, value: int, code: str, at_node: bool) -> None:
    off, _ = _node_offset(SEQ_FILE, node_path)
    res = _parse(_put(SEQ_FILE.read_bytes(), off, fmt, value), "llama")
    hits = [f for f in res.findings if f.code == code and f.severity == "error"]
    assert hits, _codes(res)
    if at_node:
        assert hits[0].offset == off, _codes(res)
    assert res.kind == "seq_file"
    if code != "truncated":
        assert res.tokens[:1] == [1]


def test_k_row_size_altered() -> None:
    off, _ = _node_offset(SEQ_FILE, "/memory/kv/stream0/K3/header")
    res = _parse(_put(SEQ_FILE.read_bytes(), off + 4, "<Q", 130), "llama")
    f = next(f for f in res.findings if f.code == "row_size_mismatch")
    assert f.offset == off and f.layer == 3
    assert [r.il for r in res.sections[0].streams[0].k_layers] == [0, 1, 2]


def test_per_seq_n_seq_id() -> None:
    off, _ = _node_offset(SEQ_FILE, "/memory/kv/stream0/cells")
    res = _parse(_put(SEQ_FILE.read_bytes(), off + 12 * 2 + 4, "<I", 2), "llama")
    f = next(f for f in res.findings if f.code == "seq_meta_invalid" and f.severity == "error")
    assert f.offset == off + 12 * 2 + 4


def test_whole_context_seq_id_out_of_range() -> None:
    off, _ = _node_offset(CTX_3STREAM, "/memory/kv/stream1/cells")
    res = _parse(_put(CTX_3STREAM.read_bytes(), off + 8, "<i", 4000), "llama")
    assert any(f.code == "seq_meta_invalid" for f in res.findings)


def test_position_anomaly() -> None:
    off, _ = _node_offset(SEQ_FILE, "/memory/kv/stream0/cells")
    res = _parse(_put(SEQ_FILE.read_bytes(), off + 12 * 3, "<i", -5), "llama")
    f = next(f for f in res.findings if f.code == "position_anomaly")
    assert f.offset == off + 12 * 3


def test_token_out_of_vocab_and_arch_mismatch() -> None:
    off, _ = _node_offset(SEQ_FILE, "/tokens")
    res = _parse(_put(SEQ_FILE.read_bytes(), off + 4, "<i", 5000), "llama")
    # one bad token is one finding, on its own 4 bytes, and says nothing about the model
    errors = [f for f in res.findings if f.severity == "error"]
    assert [(f.code, f.offset, f.length) for f in errors] == [("token_out_of_vocab", off + 4, 4)]
    res = read_state(MAMBA_CTX, profile=profile("llama"))
    assert any(f.code == "model_mismatch" for f in res.findings)


def test_trailing_junk() -> None:
    data = SEQ_FILE.read_bytes()
    res = _parse(data + b"JUNK" * 3, "llama")
    f = next(f for f in res.findings if f.code == "trailing_bytes")
    assert (f.offset, f.length, f.severity) == (len(data), 12, "warning")
    sess = (DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.session").read_bytes()
    res = _parse(sess + b"\0" * 4, "llama")
    assert any(f.code == "trailing_bytes" and f.severity == "error" for f in res.findings)


def test_not_a_state_file() -> None:
    for data in (b"", b"abc", b"hello world, this is text\n" * 10, bytes(range(256)) * 4):
        res = read_state(data=data)
        assert res.kind == "unknown"
        assert res.findings[0].code == "unknown_format"


# --- dropped and swapped layer records --------------------------------------------------------

@pytest.mark.parametrize("scenario", ["llama/fa0-unified1", "llama/fa1-unified1", "llama", "gemma2", "lfm2"])
def test_lab_drop_k_layer_is_missing_layer(scenario: str) -> None:
    path = LAB / scenario / "drop_k_layer_1.seqdata.bin"
    key = scenario.split("/")[0]
    for p in (profile(key), None):
        res = read_state(path, profile=p)
        miss = [f for f in res.findings if f.code == "missing_layer"]
        assert miss, [(f.code, f.offset, f.message) for f in res.findings]
        if p is None and key != "llama":  # an iSWA half or a hybrid's cache without the model: indexes, not layers
            assert miss[0].layer is None and miss[0].extra["index"] == 1, miss[0]
            assert miss[0].extra["candidates_are"] == "index" and "record #1 (candidates: #0..#1)" in miss[0].message
        else:
            assert miss[0].layer is not None
        assert 1 in miss[0].extra["candidates"] or p is None


def test_drop_k_and_v_of_one_layer() -> None:
    """PR #21576's guard drops one layer's K *and* V while n_layer still counts it."""
    clean = read_state(SEQ_FILE, profile=profile("llama"))
    st = clean.sections[0].streams[0]
    data = bytearray(SEQ_FILE.read_bytes())
    for rec in sorted([st.v_layers[2], st.k_layers[2]], key=lambda r: -r.header_offset):
        del data[rec.header_offset : rec.data_offset + rec.data_size]
    res = _parse(bytes(data), "llama")
    miss = [f for f in res.findings if f.code == "missing_layer"]
    assert len(miss) == 2
    assert {f.extra["role"] for f in miss} == {"k", "v"}
    assert res.sections[0].streams[0].cells is not None


def test_resync_after_garbled_k_header() -> None:
    off, _ = _node_offset(SEQ_FILE, "/memory/kv/stream0/K1/header")
    data = _put(_put(SEQ_FILE.read_bytes(), off, "<i", 77), off + 4, "<Q", 12345)
    res = _parse(data, None)
    assert any(f.code == "type_mismatch" and f.offset == off for f in res.findings)
    assert any(f.code == "resynced" for f in res.findings)
    st = res.sections[0].streams[0]
    assert len(st.k_layers) == 3 and not st.k_layers[-1].trusted
    assert len(st.v_layers) == 4
    assert coverage(res.root)["untrusted_bytes"] > 0


@pytest.mark.parametrize("path", sorted((DATA / "fuzz-regressions").glob("*.bin")), ids=lambda p: p.name)
def test_fuzz_regressions(path: Path) -> None:
    """Inputs the fuzzers once broke the reader with (tiling gaps, overlaps): parse them all again."""
    data = path.read_bytes()
    for key in (None, "llama", "mamba", "gemma2", "lfm2"):
        _parse(data, key)
