"""What llama.cpp itself gets wrong with a bad file is reported as llama.cpp's failure, with the evidence: a
truncated DSV4 file is refused ('DSV4 compressor state metadata mismatch') but leaves sequence 0 holding
cells, and one cut nearer its end aborts in a GGML_ASSERT instead of being refused. A refusal that leaves
the context clean (a llama file cut short) is not blamed on llama.cpp."""

from __future__ import annotations

from pathlib import Path

from kvharness.fixtures import DATA, MODELS, model_path
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.verify.run import verify

DSV4 = DATA / "gen-b11434" / "deepseek4-f16-fa0-unified0-seq0.seqstate"
DSV4_MODEL = DATA / "gen-models" / "deepseek4.gguf"


def _cut(src: Path, dst: Path, frac: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[:int(len(data) * frac)])
    return dst


def test_a_truncated_dsv4_file_that_leaves_cells_behind_is_llama_cpps_failure(builds: dict[str, InstalledBuild],
                                                                             tmp_path: Path) -> None:
    r = verify(_cut(DSV4, tmp_path / "cut.seqstate", 0.3), DSV4_MODEL)
    assert r.verdict == "damaged" and r.restore is not None and not r.restore.ok
    assert "DSV4 compressor state metadata mismatch" in r.restore.message
    fault = r.restore.engine_fault
    assert fault is not None and "half-restored" in fault and "sequence 0 holds positions" in fault, fault
    assert any(x.startswith("llama.cpp's own failure: ") and "half-restored" in x for x in r.reasons), r.reasons
    assert r.to_json()["restore"]["engine_fault"] == fault


def test_an_assert_on_a_truncated_file_is_llama_cpps_failure(builds: dict[str, InstalledBuild],
                                                             tmp_path: Path) -> None:
    r = verify(_cut(DSV4, tmp_path / "cut.seqstate", 0.9), DSV4_MODEL)
    assert r.verdict == "damaged" and r.restore is not None and r.restore.aborted == "SIGABRT"
    assert r.restore.engine_fault is not None and "GGML_ASSERT" in r.restore.engine_fault
    assert any(x.startswith("llama.cpp's own failure: llama.cpp aborts on this file") for x in r.reasons)


def test_a_clean_refusal_is_not_blamed_on_llama_cpp(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    r = verify(_cut(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", tmp_path / "cut.seqstate", 0.6),
               model_path("llama"))
    assert r.verdict == "damaged" and r.restore is not None and not r.restore.ok and r.restore.aborted is None
    assert r.restore.engine_fault is None
    assert not any("llama.cpp's own failure" in x for x in r.reasons)
