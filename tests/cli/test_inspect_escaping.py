"""``kvscope inspect`` escapes every string that comes from a file or a file name, for its medium: the
terminal's text (control and bidi characters) and Markdown (no raw HTML, entity or autolink; the file
name a literal heading that a newline cannot split)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import MODELS

CLEAN = MODELS / "llama-f16-fa0-unified0-seq0.seqstate"
HOSTILE = "s<img src=x onerror=alert(1)>\u202e\x1b[31m*bold*|[x](y)&amp;"
RAW = ("\u202e", "\x1b")
UNESCAPED = re.compile(r"(?<!\\)[<&]")  # a < or & Markdown would read as HTML or an entity


def _inspect(path: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "inspect", str(path), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def hostile_copy(tmp_path: Path) -> Path:
    path = tmp_path / (HOSTILE + ".seqstate")
    shutil.copyfile(CLEAN, path)
    return path


def test_markdown_title_is_one_literal_heading(hostile_copy: Path) -> None:
    out = _inspect(hostile_copy, "--markdown")
    first = out.splitlines()[0]
    assert first.startswith("# ") and first.endswith("(5,332 bytes)")
    assert not any(raw in out for raw in RAW), out[:300]
    assert not UNESCAPED.search(out), out[:300]
    assert "\\<img" in first and "\\*bold\\*" in first and "\\|" in first and "\\u202e" in first


def test_text_output_shows_controls_as_escapes(hostile_copy: Path) -> None:
    out = _inspect(hostile_copy)
    assert "\u202e" not in out and "\x1b" not in out
    assert out.splitlines()[0].startswith(str(hostile_copy.parent)) and "\\u202e" in out.splitlines()[0]


def test_a_newline_in_the_name_cannot_split_the_heading(tmp_path: Path) -> None:
    path = tmp_path / "two\nlines.seqstate"
    shutil.copyfile(CLEAN, path)
    out = _inspect(path, "--markdown")
    assert out.splitlines()[0].startswith("# ") and "two\\\\nlines" in out.splitlines()[0]  # renders as two\\nlines
    assert sum(1 for line in out.splitlines() if line.startswith("# ")) == 1
