"""Fixtures for the report tests: offscreen Qt, isolated settings, fixture paths, a report built once.
Without Qt (the core suite) only the Qt-free tests (:data:`QT_FREE`) are collected."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.report_paths import MODEL, NAN_FILE  # noqa: E402

# Run everywhere, the core suite without Qt included: they test the report without the gui extra.
QT_FREE = ("test_report_headless.py", "test_report_verify_json.py")

if importlib.util.find_spec("PySide6") is None or importlib.util.find_spec("pytestqt") is None:
    # the core suite runs without Qt: only the Qt-free report tests
    collect_ignore = sorted(p.name for p in Path(__file__).parent.glob("test_*.py") if p.name not in QT_FREE)
else:
    from tests.support.qt_settings import isolated_settings  # noqa: F401  (autouse fixture)

    @pytest.fixture
    def window(qtbot, isolated_settings):  # type: ignore[no-untyped-def]  # noqa: F811
        """A main window with isolated settings, shown offscreen."""
        from kvscope.app.base.application import ensure_app
        from kvscope.app.base.theme import Theme
        from kvscope.app.shell.main_window import MainWindow
        from kvscope.app.shell.settings import AppSettings

        ensure_app()
        win = MainWindow(AppSettings(isolated_settings), Theme("light"))
        qtbot.addWidget(win)
        win.resize(1300, 850)
        win.show()
        yield win
        win.runner.shutdown(5000)

    @pytest.fixture(scope="session")
    def nan_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
        """``kvscope report`` of the NaN fixture with the model (given as absolute paths), built once."""
        from kvscope.core.cli.report_command import main

        out = tmp_path_factory.mktemp("nan") / "report"
        assert main([str(NAN_FILE.resolve()), "--model", str(MODEL.resolve()), "-o", str(out)]) == 1  # errors
        return out
