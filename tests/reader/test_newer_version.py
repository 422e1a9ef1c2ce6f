"""A file written by a llama.cpp newer than kvscope knows (#27, "Newer than known").

The issue's own recipe: a real slot (and session) file with its version word set above the newest known (what
the open upstream PR for a v5 file would write). ``kvscope inspect`` says ``newer`` (never ``damaged``) with the
sentence naming the newest known version and the build that writes it, exits 1, and still parses every section
(the tree is the original's but for the version's value); ``kvscope report``'s report.json says the same; a
version word far above (0xFFFFFFFF) is no traceback. The numbers in the expected sentence come from the layout
table and the pinned builds, as the reader's do.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.cli import main as core_cli
from kvscope.core.pinned_builds import build_writing
from kvscope.core.reader.layouts import file_version, newest_generation
from kvscope.core.reader.parse import read_state

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = (
    "gen-b11434/llama-q8_0-fa1-unified0-seq2.seqstate",  # b11434 writes seq version 4
    "gen-b11434/llama-f16-fa1-unified1-ctx.session",  # session version 11
    "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate",  # 0c1e5709 writes seq version 3
    "llamacpp-2026-10-01/gemma2-f16-fa0-unified0-swafull1-ctx.session",  # session version 10
)


def _bumped(src: Path, dst: Path, version: int | None = None) -> tuple[Path, str, int]:
    """A copy of ``src`` whose version word (offset 4) says one above the newest known (or ``version``)."""
    data = bytearray(src.read_bytes())
    kind = "session_file" if src.suffix == ".session" else "seq_file"
    newest = file_version(newest_generation(kind), kind)
    v = newest + 1 if version is None else version
    struct.pack_into("<I", data, 4, v)
    dst.write_bytes(bytes(data))
    return dst, kind, v


def _inspect(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    rc = core_cli.main(["inspect", str(path), "--json", "--tree", *extra])
    return rc, json.loads(capsys.readouterr().out)


def _shape(node: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every node of an inspect --json tree: (path-ish name, kind, offset, size, status)."""
    out = [(node.get("name"), node.get("kind"), node.get("offset"), node.get("size"), node.get("status"))]
    for child in node.get("children") or ():
        out += _shape(child)
    return out


def _sentence(kind: str, version: int, read_as: int) -> str:
    newest = newest_generation(kind)
    word = "session" if kind == "session_file" else "seq"
    return (f"written by a llama.cpp newer than this kvscope knows ({word} version {version}; the newest known, "
            f"{build_writing(newest.name)}, writes {file_version(newest, kind)}); read as {read_as} where the bytes "
            "fit")


@pytest.mark.parametrize("name", FILES, ids=[f.split("/")[0] + "-" + Path(f).suffix[1:] for f in FILES])
def test_a_newer_version_is_newer_not_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    src = DATA / name
    path, kind, v = _bumped(src, tmp_path / src.name)  # the same name: the trees compare whole
    orc, orig = _inspect(src, capsys)
    rc, got = _inspect(path, capsys)
    assert orc == 0 and orig["verdict"]["level"] in ("healthy", "suspicious")
    assert got["verdict"]["level"] == "newer" and got["verdict"]["title"] == "newer"
    read_as = orig["header"]["version"]  # the layout that fits the bytes is the one that wrote them
    want = f"{_sentence(kind, v, read_as)}: {src.stat().st_size:,} bytes trusted"
    assert got["verdict"]["reason"] == want
    assert rc == 1  # worth attention, as an error is
    assert got["layout"]["name"] == orig["layout"]["name"]
    assert _shape(got["tree"]) == _shape(orig["tree"])  # every section still parsed, as the original's
    assert got["coverage"] == orig["coverage"]
    newer = [f for f in got["findings"] if f["code"] == "version_newer"]
    assert len(newer) == 1 and newer[0]["offset"] == 4 and newer[0]["length"] == 4
    assert newer[0]["severity"] != "error" and got["verdict"]["counts"]["error"] == 0
    assert not any("never written" in f["message"] for f in got["findings"])


def test_the_issue_slot_at_version_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: a real b11434 slot with its seq version set to 5 (it gave ``damaged: version 5 was never
    written by llama.cpp``), in inspect's text and in report.json."""
    src = DATA / FILES[0]
    path, _, _ = _bumped(src, tmp_path / "v5.seqstate", 5)
    capsys.readouterr()
    rc = core_cli.main(["inspect", str(path)])
    text = capsys.readouterr().out
    assert rc == 1
    assert ("verdict: newer: written by a llama.cpp newer than this kvscope knows (seq version 5; the newest "
            "known, b11434, writes 4); read as 4 where the bytes fit: 668 bytes trusted") in text
    assert "damaged" not in text.split("\n\n")[1]
    rrc = core_cli.main(["report", str(path), "-o", str(tmp_path / "report")])
    capsys.readouterr()
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rrc == 1
    assert report["verdict"]["level"] == report["overview"]["verdict"]["level"] == "newer"
    assert "b11434, writes 4" in report["verdict"]["reason"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "newer" in md and "damaged" not in md.split("written by a llama.cpp newer")[0].lower()


def test_nothing_rewrites_a_newer_file_as_an_older_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _, _ = _bumped(DATA / FILES[0], tmp_path / "v5.seqstate", 5)
    _, got = _inspect(path, capsys)
    assert all(c.get("migratable") is not True for c in got["compatibility"])
    rc = core_cli.main(["rewrite", str(path), "--layout", "2026-10", "-o", str(tmp_path / "out.seqstate")])
    err = capsys.readouterr().err
    assert rc == 2 and "newer" in err and not (tmp_path / "out.seqstate").exists()


@pytest.mark.parametrize("version", [0xFFFFFFFF, 0x80000000, 1 << 16])
def test_a_version_far_above_is_no_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str], version: int) -> None:
    for name in FILES[:2]:
        src = DATA / name
        path, _, _ = _bumped(src, tmp_path / f"far{src.suffix}", version)
        rc, got = _inspect(path, capsys)
        assert rc == 1 and got["verdict"]["level"] == "newer"
        assert f"version {version};" in got["verdict"]["reason"]
        capsys.readouterr()
        assert core_cli.main(["inspect", str(path), "--markdown"]) == 1


def test_a_version_below_that_was_never_written_stays_damaged(tmp_path: Path) -> None:
    """Only a version above the newest known is a newer llama.cpp's: seq version 1 was never written."""
    path, _, _ = _bumped(DATA / FILES[0], tmp_path / "v1.seqstate", 1)
    res = read_state(path)
    assert any(f.code == "value_invalid" and "never written" in f.message for f in res.findings)
    assert not any(f.code == "version_newer" for f in res.findings)
    from kvscope.core.analysis.verdict import verdict

    assert verdict(res).level == "damaged"


def test_a_newer_file_cut_short_is_still_newer(tmp_path: Path) -> None:
    """A newer layout may differ where the older reading fails: its errors follow the sentence, never damaged."""
    src = DATA / FILES[0]
    path, kind, v = _bumped(src, tmp_path / "cut.seqstate")
    path.write_bytes(path.read_bytes()[:400])
    from kvscope.core.analysis.verdict import verdict

    res = read_state(path)
    got = verdict(res)
    assert got.level == "newer" and res.n_errors
    assert got.reason.startswith(_sentence(kind, v, 4)) and "trusted; read as 4: " in got.reason
