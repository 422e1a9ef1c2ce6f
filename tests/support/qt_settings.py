"""The isolated-settings fixture shared by the Qt test folders (imported by their conftest files).

Importing this module needs PySide6: the conftest files import it only when Qt is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from kvscope.app.base.compat import immortalize_singletons

immortalize_singletons()  # PySide6 6.12.0 on CPython 3.11 loses references to None/True/False


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path: Path) -> QSettings:
    """Any default-constructed QSettings lands under tmp_path, never in the user's config."""
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    for scope in (QSettings.Scope.UserScope, QSettings.Scope.SystemScope):
        QSettings.setPath(QSettings.Format.IniFormat, scope, str(tmp_path / "qsettings"))
    return QSettings(str(tmp_path / "kvscope.ini"), QSettings.Format.IniFormat)
