"""The report's cell maps: a per-sequence file's recurrent state is drawn as the file's sequence, not as empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.app.report.images import cell_maps
from kvscope.core.report.collect import collect
from kvscope.core.report.model import ReportOptions

DATA = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"
MAMBA = DATA.parent / "lab" / "llamacpp-2026-10-01" / "mamba" / "seq0.clean.seqstate"


@pytest.mark.parametrize("path,model,label", [
    (DATA / "lfm2-f16-fa0-unified0-seq1.seqdata.bin", DATA / "tiny-lfm2.gguf", "1"),
    (MAMBA, DATA / "tiny-mamba.gguf", "seq 0 (assumed)"),
])
def test_per_sequence_recurrent_cell_is_the_files_sequence(qapp, path: Path, model: Path, label: str) -> None:
    data = collect(ReportOptions(str(path), str(model)))
    images = {img.title: img for img in cell_maps(data)}
    rec = images["Cell map: recurrent"]
    named = label if not label.isdigit() else f"seq {label}"
    assert f"sequence: {label})" in rec.caption and f"the state of {named}" in rec.caption
    assert "its 1 cell holds" in rec.caption
    assert "empty" not in rec.caption and rec.png[:4] == b"\x89PNG"
    whole = collect(ReportOptions(str(DATA / "lfm2-f16-fa0-unified0-ctx.session"), str(DATA / "tiny-lfm2.gguf")))
    assert all("per-sequence" not in img.caption for img in cell_maps(whole))
