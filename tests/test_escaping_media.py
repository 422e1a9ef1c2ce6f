"""One escaping rule per medium (``core/textsafe.py``), used by every writer: ``kvscope lab``'s Markdown and its
stderr with ESC, RLO and ``|`` in the context's folder name, the restored file's name and a case's label;
``inspect --markdown`` with a Markdown image and link in the token text (not live, as report.md shows it)."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path
from kvscope.core.cli.main import main
from kvscope.core.textsafe import markdown_code, markdown_fence, markdown_text, safe_text

FA0 = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"
HOSTILE = "ctx\x1b[31m\u202e|evil|"
RAW = ("\x1b", "\u202e")
SESSION = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified1-frag-ctx.session"
TINY_LLAMA = DATA / "llamacpp-2026-10-01/tiny-llama.gguf"
LIVE_LINK = re.compile(r"(?<!\\)!?(?<!\\)\[[^\]]*(?<!\\)\]\(")  # ![x]( or [l]( not escaped


def _cells(row: str) -> list[str]:
    """The cells of a GFM table row: split at every ``|`` not escaped by a backslash."""
    return re.split(r"(?<!\\)\|", row.strip().strip("|"))


@pytest.fixture
def hostile_scenario(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / HOSTILE
    shutil.copytree(FA0, folder)
    restore = tmp_path / ("seq0\x1b[2J\u202e|x|.bin")
    shutil.copyfile(FA0 / "seq0.clean.seqdata.bin", restore)
    return folder, restore


def test_lab_markdown_escapes_the_context_and_restore_names(hostile_scenario: tuple[Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder, restore = hostile_scenario
    code = main(["lab", "--context", str(folder), "--restore", str(restore), "--model", str(model_path("llama")),
                 "--corrupt", "truncated_half", "--as-is", "--policy", "contained"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not any(c in out for c in RAW), out[:400]
    heading = out.splitlines()[0]
    assert heading == "### kvscope lab: " + markdown_text(folder.name)
    assert "ctx\\\\x1b[31m\\\\u202e\\|evil\\|" in heading  # renders as ctx\x1b[31m\u202e|evil|
    restore_line = next(line for line in out.splitlines() if line.startswith("Model "))
    assert markdown_text(restore.name) in restore_line and restore.name not in restore_line
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert len({len(_cells(r)) for r in rows}) == 1, rows  # no name splits a row into more cells


def test_lab_markdown_escapes_a_case_label(capsys: pytest.CaptureFixture[str]) -> None:
    """A case label (a spec as given) with ``|``, ESC and RLO: one cell, shown as written, never raw."""
    from kvscope.core.lab.report import render_markdown
    from kvscope.core.lab.runner import LabRunner, parse_case
    from kvscope.core.lab.scenario import load_scenario

    scenario = load_scenario(FA0, model=model_path("llama"))
    runner = LabRunner(scenario, [parse_case("truncated_half")], ("contained",), ("buffer",))
    run = runner.run()
    label = "truncated_half|x\x1b[1m\u202e"
    run.cases = [(label, d) for _, d in run.cases]
    for r in run.results:
        r.corruption = label
        r.error = "boom | \x1b[31m\u202e [l](http://a)"
    run.skipped = [("![x](http://a)|", "a | why\x1b")]
    md = render_markdown(run)
    assert not any(c in md for c in RAW)
    row = next(line for line in md.splitlines() if line.startswith("| truncated"))
    assert len(_cells(row)) == 2, row
    assert not LIVE_LINK.search(md), md
    assert "truncated_half\\|x\\\\x1b[1m\\\\u202e" in row


def test_lab_stderr_line_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every line ``kvscope lab`` writes on stderr: a context name with ESC/RLO/newline shows escaped."""
    missing = tmp_path / "no\x1b[2Jsuch\u202e\nctx"
    assert main(["lab", "--context", str(missing), "--model", str(model_path("llama"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvscope: ")
    assert not any(c in err for c in RAW) and "\\x1b[2J" in err and "\\u202e\\nctx" in err


def _session_with_text(tmp_path: Path, text: str) -> Path:
    """The real session fixture with its first tokens replaced by the byte tokens of ``text`` (tiny-llama's
    vocabulary: id = 3 + byte); the count and every other byte unchanged."""
    data = bytearray(SESSION.read_bytes())
    (n,) = struct.unpack_from("<I", data, 8)
    assert len(text) <= n - 1
    for i, b in enumerate(text.encode("ascii")):
        struct.pack_into("<i", data, 12 + 4 * (1 + i), 3 + b)  # after BOS
    out = tmp_path / "links.session"
    out.write_bytes(bytes(data))
    return out


def test_inspect_markdown_token_text_is_not_live(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _session_with_text(tmp_path, "![x](http://a)[l](u)")
    main(["inspect", str(path), "--markdown", "--model", str(TINY_LLAMA)])
    out = capsys.readouterr().out
    text = next(line for line in out.splitlines() if line.startswith("text:"))
    assert "x" in text and "http" in text
    assert not LIVE_LINK.search(out), text
    assert "![x\\](http:/\\/a)[l\\](u)" in text
    assert "http://" not in out  # no GFM autolink either


def test_inspect_markdown_and_report_md_escape_a_value_the_same_way(tmp_path: Path) -> None:
    """report.md's rule is the core's: the token text shows the same in both."""
    pytest.importorskip("PySide6")
    path = _session_with_text(tmp_path, "![x](http://a)[l](u)")
    out_dir = tmp_path / "rep"
    code = main(["report", str(path), "--model", str(TINY_LLAMA), "-o", str(out_dir)])
    assert code in (0, 1)
    md = (out_dir / "report.md").read_text()
    shown = [line for line in md.splitlines() if "http" in line]
    assert shown, md[:2000]  # the token text is in it, in the overview and in the details
    for line in shown:
        assert not LIVE_LINK.search(line) and "http://" not in line, line
        assert "![x\\](http:/\\/a)[l\\](u)" in line, line


def test_one_function_per_medium() -> None:
    hostile = "a|b\x1b[1m\u202e<i>![x](http://a)[l](u)&amp; www.x.org"
    assert safe_text(hostile) == "a|b\\x1b[1m\\u202e<i>![x](http://a)[l](u)&amp; www.x.org"
    md = markdown_text(hostile)
    assert md == "a\\|b\\\\x1b[1m\\\\u202e\\<i\\>![x\\](http:/\\/a)[l\\](u)\\&amp; www\\.x.org"
    assert markdown_text("kv_swa [0,6] _x_ [r]: u") == "kv_swa [0,6] \\_x\\_ [r\\]: u"
    assert markdown_code("trunc:at=half") == "`trunc:at=half`" and markdown_code("a|b") == "a\\|b"
    assert markdown_code("x`y") == "x\\`y"
    assert markdown_fence("a\n```\nb") == ["````text", "a", "```", "b", "````"]
    for lead, want in (("- x", "\\- x"), ("1. x", "1\\. x"), ("= x", "\\= x"), ("  + x", "  \\+ x")):
        assert markdown_text(lead) == want


@pytest.mark.engine
def test_lab_prompt_stderr_line_escapes_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``lab --prompt``'s "wrote the scenario FOLDER" line on stderr printed the folder's name raw (real llama.cpp
    writes the scenario; the Markdown that follows escapes the same name)."""
    from tests.support.llama_builds import need_build

    need_build("0c1e5709")
    folder = tmp_path / HOSTILE
    code = main(["lab", "--context", str(folder), "--model", str(TINY_LLAMA), "--build", "0c1e5709", "--prompt",
                 "the quick brown fox", "--prompt", "a lazy dog", "--as-is", "--policy", "contained"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not any(c in err + out for c in RAW)
    wrote = next(line for line in err.splitlines() if "wrote the scenario" in line)
    assert safe_text(folder) in wrote
    assert out.splitlines()[0] == "### kvscope lab: " + markdown_text(folder.name)
