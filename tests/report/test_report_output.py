"""Report output: a self-contained HTML page, atomic replacement, and the app's export = the CLI's report."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvscope.app.report import builder
from kvscope.app.report.builder import build_report
from kvscope.core.cli.report_command import main
from kvscope.core.report.collect import collect
from kvscope.core.report.model import MAX_HEATMAPS, ReportError, ReportOptions
from tests.support.report_paths import MODEL, NAN_FILE


class _Refs(HTMLParser):
    """Every src/href/srcset/action attribute and every tag of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "srcset", "action", "data", "poster")]


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_html_is_self_contained(nan_report: Path) -> None:
    page = (nan_report / "report.html").read_text(encoding="utf-8")
    parser = _Refs()
    parser.feed(page)
    external = [r for r in parser.refs if not (r.startswith("data:") or r.startswith("#"))]
    assert external == []
    assert not parser.tags & {"script", "link", "iframe", "object", "embed"}
    assert not re.search(r"url\(\s*['\"]?(?!data:)", page) and "@import" not in page
    pngs = [p for p in nan_report.iterdir() if p.suffix == ".png"]
    assert len([r for r in parser.refs if r.startswith("data:image/png;base64,")]) == len(pngs)
    for anchor in (r[1:] for r in parser.refs if r.startswith("#")):
        assert f'id="{anchor}"' in page


def test_replace_keeps_the_old_report_until_the_new_one_is_complete(tmp_path: Path, nan_report: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "report"
    shutil.copytree(nan_report, dest)
    (dest / "stale.png").write_bytes(b"old")  # an earlier report's picture the new one does not have
    doc = json.loads((dest / "report.json").read_text(encoding="utf-8"))
    doc["report"]["images"].append({"file": "stale.png"})  # (its report.json lists it: the report's own file)
    (dest / "report.json").write_text(json.dumps(doc), encoding="utf-8")
    before = _hashes(dest)

    def broken(*_args: object) -> str:
        raise RuntimeError("disk on fire")  # the last file of the report: everything else is written by then

    monkeypatch.setattr(builder, "render_html", broken)
    options = ReportOptions(str(NAN_FILE), str(MODEL))
    with pytest.raises(RuntimeError, match="disk on fire"):
        build_report(options, dest)
    assert _hashes(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary folder left behind

    monkeypatch.undo()
    build_report(options, dest)
    after = _hashes(dest)
    assert "stale.png" not in after and "report.html" in after
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_only_reports_and_empty_folders_are_replaced(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    _, path = build_report(ReportOptions(str(NAN_FILE)), empty)
    assert (path / "report.html").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.json").write_text('{"kind": "seq_blob"}')  # an inspect --json, not a report
    with pytest.raises(ReportError, match="not a kvscope report"):
        build_report(ReportOptions(str(NAN_FILE)), other)


def test_heatmaps_picture_flagged_layers_or_the_first_k() -> None:
    data = collect(ReportOptions(str(NAN_FILE), str(MODEL)))
    assert data.flagged_total == 7 and len(data.flagged) == MAX_HEATMAPS
    assert {f.record.role for f in data.flagged} == {"k", "v"}
    clean = collect(ReportOptions(str(NAN_FILE.parent / "seq0.clean.seqdata.bin"), str(MODEL)))
    assert clean.flagged_total == 0 and [(f.record.role, f.record.il) for f in clean.flagged] == [("k", 0)]


def test_export_from_the_app_is_the_same_report(qtbot, window, nan_report: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = window.open_file(str(NAN_FILE.resolve()), model=str(MODEL.resolve()))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.stats is not None and not w.doc.busy, timeout=20000)
    assert window.actions_["export_report"].isEnabled()
    dest = tmp_path / "exported"
    exporter = window.exporter
    with qtbot.waitSignal(exporter.finished, timeout=30000) as blocker:
        window.export_report(str(dest))
    assert blocker.args[0].startswith(f"kvscope report: {dest}: damaged; 8 findings (8 errors")
    assert _hashes(dest) == _hashes(nan_report)  # JSON, Markdown, HTML and every PNG, byte for byte


def test_export_refuses_a_folder_that_is_not_a_report(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = window.open_file(str(NAN_FILE))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.stats is not None and not w.doc.busy, timeout=20000)
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    with qtbot.waitSignal(window.exporter.failed, timeout=5000):
        window.export_report(str(dest))
    assert "not a kvscope report" in window.last_message
    assert sorted(p.name for p in dest.iterdir()) == ["keep.txt"]


def test_cli_and_builder_agree(tmp_path: Path, nan_report: Path) -> None:
    assert main([str(NAN_FILE.resolve()), "--model", str(MODEL.resolve()), "-o", str(tmp_path / "again")]) == 1
    assert _hashes(tmp_path / "again") == _hashes(nan_report)  # deterministic: no dates, no random names


def test_export_dialog_offers_the_scenario_and_the_diff(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from kvscope.app.report.export import ExportDialog
    from kvscope.core.report.lab import memory_core_available

    w = window.open_file(str(NAN_FILE), model=str(MODEL))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.stats is not None and not w.doc.busy, timeout=20000)
    other = NAN_FILE.parent / "seq0.clean.seqdata.bin"
    with qtbot.waitSignal(w.doc.diffReady, timeout=15000):
        window.compare_with(str(other))
    dlg = ExportDialog(w.doc, str(tmp_path))
    qtbot.addWidget(dlg)
    assert dlg.folder.text() == str(tmp_path / "nan_rows_late_fail-report")
    assert dlg.context.text() == str(NAN_FILE.parent)  # the lab scenario folder the file sits in
    assert dlg.diff_check.isChecked() and dlg.lab_check.isEnabled() == memory_core_available()
    dlg.lab_check.setChecked(dlg.lab_check.isEnabled())
    opts = dlg.options()
    assert (opts.file, opts.model, opts.compare) == (w.doc.path, str(MODEL), str(other.resolve()))
    assert opts.lab == memory_core_available() and opts.lab_context == str(NAN_FILE.parent)
