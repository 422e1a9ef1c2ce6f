"""The report of a damaged file pictures the damaged layer (#29 item 7): a llama-server slot cut inside its V
record of layer 1 (no NaN, no zero row anywhere) showed a heatmap of K layer 0, "for reference", as if
nothing were wrong; now its heatmap is layer 1's record the file holds (its K record), and the caption says
which layer is damaged and why. A file whose end cuts its K record of layer 1 (nothing of layer 1 left)
pictures the nearest record and says so."""

from __future__ import annotations

from pathlib import Path

from kvscope.core.cli.report_command import main
from tests.support.slot_damage import LLAMA, SLOT


def _report(tmp_path: Path, cut: int) -> str:
    path = tmp_path / "cut.bin"
    path.write_bytes(SLOT.read_bytes()[:cut])
    assert main([str(path), "--model", str(LLAMA), "-o", str(tmp_path / "r")]) == 1
    assert any(p.name.startswith("heatmap-") for p in (tmp_path / "r").rglob("*.png"))
    return (tmp_path / "r" / "report.md").read_text(encoding="utf-8")


def test_a_truncated_files_report_pictures_its_damaged_layer(tmp_path: Path) -> None:
    md = _report(tmp_path, len(SLOT.read_bytes()) - 3)  # the file ends inside V layer 1
    heat = md.split("## Layer heatmaps")[1]
    assert "K layer 1" in heat and "K layer 0" not in heat, heat[:600]
    assert "The damaged layer 1: file ends inside the V layer 1 payload" in heat
    assert "for reference" not in heat


def test_nothing_of_the_damaged_layer_left_pictures_the_nearest_and_says_so(tmp_path: Path) -> None:
    md = _report(tmp_path, len(SLOT.read_bytes()) // 2)  # the file ends inside K layer 1
    heat = md.split("## Layer heatmaps")[1]
    assert "The damaged layer 1: file ends inside the K layer 1 payload" in heat
    assert "layer 1 has no record in the file: the nearest, K layer 0, is shown" in heat
