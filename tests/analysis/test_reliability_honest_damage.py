"""Never call a damaged file clean (issue #12 item 6) and keep findings precise (#11 item 3).

Each test reproduces a case that was once read wrongly: a llama.cpp seq file taken for a
PARTIAL_ONLY blob, a model-aware read explaining fewer bytes with more damage than the
file's own structure, files cut at a section boundary or right after their header that came
out with no finding at all, and one bad token reported as two errors.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, entry_profile, manifest_entries, profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.tree import coverage

pytestmark = pytest.mark.slow  # damaged copies of every real fixture

V3 = DATA / "llamacpp-2026-10-01"


def _explained(res: ParseResult) -> int:
    c = coverage(res.root)
    return c["parsed_bytes"] + c["untrusted_bytes"]


def _errors(res: ParseResult) -> list[tuple[str, int]]:
    return [(f.code, f.offset) for f in res.findings if f.severity == "error"]


@pytest.mark.parametrize("name", sorted(p.name for p in V3.glob("gemma2-*.seqstate")))
@pytest.mark.parametrize("frac", [0.0, 0.25, 0.5, 0.9])
def test_a_seq_file_is_never_partial(name: str, frac: float) -> None:
    """llama_state_seq_save_file always writes flags 0: a gemma2 seq file cut in its SWA half is damaged."""
    data = (V3 / name).read_bytes()
    whole = read_state(data=data, profile=profile("gemma2"))
    swa = whole.sections[1]
    assert swa.role == "kv_swa"
    cut = data[: swa.offset + int(swa.size * frac)]
    for prof in (profile("gemma2"), None):
        res = read_state(data=cut, profile=prof)
        assert not res.partial
        if prof is not None:
            assert [s.role for s in res.sections][:1] == ["kv_base"]
            assert ("truncated", len(cut)) in {(c, o) for c, o in _errors(res)} or any(
                c == "truncated" for c, _ in _errors(res))
        else:
            assert res.n_errors or any(f.code == "unconfirmed_end" for f in res.findings)


def test_hybrid_attention_cell_count_overwritten() -> None:
    """The model-aware read finds the bad count at its offset, like the read without the model."""
    data = (V3 / "lfm2-f16-fa0-unified0-seq0.seqstate").read_bytes()
    whole = read_state(data=data, profile=profile("lfm2"))
    off = whole.sections[0].streams[0].offset
    bad = bytearray(data)
    struct.pack_into("<I", bad, off, 0x7FFFFFFF)
    for prof in (profile("lfm2"), None):
        res = read_state(data=bytes(bad), profile=prof)
        assert not res.partial
        assert ("cell_count_invalid", off) in _errors(res)
        assert _explained(res) == len(bad)


def test_whole_context_cell_count_overwritten_is_not_an_older_layout() -> None:
    """Recovering by the meta table (untrusted bytes) beats an older layout that explains nothing."""
    data = (V3 / "lfm2-f16-fa0-unified0-ctx.state.bin").read_bytes()
    whole = read_state(data=data, profile=profile("lfm2"))
    off = whole.sections[0].streams[0].offset
    bad = bytearray(data)
    struct.pack_into("<I", bad, off, 0x7FFFFFFF)
    for prof in (profile("lfm2"), None):
        res = read_state(data=bytes(bad), profile=prof)
        assert res.layout.name == "2026-10"
        assert ("cell_count_invalid", off) in _errors(res)
        assert _explained(res) > len(bad) * 0.9


def _section_boundary_cut(name: str, key: str) -> bytes:
    data = (V3 / name).read_bytes()
    first = read_state(data=data, profile=profile(key)).sections[0]
    return data[: first.offset + first.size]


@pytest.mark.parametrize(("name", "key"), [
    ("gemma2-f16-fa0-unified0-swafull1-seq0.seqstate", "gemma2"),
    ("lfm2-f16-fa0-unified0-seq0.seqstate", "lfm2"),
    ("lfm2-f16-fa0-unified0-ctx.session", "lfm2"),
])
def test_cut_at_a_section_boundary(name: str, key: str) -> None:
    cut = _section_boundary_cut(name, key)
    res = read_state(data=cut, profile=profile(key))
    assert not res.partial and any(c == "truncated" for c, _ in _errors(res))
    bare = read_state(data=cut)
    assert [f.code for f in bare.findings if f.severity != "info"] == []
    assert any(f.code == "unconfirmed_end" and f.offset == len(cut) for f in bare.findings)


def test_header_only_blob_and_files_cut_after_their_tokens() -> None:
    blob = (V3 / "llama-f16-fa0-unified0-seq0.seqdata.bin").read_bytes()[:8]
    assert any(c == "truncated" for c, _ in _errors(read_state(data=blob, profile=profile("llama"))))
    assert [f.code for f in read_state(data=blob).findings] == ["unconfirmed_end"]
    seq = (V3 / "llama-f16-fa0-unified0-seq0.seqstate").read_bytes()
    n = int.from_bytes(seq[8:12], "little")
    cut = seq[: 12 + 4 * n]
    assert any(c == "truncated" for c, _ in _errors(read_state(data=cut, profile=profile("llama"))))
    assert [f.code for f in read_state(data=cut).findings] == ["unconfirmed_end"]
    session = (V3 / "llama-f16-fa0-unified0-ctx.session").read_bytes()
    n = int.from_bytes(session[8:12], "little")
    # a session always holds the arch string after its tokens: its absence is certain truncation
    assert ("truncated", 12 + 4 * n) in _errors(read_state(data=session[: 12 + 4 * n]))


def test_one_bad_token_is_one_finding_on_its_bytes() -> None:
    data = bytearray((V3 / "llama-f16-fa0-unified0-ctx.session").read_bytes())
    struct.pack_into("<i", data, 12 + 4 * 3, 99999)
    res = read_state(data=bytes(data), profile=profile("llama"))
    assert [(f.code, f.offset, f.length) for f in res.findings if f.severity == "error"] == [
        ("token_out_of_vocab", 24, 4)]


def _mutations(data: bytes, res: ParseResult, rng: random.Random) -> list[bytes]:
    fields = [leaf for leaf in res.root.leaves() if leaf.kind == "field" and leaf.size == 4]
    out = []
    for leaf in rng.sample(fields, min(len(fields), 6)):
        for v in (0, 1, 0x7FFFFFFF, 0xFFFFFFFF):
            m = bytearray(data)
            struct.pack_into("<I", m, leaf.offset, v)
            out.append(bytes(m))
    out += [data[: int(len(data) * f)] for f in (0.1, 0.5, 0.9)]
    return out


def test_model_aware_read_never_explains_less_with_more_damage_silently() -> None:
    """Over single-field corruptions and cuts of real fixtures of every build and class."""
    rng = random.Random(7)
    entries = manifest_entries()
    rng.shuffle(entries)
    checked = 0
    for path, entry in entries[:40]:
        prof = entry_profile(path, entry)
        data = Path(path).read_bytes()
        for m in _mutations(data, read_state(data=data, profile=prof), rng):
            with_model = read_state(data=m, profile=prof)
            bare = read_state(data=m, kind=with_model.kind if with_model.kind != "unknown" else None)
            worse = _explained(bare) > _explained(with_model) + 64 and with_model.n_errors > bare.n_errors
            told = any(f.code == "read_by_structure" for f in with_model.findings)
            assert not worse or told, (path.name, _errors(with_model), _errors(bare))
            if with_model.kind == "seq_file":
                assert not with_model.partial
            checked += 1
    assert checked > 400
