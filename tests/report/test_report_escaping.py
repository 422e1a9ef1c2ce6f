"""Strings from a file or a file name are escaped for each report medium (#20 item 13).

A file name with a newline, ESC, U+202E (which reverses what follows on screen) and HTML markup;
token-like text with ``<script>``. Markdown: the H1 stays one line, no raw HTML, no bidi control;
HTML: markup as entities and no ESC / U+202E in ``<title>``, ``<h1>`` or anywhere; JSON: parseable,
the name as written; the PNG titles are drawn from the escaped name.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from kvscope.core.cli.report_command import main
from kvscope.core.textsafe import html_block, html_text, markdown_line, markdown_text
from tests.support.report_paths import MODEL, NAN_FILE

EVIL = "evil\u202e<img src=x onerror=alert(1)>\x1b[31m\n# H1 *x* [l](j) |c|.bin"
CONTROLS = ("\u202e", "\x1b", "\u2066", "\u200f")


def _report(tmp_path: Path) -> Path:
    src = tmp_path / EVIL
    shutil.copy(NAN_FILE, src)
    out = tmp_path / "r"
    assert main([str(src), "--model", str(MODEL), "-o", str(out)]) == 1
    return out


def test_markdown_html_and_json_reports_escape_the_file_name(tmp_path: Path) -> None:
    out = _report(tmp_path)
    md = (out / "report.md").read_text(encoding="utf-8")
    first = md.splitlines()[0]
    assert first.startswith("# kvscope report: evil") and "H1" in first  # the newline did not split the heading
    assert not any(line.startswith("# H1") for line in md.splitlines())
    assert not re.search(r"(?<!\\)<(img|script)", md) and not any(c in md for c in CONTROLS)  # no raw HTML
    assert "\\<img src=x onerror=alert(1)\\>" in first and "\\\\u202e" in first
    html = (out / "report.html").read_text(encoding="utf-8")
    assert not any(c in html for c in CONTROLS)
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    title = html.split("<title>", 1)[1].split("</title>", 1)[0]
    assert "\\u202e" in title and "\\x1b" in title and "\\n" in title
    doc = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert doc["file"] == EVIL  # JSON keeps the name as written, \\u-escaped on disk
    assert "\u202e" not in (out / "report.json").read_text(encoding="utf-8")


def test_escapers() -> None:
    token = "<script>alert(1)</script> & \u202e"
    assert markdown_text(token) == "\\<script\\>alert(1)\\</script\\> \\& \\\\u202e"
    assert markdown_text("a\nb|c") == "a\\\\nb\\|c"
    assert markdown_line("| s0 | <b> |") == "| s0 | \\<b\\> |"
    assert html_text(token) == "&lt;script&gt;alert(1)&lt;/script&gt; &amp; \\u202e"
    assert html_block("a\n<\u202e>") == "a\n&lt;\\u202e&gt;"
    assert markdown_text("plain name.bin") == "plain name.bin"
