"""The verdict line, the missing bytes of truncated files and the overview, on real llama.cpp files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, MODELS, profile
from kvscope.core.analysis.compat import compatibility
from kvscope.core.analysis.overview import NOT_VERIFIED, build_overview, verify_lines
from kvscope.core.analysis.verdict import counts_text, missing_bytes, plural, verdict
from kvscope.core.findings import Finding
from kvscope.core.reader.layouts import GENERATIONS
from kvscope.core.reader.parse import read_state

LAB = DATA / "lab" / "llamacpp-2026-10-01"
CLEAN = {"seqdata.bin": "seq0.clean.seqdata.bin", "seqstate": "seq0.clean.seqstate",
         "session": "context.session", "state.bin": "context.state.bin"}


def _clean_of(path: Path) -> Path:
    """The untruncated file a lab truncation was cut from (same scenario folder, same kind)."""
    ext = next(e for e in CLEAN if path.name.endswith("." + e))
    return path.parent / CLEAN[ext]


def test_plural() -> None:
    assert [plural(n, "cell") for n in (0, 1, 2, 1000)] == ["0 cells", "1 cell", "2 cells", "1,000 cells"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert counts_text({"error": 1, "warning": 0, "info": 2}) == "3 findings (1 error, 0 warnings, 2 info)"
    assert counts_text({"error": 0, "warning": 1, "info": 0}) == "1 finding (0 errors, 1 warning, 0 info)"


def test_healthy_and_not_a_state_file() -> None:
    res = read_state(MODELS / "llama-f16-fa0-unified0-ctx.session", profile=profile("llama"))
    v = verdict(res, profile("llama"))
    assert v.level == "healthy" and v.title == "healthy" and v.missing is None
    assert v.line().startswith(f"healthy: all {res.size:,} bytes parsed")
    text = read_state(Path(__file__).parents[2] / "README.md")
    nv = verdict(text)
    assert nv.level == "not_state" and nv.title == "not a state file" and "llama.cpp" in nv.reason


def test_truncated_file_is_damaged_with_its_missing_bytes() -> None:
    path = LAB / "llama" / "truncated_half.seqdata.bin"
    res = read_state(path, profile=profile("llama"))
    v = verdict(res, profile("llama"))
    assert v.level == "damaged" and v.reason.startswith("the file ends early")
    m = v.missing
    assert m is not None and m.finding.code == "truncated" and v.top_findings[0] is m.finding
    assert m.file_end == res.size == os.path.getsize(path)
    assert m.needed_end == m.finding.offset + m.finding.extra["needed"]
    # the cut K record's rest, the four V records of the stream, then the next stream's cell count
    assert [r.name for r in m.records] == ["stream0/K3 (rest)", "stream0/V0", "stream0/V1", "stream0/V2",
                                           "stream0/V3", "stream1"]
    assert m.records[0].offset == m.file_end
    assert all(a.offset + a.size == b.offset for a, b in zip(m.records, m.records[1:], strict=False))
    assert m.expected_end == m.records[-1].offset + m.records[-1].size
    assert m.expected_end == os.path.getsize(_clean_of(path))  # the file it was cut from
    assert m.more_may_follow  # the next stream's cells are unknown: a lower bound
    assert f"at least {m.missing:,} bytes missing" in v.reason


@pytest.mark.parametrize("family", ["llama", "gemma2", "lfm2", "mamba"])
@pytest.mark.parametrize("with_model", [False, True])
def test_missing_bytes_never_exceed_the_original(family: str, with_model: bool) -> None:
    prof = profile(family) if with_model else None
    cut = sorted(p for p in (LAB / family).glob("*trunc*") if ".after." not in p.name)
    assert cut
    exact = 0
    for path in cut:
        res = read_state(path, profile=prof)
        m = missing_bytes(res, prof)
        if res.size <= 8:
            continue  # a bare header: the reader decides whether that is damage
        assert m is not None, path.name
        original = os.path.getsize(_clean_of(path))
        assert res.size < m.needed_end <= m.expected_end <= original, path.name
        exact += m.expected_end == original
        if not m.more_may_follow:
            assert m.expected_end == original, path.name  # a complete estimate is the original size
    assert exact >= 1


def test_a_full_estimate_needs_the_model_for_recurrent_layers() -> None:
    path = LAB / "mamba" / "truncated_half.seqdata.bin"
    without = missing_bytes(read_state(path), None)
    with_model = missing_bytes(read_state(path, profile=profile("mamba")), profile("mamba"))
    assert without is not None and with_model is not None
    assert without.more_may_follow and without.expected_end == without.needed_end
    assert not with_model.more_may_follow and with_model.expected_end == os.path.getsize(_clean_of(path))
    assert "at least" not in with_model.text()


def test_warnings_and_model_mismatch_are_suspicious() -> None:
    res = read_state(MODELS / "llama-f16-fa0-unified0-seq0.seqstate")
    assert verdict(res).level == "healthy"
    res.findings.append(Finding("warning", "resynced", 100, 8, "bad K record; resynced"))
    assert verdict(res).line() == "suspicious: bad K record; resynced"
    res.findings.append(Finding("error", "model_mismatch", 0, 8, "written by another model"))
    v = verdict(res)
    assert v.level == "suspicious" and "does not fit the model" in v.reason
    res.findings.append(Finding("error", "cell_count_invalid", 32, 4, "cell_count 9 but 5 cells"))
    v = verdict(res)
    assert v.level == "damaged" and v.reason == "cell_count 9 but 5 cells (and 1 more error)"
    assert [f.severity for f in v.top_findings][:3] == ["error", "error", "warning"]


def test_overview_of_a_session(tmp_path: Path) -> None:
    path = MODELS / "llama-f16-fa0-unified0-ctx.session"
    res = read_state(path, profile=profile("llama"))
    compat = compatibility(res, profile("llama"))
    ov = build_overview(res, profile("llama"), compat)
    rows = dict(ov.rows())
    assert list(rows)[0] == "verdict" and rows["verdict"].startswith("healthy")
    assert rows["kind"] == "session file (session_file)" and "llama_state_save_file" in rows["written by"]
    assert rows["layout"].startswith(f"{res.layout.name} (") and "confidence" in rows["layout"]
    assert rows["model"].startswith("tiny-llama.gguf (llama, 4 layers") and "fits" in rows["model"]
    assert f"{len(res.tokens)} tokens" in rows["sequences"]
    assert "seq 0 (kv · stream 0): 5 cells, positions 0..4" in rows["sequences"]
    assert len(ov.compat_lines()) == len(GENERATIONS) and ov.loads_in() == [res.layout.name]
    assert rows["verified"] == NOT_VERIFIED
    text = "\n".join(v for _, v in ov.rows()) + str(ov.to_json())
    assert str(MODELS) not in text  # base names unless full_paths
    full = build_overview(res, profile("llama"), compat, full_paths=True)
    assert full.to_json()["path"] == str(path) and str(MODELS) in dict(full.rows())["model"]


def test_verify_result_lines() -> None:
    assert verify_lines(None) == [NOT_VERIFIED]
    lines = verify_lines({"verdict": "equivalent", "engine": {"kind": "libllama", "build": "b11434"},
                          "restore": {"ok": True, "message": "restored 7 cells"},
                          "next_token": {"max_abs_logit_diff": 0.00012, "same_argmax": True, "kl": 1e-7},
                          "records": [{"layer": 0, "max_abs_diff": 0.0}]})
    assert lines == ["equivalent (engine libllama b11434)", "restore: ok: restored 7 cells",
                     "next token: max |logit diff| 0.00012, same next token, KL 1e-07",
                     "record: layer 0, max_abs_diff 0.0"]


def test_verify_result_lines_of_verify_records() -> None:
    """``kvscope verify --json`` records: counted per status, each that is not a match named."""
    rec = {"section": "kv", "section_index": 0, "stream": 0, "role": "k", "il": 0, "status": "match", "max_abs": 0.0}
    lines = verify_lines({"verdict": "damaged", "engine": {"kind": "llama.cpp", "build": "b11434"},
                          "records": [{**rec, "il": 1, "role": "v", "status": "nonfinite"}, rec,
                                      {**rec, "il": 1, "status": "differs", "max_abs": 0.5}]})
    assert lines == ["damaged (engine llama.cpp b11434)", "records: 1 match, 1 differs, 1 nonfinite",
                     "record: layer 1 V (kv stream 0): nonfinite",
                     "record: layer 1 K (kv stream 0): differs, max |diff| 0.5"]
