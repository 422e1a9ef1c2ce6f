"""A record or layer entry cut out of a real DeepSeek-V4 state is named, not the one after it.

Every K record of the raw iSWA cache, every K-cache entry (``u32 il`` + record), every compressor
entry and each record of a compressor pair is removed in turn from real files of both pinned builds;
with and without the model the reading must give one finding, ``missing_layer``, for that record
(the layer among its candidates; where only the model can name it, no candidate), keep the file's
layout generation and place every other byte. Before, the next record took the blame ("K layer
2: row size ... is not whole ... blocks", then follow-on errors) or the file was read under
another generation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvharness.fixtures import DATA, profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.tree import coverage

FILES = [
    "gen-b11434/deepseek4-f16-fa0-unified0-ctx.state.bin",  # two streams, the full block set
    "gen-b11434/deepseek4-q8_0-fa1-unified1-seq1.seqstate",  # a per-sequence file, quantized raw K
    "gen-b11434/deepseek4-q8_0-fa1-unified1-norot-seq0-partial.seqdata.bin",  # PARTIAL_ONLY: no K-cache blocks
    "gen-0c1e5709/deepseek4-f16-fa0-unified0-seq0.seqdata.bin",  # v3 layout (no rotation words)
]

Cut = tuple[str, str, int, int, int]  # (what, section role, layer il or record ordinal, start, end)


def _cuts(res: ParseResult) -> list[Cut]:
    out: list[Cut] = []
    for sec in res.sections:
        if sec.kind == "kv":
            for st in sec.streams:
                for r in st.k_layers:
                    out.append((f"{sec.role} stream {st.index} K{r.index}", sec.role,
                                r.il if r.il is not None else r.index, r.header_offset, r.data_offset + r.data_size))
        elif sec.kind in ("dsv4_kcache", "dsv4_comp"):
            per = 1 if sec.kind == "dsv4_kcache" else 2
            for i in range(0, len(sec.records), per):
                entry = sec.records[i : i + per]
                il = entry[0].il
                assert il is not None
                # the whole entry: its u32 il and its record(s)
                out.append((f"{sec.role} entry of layer {il}", sec.role, il, entry[0].header_offset - 4,
                            entry[-1].data_offset + entry[-1].data_size))
                if per == 2:
                    out += [(f"{sec.role} {r.role} of layer {il}", sec.role, il, r.header_offset,
                             r.data_offset + r.data_size) for r in entry]
    return out


def _check(res: ParseResult, cut: Cut, layout: str, with_model: bool) -> None:
    what, _role, layer, start, _ = cut
    bad = [f for f in res.findings if f.severity in ("error", "warning")]
    assert [f.code for f in bad] == ["missing_layer"], (what, [(f.code, f.offset, f.message) for f in bad])
    f = bad[0]
    cands = f.extra.get("candidates", [])
    assert layer in cands or (not with_model and not cands and "only the model can tell" in f.message), \
        (what, f.message, cands)
    assert f.offset >= start, (what, f.offset)  # at the gap or where the alike records end, never before
    assert res.layout.name == layout, (what, res.layout.name)
    cov = coverage(res.root)
    assert cov["unparsed_bytes"] == 0 and cov["trailing_bytes"] == 0, (what, cov)


@pytest.mark.parametrize("rel", FILES)
def test_each_dropped_record_is_named(rel: str) -> None:
    path = DATA / rel
    data = path.read_bytes()
    prof = profile("gen/deepseek4")
    clean = read_state(path, profile=prof)
    assert clean.n_errors == 0
    cuts = _cuts(clean)
    assert len(cuts) >= 8
    for cut in cuts:
        damaged = data[: cut[3]] + data[cut[4] :]
        for p in (prof, None):
            res = read_state(data=damaged, path=str(path), profile=p)
            _check(res, cut, clean.layout.name, p is not None)


def test_issue_case_layer_1_k_record() -> None:
    """The case of the issue: layer 1's K record of the raw cache removed."""
    path = DATA / FILES[0]
    data = path.read_bytes()
    clean = read_state(path, profile=profile("gen/deepseek4"))
    swa = next(s for s in clean.sections if s.role == "kv_raw_swa")
    rec = swa.streams[0].k_layers[1]
    assert rec.il == 1
    damaged = data[: rec.header_offset] + data[rec.data_offset + rec.data_size :]
    for p in (profile("gen/deepseek4"), None):
        res = read_state(data=damaged, path=str(Path(path)), profile=p)
        errors = [f for f in res.findings if f.severity == "error"]
        assert [f.code for f in errors] == ["missing_layer"]
        assert 1 in errors[0].extra["candidates"] and "alike" in errors[0].message
        assert res.layout.name == "2026-10-v4"
        assert not any("row size" in f.message for f in res.findings)
