"""``kvscope report`` without the gui extra: report.md and report.json, one line saying what the pictures need.

Qt-free (tests/report/conftest.py collects this file in the core suite too). The subprocess test hides
PySide6, shiboken6 and pyqtgraph even where they are installed: a folder first on PYTHONPATH holds
packages of those names whose import fails as a missing package's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.cli import report_command
from kvscope.core.model.profile import load_model_profile
from kvscope.core.report.build import build_report
from kvscope.core.report.model import GENERATOR, ReportOptions
from tests.support.report_paths import EXAMPLES

STATE = EXAMPLES / "llama-slot.seqstate"  # healthy: exit 0
GGUF = EXAMPLES / "tiny-llama.gguf"
QT = ("PySide6", "shiboken6", "pyqtgraph")
NAMED = {"file", "model"}  # the report names these by base name


def _hide_qt(folder: Path) -> dict[str, str]:
    """An environment whose Python cannot import PySide6, shiboken6 or pyqtgraph (as if not installed)."""
    for name in QT:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {name!r}'!r}, name={name!r})\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QT_QPA_PLATFORM")}
    env["PYTHONPATH"] = str(folder)
    return env


def _kvscope(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``kvscope ARGS`` in a child; its stdout ends with the Qt modules it had loaded (a JSON list)."""
    code = ("import json, sys\nfrom kvscope.core.cli.main import main\nrc = main(sys.argv[1:])\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {QT!r})))\nsys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=240, check=False)


def test_report_without_the_gui_extra_writes_markdown_and_json(tmp_path: Path) -> None:
    env = _hide_qt(tmp_path / "no-qt")
    probe = subprocess.run([sys.executable, "-c", "import PySide6"], capture_output=True, text=True, env=env,
                           check=False)
    assert probe.returncode == 1 and "No module named 'PySide6'" in probe.stderr  # the hiding works
    out = tmp_path / "report"
    r = _kvscope(["report", str(STATE), "--model", str(GGUF), "-o", str(out)], env)
    assert r.returncode == 0, r.stderr
    *lines, loaded = r.stdout.splitlines()
    assert json.loads(loaded) == []  # no Qt module got loaded
    assert lines == [f"kvscope report: {out}: healthy; 0 findings (0 errors, 0 warnings, 0 info)"]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kvscope: note: "), r.stderr  # one line
    assert "the pictures and report.html need the gui extra (pip install 'kvscope[gui]')" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["report"]["generator"] == GENERATOR and report["report"]["images"] == []
    inspect = json.loads(json.dumps(inspect_file(STATE, load_model_profile(str(GGUF)), stats=True).to_json()))
    same = {k for k in inspect if k not in NAMED}
    assert {k: report[k] for k in same} == {k: inspect[k] for k in same}
    md = (out / "report.md").read_text(encoding="utf-8")
    assert md.startswith(f"# kvscope report: {STATE.name}\n") and "**HEALTHY**" in md
    assert "This report has no pictures" in md and "![" not in md

    r = _kvscope(["report", "--help"], env)  # the command is the core's: there without Qt
    assert r.returncode == 0 and "report.md and report.json" in " ".join(r.stdout.split())


def test_a_headless_report_replaces_an_earlier_full_one(tmp_path: Path) -> None:
    """An earlier report's pictures and report.html go (they would describe another state); other files stay."""
    dest = tmp_path / "report"
    dest.mkdir()
    earlier = {"report": {"generator": GENERATOR, "images": [{"file": "bytemap.png"}, {"file": "cells-1.png"}]}}
    (dest / "report.json").write_text(json.dumps(earlier), encoding="utf-8")
    for name in ("report.md", "report.html", "bytemap.png", "cells-1.png", "notes.txt"):
        (dest / name).write_text("earlier", encoding="utf-8")
    data, folder = build_report(ReportOptions(str(STATE), str(GGUF)), dest)  # no draw: Markdown and JSON only
    assert folder == dest and data.overview.verdict.state == "healthy"
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt", "report.json", "report.md"]
    assert (dest / "notes.txt").read_text(encoding="utf-8") == "earlier"


def test_only_a_missing_gui_layer_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """No PySide6 / pyqtgraph / Qt libraries / app layer: the report goes on without pictures; an ImportError of
    another kvscope module is a bug and is raised."""
    import importlib

    def failing(name: str) -> Callable[[str], object]:
        def import_module(_module: str) -> object:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return import_module

    for missing in ("PySide6", "pyqtgraph", "kvscope.app", "kvscope.app.report"):
        monkeypatch.setattr(importlib, "import_module", failing(missing))
        assert report_command.load_pictures() == (None, f"No module named {missing!r}")
    monkeypatch.setattr(importlib, "import_module", failing("kvscope.core.nonesuch"))
    with pytest.raises(ModuleNotFoundError):
        report_command.load_pictures()
    monkeypatch.setattr(importlib, "import_module", failing("kvscope.app.report.build"))  # a prefix, not a parent
    with pytest.raises(ModuleNotFoundError):
        report_command.load_pictures()


def test_collect_goes_through_the_inspection_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """#30 item 1: the report's inspection is inspect_file's (statistics and compatibility in), not one rebuilt
    by hand; the compared file is the pipeline's parse too."""
    from kvscope.core.analysis import inspection
    from kvscope.core.report import collect

    calls: list[tuple[str, dict[str, object]]] = []
    real = inspection.inspect_file

    def spy(path: str, profile: object = None, **kw: object) -> inspection.Inspection:
        calls.append((path, kw))
        return real(path, profile, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(inspection, "inspect_file", spy)
    other = str(EXAMPLES / "llama-dropped-layer.seqdata.bin")
    data = collect.collect(ReportOptions(str(STATE), str(GGUF), compare=other))
    assert calls == [(str(STATE), {"stats": True, "compat": True, "keep_stats_error": True}),
                     (other, {"stats": False, "compat": False, "keep_stats_error": True})]
    assert data.stats is not None and data.stats_error is None and data.diff is not None
    assert {"stats", "compatibility", "verdict"} <= set(data.inspect)
    assert not hasattr(collect, "inspect_object") and not hasattr(collect, "read")  # the bypass is gone


def test_a_failed_scan_leaves_a_report_without_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline raises a failed scan by default; the report keeps it (keep_stats_error) and says why."""
    from kvscope.core.analysis import stats

    def broken(*_a: object, **_k: object) -> object:
        raise RuntimeError("scan broke\nsecond line")

    monkeypatch.setattr(stats, "scan_stats", broken)
    with pytest.raises(RuntimeError, match="scan broke"):
        inspect_file(STATE, stats=True)
    found = inspect_file(STATE, stats=True, keep_stats_error=True)
    assert found.stats is None and found.stats_error == "scan broke" and found.compatibility
    data, dest = build_report(ReportOptions(str(STATE), str(GGUF)), tmp_path / "r")
    assert data.stats is None and data.stats_error == "scan broke"
    report = json.loads((dest / "report.json").read_text(encoding="utf-8"))
    assert report["report"]["stats_error"] == "scan broke" and "stats" not in report and report["compatibility"]
    assert "statistics | failed: scan broke" in (dest / "report.md").read_text(encoding="utf-8")
