"""What the app says (issue 29, the app's words of item 10): names shown as they are spelt (a build name is
case-sensitive: 0c1e5709, never 0C1E5709), counts with the thousands separators the rest of the app
uses (Tokens (131,072)), kvscope's version in Help → About, "Find these bytes" for a whole row (and why
not for a selection too large), and one line naming the X11 packages when Qt's xcb plugin cannot load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from kvscope.app.base.platform_check import (
    ALL_PACKAGES,
    SONAME_PACKAGES,
    display_problem,
    platform_is_xcb,
    xcb_problem,
)
from kvscope.app.shell.menus import _about
from kvscope.app.views.bytes.hex_actions import FIND_LIMIT
from kvscope.app.views.overview.verify_html import result_html
from kvscope.core.reader.parse import read_state
from tests.app.test_gui_layers_view import write_big
from tests.support.gui_helpers import LAB, STATE

ROOT = Path(__file__).resolve().parent.parent.parent
CLEAN = LAB / "seq0.clean.seqdata.bin"


def test_a_build_name_is_shown_as_it_is_spelt(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    result = {"verdict": "ok", "engine": {"kind": "llama.cpp", "build": "0c1e5709"}, "reasons": ["all match"]}
    assert "OK in llama.cpp 0c1e5709" in result_html(result, False)
    w = open_doc(CLEAN, "llama")
    w.doc.set_verify(result)
    text = w.overview.browser.toPlainText()
    assert "OK in llama.cpp 0c1e5709" in text and "0C1E5709" not in text and "LLAMA.CPP" not in text


def test_counts_in_tab_titles_have_thousands_separators(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(write_big(tmp_path / "big.seqstate", cells=131_072, n_embd=8))
    titles = [w.tabs.tabText(i) for i in range(w.tabs.count())]
    assert "Tokens (131,072)" in titles, titles


def test_about_names_kvscope_s_version(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    box = _about(window)
    qtbot.addWidget(box)
    text = box.text()
    assert text.startswith(f"kvscope {version('kvscope')}\n") and "unknown" not in text, text
    assert "read-only" in text and "Qt " in text


def test_find_these_bytes_takes_a_whole_row(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A row of a record (128 bytes here) was greyed (64 at most); it is found where the file holds it again.
    A selection over :data:`FIND_LIMIT` is greyed with the reason in its tooltip."""
    src = STATE / "llama-f16-fa0-unified0-seq1.seqstate"
    recs = [r for _, r in read_state(str(src)).layer_records() if r.role == "k"]
    data = bytearray(src.read_bytes())
    k0, k1 = recs[0], recs[1]
    row = bytes(data[k0.data_offset:k0.data_offset + k0.row_bytes])
    data[k1.data_offset:k1.data_offset + k1.row_bytes] = row  # K layer 1's first row repeats K layer 0's
    path = tmp_path / "twice.seqstate"
    path.write_bytes(bytes(data))
    w = open_doc(path, "llama")
    w.show_view("hex")
    hv = w.hex
    hv.select_range(k0.data_offset, k0.data_offset + k0.row_bytes)
    find = next(a for a in hv.build_menu().actions() if a.text().startswith("Find these bytes"))
    assert k0.row_bytes > 64 and find.isEnabled()
    find.trigger()
    qtbot.waitUntil(lambda: hv.find_bar.last is not None, timeout=10000)
    assert hv.find_bar.last == (k1.data_offset, k0.row_bytes)
    big = FIND_LIMIT + 1
    hv.select_range(0, big)
    find = next(a for a in hv.build_menu().actions() if a.text().startswith("Find these bytes"))
    assert not find.isEnabled() and f"{FIND_LIMIT:,}" in find.toolTip() and f"{big:,}" in find.toolTip()


# -- Qt's xcb plugin ----------------------------------------------------------------------------------------
def test_the_platform_is_xcb_where_qt_would_choose_it() -> None:
    assert platform_is_xcb({"QT_QPA_PLATFORM": "xcb"}, "linux")
    assert platform_is_xcb({"QT_QPA_PLATFORM": "xcb:foo;wayland"}, "linux")
    assert not platform_is_xcb({"QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert platform_is_xcb({"DISPLAY": ":0"}, "linux")
    assert not platform_is_xcb({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}, "linux")
    assert not platform_is_xcb({"QT_QPA_PLATFORM": "xcb"}, "darwin")


def _loader(missing: set[str]):  # type: ignore[no-untyped-def]
    def load(name: str) -> object:
        base = os.path.basename(name)
        if base == "libqxcb.so" and missing:
            raise OSError(f"{sorted(missing)[0]}: cannot open shared object file: No such file or directory")
        if base in missing:
            raise OSError(f"{base}: cannot open shared object file: No such file or directory")
        return object()

    return load


def test_a_missing_xcb_library_is_one_line_naming_its_package(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plugin = tmp_path / "libqxcb.so"
    assert xcb_problem(plugin, _loader(set())) is None
    line = xcb_problem(plugin, _loader({"libxcb-cursor.so.0", "libxkbcommon-x11.so.0"}))
    assert line is not None and "\n" not in line
    assert "libxcb-cursor.so.0, libxkbcommon-x11.so.0" in line
    assert line.endswith("(Debian/Ubuntu: apt-get install libxcb-cursor0 libxkbcommon-x11-0)")
    # a library outside the list: the whole list of docs/reference.md
    odd = xcb_problem(plugin, lambda n: (_ for _ in ()).throw(OSError("libfoo.so.9: cannot open")) if "qxcb" in n
                      else None)
    assert odd is not None and "libfoo.so.9" in odd and " ".join(ALL_PACKAGES) in odd
    assert set(SONAME_PACKAGES.values()) - {"libxcb-render0", "libxcb1", "libx11-6"} <= set(ALL_PACKAGES)


@pytest.mark.xserver
def test_an_x_display_that_cannot_be_reached_is_one_line(qt_platform: str) -> None:
    assert "DISPLAY is not set" in (display_problem(None) or "")
    line = display_problem(":65000")
    assert line is not None and "cannot connect to the X display ':65000'" in line and "\n" not in line
    if qt_platform == "xcb":  # the tests' own Xvfb is reached
        assert display_problem(os.environ["DISPLAY"]) is None


def test_the_list_of_packages_is_the_one_ci_and_the_docs_install() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    docs = (ROOT / "docs" / "reference.md").read_text()
    for package in ALL_PACKAGES:
        assert package in ci and package in docs, package


def test_kvscope_gui_without_an_xcb_library_says_what_to_install_in_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The process as a user runs it, with libxcb-cursor.so.0 failing to load (made to fail at the ctypes
    loader the check uses, in every Python process of the run through a sitecustomize; Qt itself would
    abort with its several lines and SIGABRT)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""\
        import ctypes, os
        real = ctypes.CDLL
        class CDLL(real):
            def __init__(self, name, *args, **kwargs):
                if name and os.path.basename(str(name)) in ("libqxcb.so", "libxcb-cursor.so.0"):
                    raise OSError("libxcb-cursor.so.0: cannot open shared object file: No such file or directory")
                super().__init__(name, *args, **kwargs)
        ctypes.CDLL = CDLL
        """))
    env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "KVSCOPE_TEST_QT_PLATFORM")}
    env.update(QT_QPA_PLATFORM="xcb", DISPLAY=":65000",  # no such display either: the library is named first
               PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    p = subprocess.run([sys.executable, "-m", "kvscope.app.shell.cli", str(CLEAN)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("kvscope: ") and "apt-get install libxcb-cursor0" in lines[0], lines[0]
    assert "qt.qpa" not in p.stderr and "Aborted" not in p.stderr
