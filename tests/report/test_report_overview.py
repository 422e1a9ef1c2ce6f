"""The report starts with the overview, names files by base name, and draws its pictures for the page."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvscope.app.report import figures
from kvscope.core.cli.report_command import main
from kvscope.core.reader.layouts import GENERATIONS
from kvscope.core.textsafe import markdown_text
from tests.support.report_paths import LAB, MODEL, NAN_FILE

TRUNCATED = LAB / "truncated_half.seqdata.bin"  # 3,688 of 7,376 bytes


def _texts(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir() if p.suffix in (".html", ".md", ".json")}


def test_reports_name_files_by_base_name(nan_report: Path) -> None:
    folders = {str(NAN_FILE.resolve().parent), str(MODEL.resolve().parent), str(Path.cwd())}
    for name, text in _texts(nan_report).items():
        for folder in folders:
            assert folder not in text, (name, folder)
    meta = json.loads((nan_report / "report.json").read_text(encoding="utf-8"))
    sha = hashlib.sha256(NAN_FILE.read_bytes()).hexdigest()
    assert meta["overview"]["file"] == NAN_FILE.name and meta["overview"]["sha256"] == sha
    assert "path" not in meta["overview"]
    md = (nan_report / "report.md").read_text(encoding="utf-8")
    assert f"| file | {markdown_text(NAN_FILE.name)} ({NAN_FILE.stat().st_size:,} bytes, sha256 {sha}) |" in md
    assert all(NAN_FILE.name not in im["title"] or "/" not in im["title"] for im in meta["report"]["images"])


def test_full_paths_keeps_the_paths(tmp_path: Path) -> None:
    assert main([str(NAN_FILE.resolve()), "--model", str(MODEL.resolve()), "--full-paths",
                 "-o", str(tmp_path / "r")]) == 1
    texts = _texts(tmp_path / "r")

    def shown(path: Path, name: str) -> str:  # Markdown writes a path escaped (nan\\_rows)
        return markdown_text(str(path.resolve())) if name.endswith(".md") else str(path.resolve())

    assert all(shown(NAN_FILE, name) in t for name, t in texts.items())
    assert shown(MODEL, "report.md") in texts["report.md"]


def test_the_overview_heads_every_format(tmp_path: Path) -> None:
    assert main([str(TRUNCATED), "--model", str(MODEL), "-o", str(tmp_path / "r")]) == 1
    folder = tmp_path / "r"
    md = (folder / "report.md").read_text(encoding="utf-8").splitlines()
    assert md[0] == f"# kvscope report: {markdown_text(TRUNCATED.name)}"  # truncated\\_half: escaped for Markdown
    assert md[2].startswith("**DAMAGED**: the file ends early, at least 3,688 bytes missing")
    assert any(line.startswith("- missing bytes past the end: ") for line in md[:10])
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert html.index('class="verdict v-damaged"') < html.index('id="overview"') < html.index('id="findings"')
    # per pinned build and consumer (predicted), then the layouts no pinned build writes: one line each
    consumers = [line for line in md if line.startswith(("- 0c1e5709 ", "- b11434 "))]
    others = [line for line in md if line.startswith("- 20")]
    assert len(consumers) == 4 and all(line.endswith("(predicted)") for line in consumers)
    assert len(others) == len(GENERATIONS) - 2 and "**No llama.cpp build loads it as it is.**" in md
    ov = json.loads((folder / "report.json").read_text(encoding="utf-8"))["overview"]
    assert ov["verdict"]["level"] == "damaged" and ov["verdict"]["missing"]["expected_end"] == 7376
    assert len(ov["compatibility"]) == len(GENERATIONS) and ov["verify"] is None


def test_pictures_are_drawn_for_the_page(tmp_path: Path) -> None:
    from PySide6.QtGui import QColor, QImage

    from kvscope.app.base.theme import WARNING_COLOR

    assert main([str(TRUNCATED), "--model", str(MODEL), "-o", str(tmp_path / "r")]) == 1
    meta = json.loads((tmp_path / "r" / "report.json").read_text(encoding="utf-8"))["report"]
    for im in meta["images"]:
        img = QImage(str(tmp_path / "r" / im["file"]))
        assert img.width() == figures.WIDTH == im["width"], im["file"]
        title = [img.pixelColor(x, y).lightness() for x in range(16, 300) for y in range(16, 34)]
        assert min(title) < 80, im["file"]  # a dark title at the top left
    bm = QImage(str(tmp_path / "r" / "bytemap.png"))
    warn = QColor(WARNING_COLOR)

    def hatched(x0: int, x1: int) -> int:  # warning-coloured pixels of the whole-file bar between x0 and x1
        return sum(1 for x in range(x0, x1) for y in range(70, 110)
                   if abs(bm.pixelColor(x, y).red() - warn.red()) < 30
                   and abs(bm.pixelColor(x, y).green() - warn.green()) < 40)

    left, right = figures.MARGIN + 8, figures.WIDTH - figures.MARGIN - 8
    end = left + (right - left) * 3688 // 7376  # the file ends half way: the rest is the missing half
    assert hatched(end + 8, right - 2) > 200
    assert hatched(left + 2, end - 8) == 0


def test_nice_ticks() -> None:
    assert figures.nice_ticks(0, 10, 5) == [0, 2, 4, 6, 8, 10]
    assert figures.nice_ticks(-0.5, 3.5, 8, integer=True) == [0, 1, 2, 3]
    assert all(float(t).is_integer() for t in figures.nice_ticks(0, 3, 10, integer=True))
    assert figures.byte_unit(3688) == ("bytes", 1.0) and figures.byte_unit(2 << 30)[0] == "MiB"
