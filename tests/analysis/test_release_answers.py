"""Which releases write a file, which load it, and what one release does with it (issue #27, the user's release)."""

from __future__ import annotations

import json

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.overview import build_overview
from kvscope.core.analysis.release_answers import target_answer
from kvscope.core.cli.main import main
from kvscope.core.reader.releases import parse_release

V4_SEQ = DATA / "gen-b11434/llama-f16-fa0-unified0-seq0.seqstate"


def spans(rs: list[dict[str, object]]) -> list[tuple[object, object]]:
    return [(r["first"], r["last"]) for r in rs]


@pytest.mark.parametrize(("path", "written", "loads"), [
    # 2025-05 (llama-cpp-python 0.3.9): per-seq files are A only; a plain context state is A and B
    ("llamacpp-2025-05-08/llama-f16-fa0-seq0.seqstate", [("…", "8733e0cf")], [("…", "8733e0cf")]),
    ("llamacpp-2025-05-08/llama-f16-fa0-ctx.session", [("…", "79e0b68c")], [("…", "79e0b68c")]),
    # 2025-08 (0.3.16): context state with outputs, C to E
    ("llamacpp-2025-08-14/llama-f16-fa0-unified0-ctx.session", [("PR #14363 (n_stream)", "late Feb 2026")],
     [("PR #14363 (n_stream)", "late Feb 2026")]),
    # 2026-04 (0.3.21): a headerless blob, byte-identical under 2025-08: C to H; b9093 on reads a header
    ("llamacpp-2026-04-26/llama-f16-fa0-unified0-seq0.seqdata.bin", [("PR #14363 (n_stream)", "63d93d17")],
     [("PR #14363 (n_stream)", "63d93d17")]),
    # 2026-08 (0.3.35): a blob with the header and nothing to mask: b9093 to b11401 (2026-10 bytes alike)
    ("llamacpp-2026-08-16/llama-f16-fa0-unified0-seq0.seqdata.bin", [("b9093", "b11401")], [("b9093", "b11401")]),
    # 2026-10 (0c1e5709): a v3 seq file
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate", [("b10644", "b11401")], [("b10644", "b11401")]),
    # 2026-10-v4 (b11434)
    ("gen-b11434/llama-f16-fa0-unified0-seq0.seqstate", [("b11434", "b11434")], [("b11434", "b11434")]),
])
def test_written_by_and_loads_in_on_real_files(path: str, written: list[tuple[str, str]],
                                               loads: list[tuple[str, str]]) -> None:
    rel = inspect_file(DATA / path).releases()
    assert spans(rel["written_by"]) == written
    assert spans(rel["loads_in"]) == loads
    assert all(set(r) >= {"first", "last", "first_date", "last_date", "epochs", "verified"} for r in rel["written_by"])


def test_swa_blob_of_epoch_i_is_unknown() -> None:
    """Epoch I writes the header but no SWA masking: kvscope has no generation for an SWA model's per-seq blob."""
    found = inspect_file(DATA / "llamacpp-2026-08-16/gemma2-f16-fa0-unified0-swafull1-seq0.seqdata.bin")
    rel = found.releases()
    assert spans(rel["written_by"]) == [("b9479", "b11401")]
    assert ("b9093", "b9464") in spans(rel["unknown_in"])


def _target(found: object, name: str) -> dict[str, object]:
    return target_answer(found.result, None, found.compatibility or [], parse_release(name), "f")  # type: ignore[attr-defined]


def test_target_answers_for_a_b11434_file() -> None:
    found = inspect_file(V4_SEQ)
    refusal = "state_seq_load_file: unknown (magic, version) for sequence state file: 67677371, 00000004"
    for name, gen in (("b9300", "2026-04"), ("b10700", "2026-10"), ("b11300", "2026-10")):
        t = _target(found, name)
        assert (t["answer"], t["message"], t["generation"]) == ("refuses", refusal, gen), name
        assert t["exact_message"] and t["after_refusal"] == "nothing changed (refused at the header)"
    assert _target(found, "b10700")["migrate"] == "kvscope rewrite f -o OUT --layout 2026-10"
    assert _target(found, "b9300")["migrate"] is None  # not exact: compat says the memory core decides
    t = _target(found, "b11434")
    assert (t["answer"], t["migrate"], t["epochs"]) == ("loads", None, ["L"])
    t = _target(found, "0.3.14")
    assert t["answer"] == "unknown" and "epoch B" in str(t["message"])
    t = _target(found, "b12000")
    assert t["answer"] == "unknown" and "newer than this kvscope knows" in str(t["message"])


def test_containment_changes_what_a_memory_refusal_leaves() -> None:
    """A v3 file read by b11434 is refused inside the memory state (the rotation fields): contained."""
    found = inspect_file(DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqdata.bin")
    t = _target(found, "b11434")
    assert t["answer"] == "refuses" and "failure containment" in str(t["after_refusal"])
    assert any("containment" in str(v) for v in t["validation"])  # type: ignore[union-attr]


def test_json_text_overview_and_report_carry_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(V4_SEQ), "--no-stats", "--json", "--target", "b10700"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["releases"]) >= {"written_by", "loads_in"}
    assert doc["releases"]["written_by"][0]["first"] == "b11434"
    assert set(doc["target"]) >= {"release", "answer", "message", "migrate"}
    assert doc["target"]["release"] == "b10700" and doc["target"]["answer"] == "refuses"
    assert doc["target"]["migrate"].endswith("--layout 2026-10")
    assert main(["inspect", str(V4_SEQ), "--no-stats", "--target", "b11434"]) == 0
    out = capsys.readouterr().out
    assert "releases: written by b11434 (2026-10-06); loads in b11434 (2026-10-06)" in out
    assert "target b11434 (epoch L, layout 2026-10-v4): loads" in out
    found = inspect_file(V4_SEQ)
    ov = build_overview(found.result, None, found.compatibility)
    assert ("releases", ov.releases_line()) in ov.rows() and ov.releases_line().startswith("written by b11434")
    assert ov.to_json()["releases"]["written_by"][0]["last"] == "b11434"


def test_report_has_the_line(tmp_path: object) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "rep"
    assert main(["report", str(V4_SEQ), "-o", str(out)]) in (0, 1)
    md = next(out.rglob("report.md")).read_text(encoding="utf-8")
    assert "written by b11434 (2026-10-06)" in md
    js = json.loads(next(out.rglob("report.json")).read_text(encoding="utf-8"))
    assert js["releases"]["written_by"][0]["first"] == "b11434"
