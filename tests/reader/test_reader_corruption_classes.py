"""The reader's damage findings on every memory class of today's llama.cpp and on the v4 layout.

Real files written by both pinned builds (tests/data/gen-*, models in tests/data/gen-models):
truncations everywhere, every structural header field overwritten, a dropped record, a rotation
word out of range, and trailing junk. Each must yield findings at the bytes concerned, records
before the damage kept, and the structure tree still tiling the file.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kvharness.fixtures import DATA, model_path, profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.tree import check_tiling, coverage

pytestmark = pytest.mark.slow  # the corruption catalog over every memory class

# one file per memory class (v4 unless said), and the model that wrote it
CASES = [
    ("gen-b11434/llama-q8_0-fa1-unified0-seq0.seqstate", "llama"),  # kv, rotation words 64/64
    ("gen-b11434/gemma2-f16-fa0-unified0-seq0.seqdata.bin", "gemma2"),  # iswa
    ("gen-b11434/lfm2-swa-f16-fa0-unified0-ctx.state.bin", "lfm2-swa"),  # hybrid_iswa, empty base
    ("gen-b11434/qwen35-f16-fa0-unified0-seq0.seqstate", "qwen35"),  # hybrid, M-RoPE ext
    ("gen-b11434/deepseek32-f16-fa0-unified0-seq0.seqdata.bin", "deepseek32"),  # dsa
    ("gen-b11434/dots3note-f16-fa0-unified0-seq0.seqstate", "dots3note"),  # dsa_iswa
    ("gen-b11434/glm5-next-f16-fa0-unified0-seq0.seqstate", "glm5-next"),  # hybrid_idx, KDA
    ("gen-b11434/qwen4exp-f16-fa0-unified0-seq0.seqdata.bin", "qwen4exp"),  # hybrid_idx, PLE
    ("gen-b11434/minimax-m3-f16-fa0-unified0-seq0.seqstate", "minimax-m3"),  # msa
    ("gen-b11434/deepseek4-f16-fa0-unified0-seq0.seqdata.bin", "deepseek4"),  # dsv4
    ("gen-0c1e5709/deepseek4-f16-fa0-unified0-seq0-partial.seqdata.bin", "deepseek4"),  # dsv4 partial, v3
    ("gen-0c1e5709/qwen4exp-f16-fa0-unified0-ctx.state.bin", "qwen4exp"),  # v3 hybrid_idx context blob
]
IDS = [rel.split("/")[1].replace(".seqdata.bin", ".blob") for rel, _ in CASES]


def _prof(key: str):  # type: ignore[no-untyped-def]
    return profile(f"gen/{key}")


def _parse(data: bytes, key: str | None, kind: str | None = None) -> ParseResult:
    res = read_state(data=data, profile=_prof(key) if key else None, kind=kind)
    assert check_tiling(res.root) == []
    return res


def _errors(res: ParseResult) -> list[tuple[str, int]]:
    return [(f.code, f.offset) for f in res.findings if f.severity == "error"]


def test_models_are_there() -> None:
    for _, key in CASES:
        assert model_path(f"gen/{key}").is_file()


@pytest.mark.parametrize(("rel", "key"), CASES, ids=IDS)
@pytest.mark.parametrize("with_model", [True, False], ids=["model", "structure"])
def test_truncation_everywhere(rel: str, key: str, with_model: bool) -> None:
    path = DATA / rel
    data = path.read_bytes()
    clean = read_state(path, profile=_prof(key))
    assert clean.n_errors == 0
    rows = [lr for _, lr in clean.layer_records()]
    kind = clean.kind
    for cut in sorted(set(np.linspace(1, len(data) - 1, 60, dtype=int).tolist())):
        res = _parse(data[:cut], key if with_model else None, kind)
        errors = _errors(res)
        if with_model:
            assert errors, cut  # with the model every cut is known to be one
            assert any(c in ("truncated", "missing_layer") for c, _ in errors), (cut, errors)
            want = {(r.header_offset, r.data_size) for r in rows if r.data_offset + r.data_size <= cut}
            got = {(r.header_offset, r.data_size) for _, r in res.layer_records()}
            assert want <= got, cut  # every record before the cut is still there
        else:  # without it, a cut at a boundary is only unconfirmed; nothing may look healthy and complete
            assert errors or any(f.code == "unconfirmed_end" for f in res.findings) or res.sections[0].kind == \
                "dsv4_header", cut


def _fields(res: ParseResult) -> list[tuple[str, int, int]]:
    """(path, offset, size) of every structural header word of the memory state."""
    out = []
    for leaf in res.root.leaves():
        if leaf.kind == "field" and leaf.size in (4, 8) and leaf.path.startswith("/memory"):
            out.append((leaf.path, leaf.offset, leaf.size))
    return out


@pytest.mark.parametrize(("rel", "key"), CASES, ids=IDS)
def test_every_header_field_altered(rel: str, key: str) -> None:
    """Each structural word set to an implausible value: an error finding, at or before its bytes."""
    path = DATA / rel
    data = path.read_bytes()
    clean = read_state(path, profile=_prof(key))
    fields = _fields(clean)
    assert len(fields) >= 6
    for where, off, size in fields:
        bad = bytearray(data)
        bad[off:off + size] = (0x7FFFFFF7).to_bytes(4, "little") + (b"\x7f\xff\xff\xff" if size == 8 else b"")
        res = _parse(bytes(bad), key, clean.kind)
        errors = _errors(res)
        assert errors, where
        assert min(o for _, o in errors) <= off + size, (where, errors)


@pytest.mark.parametrize(("rel", "key"), [c for c in CASES if c[1] in ("deepseek32", "glm5-next", "minimax-m3")],
                         ids=lambda v: v if isinstance(v, str) and "/" not in v else None)
def test_dropped_k_record_is_named(rel: str, key: str) -> None:
    """A K record dropped while n_layer still counts it (the PR #21576 pattern), in a composite memory."""
    path = DATA / rel
    data = path.read_bytes()
    clean = read_state(path, profile=_prof(key))
    sec = clean.sections[0]
    st = next(s for s in sec.streams if s.k_layers)
    rec = st.k_layers[-1]
    cut = data[: rec.header_offset] + data[rec.header_offset + rec.size:]
    res = _parse(cut, key, clean.kind)
    codes = {c for c, _ in _errors(res)} | {f.code for f in res.findings}
    assert "missing_layer" in codes or "row_size_mismatch" in codes or "type_mismatch" in codes, _errors(res)
    assert min(o for _, o in _errors(res)) <= rec.header_offset + 12 if _errors(res) else True


def test_rotation_word_out_of_range() -> None:
    rel, key = CASES[0]
    path = DATA / rel
    res = read_state(path, profile=_prof(key))
    st = res.sections[0].streams[0]
    assert st.data_offset is not None and (st.n_rot_k, st.n_rot_v) == (64, 64)
    for word, value in ((8, 96), (12, 3)):
        bad = bytearray(path.read_bytes())
        struct.pack_into("<I", bad, st.data_offset + word, value)
        got = _parse(bytes(bad), key)
        assert ("value_invalid", st.data_offset + word) in _errors(got)


@pytest.mark.parametrize(("rel", "key"), CASES, ids=IDS)
def test_trailing_junk(rel: str, key: str) -> None:
    data = (DATA / rel).read_bytes() + b"JUNK" * 5
    res = _parse(data, key)
    assert any(f.code == "trailing_bytes" and f.offset == len(data) - 20 for f in res.findings)
    assert coverage(res.root)["trailing_bytes"] == 20


def test_v4_file_read_as_v3_is_refused_on_its_version(tmp_path: Path) -> None:
    rel, key = CASES[0]
    res = read_state(DATA / rel, profile=_prof(key), layout="2026-10")
    assert any(f.code == "value_invalid" and f.offset == 4 for f in res.findings) or res.n_errors
