"""Issue 31, item 3 (and items 1-2 for ``report -o DIR``): a report replaces only its own files.

``kvscope report -o DIR`` over an earlier report used to rename DIR away and delete it whole, so a file
the user had put into DIR was lost without a word. Now an existing DIR keeps its identity and everything
else in it: the new report's files are renamed over their namesakes, the earlier report's own pictures
that the new one lacks are removed (the ones its report.json lists), and nothing else is touched. DIR is
also held to the one output rule: never an input, by any path; never a FIFO, a device or a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from kvscope.app.report.builder import build_report
from kvscope.core.cli.report_command import main
from kvscope.core.fsutil import TEMP_PREFIX
from kvscope.core.report.model import ReportError, ReportOptions
from tests.support.report_paths import MODEL, NAN_FILE
from tests.support.special_nodes import null_node, system_null_intact


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _own(folder: Path) -> set[str]:
    doc = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    return {im["file"] for im in doc["report"]["images"]} | {"report.json", "report.md", "report.html"}


def test_files_the_user_added_survive_a_second_report(tmp_path: Path) -> None:
    dest = tmp_path / "report"
    build_report(ReportOptions(str(NAN_FILE)), dest)
    first = _own(dest)
    (dest / "notes.txt").write_text("my findings, keep them")
    (dest / "extra.png").write_bytes(b"a picture of mine")  # a .png no report wrote
    (dest / "mine").mkdir()
    (dest / "mine" / "a.txt").write_text("deep")
    inode = dest.stat().st_ino
    html_before = (dest / "report.html").read_bytes()

    build_report(ReportOptions(str(NAN_FILE), str(MODEL)), dest)  # another report (with the model) over it

    assert (dest / "notes.txt").read_text() == "my findings, keep them"
    assert (dest / "extra.png").read_bytes() == b"a picture of mine"
    assert (dest / "mine" / "a.txt").read_text() == "deep"
    assert dest.stat().st_ino == inode  # the same folder, not a new one renamed over it
    second = _own(dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted(second | {"notes.txt", "extra.png", "mine"})
    assert (dest / "report.html").read_bytes() != html_before  # the new report (it names the model) is in
    assert first <= second | {"notes.txt"}  # no picture of the first report is left over unless the second has it
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)]


def test_the_earlier_reports_own_pictures_are_removed(tmp_path: Path) -> None:
    dest = tmp_path / "report"
    build_report(ReportOptions(str(NAN_FILE)), dest)
    doc = json.loads((dest / "report.json").read_text(encoding="utf-8"))
    doc["report"]["images"].append({"file": "heatmap-9-k9.png", "title": "an earlier picture"})
    doc["report"]["images"].append({"file": "../outside.png", "title": "a hand-edited name"})
    (dest / "report.json").write_text(json.dumps(doc), encoding="utf-8")
    (dest / "heatmap-9-k9.png").write_bytes(b"old picture")
    (tmp_path / "outside.png").write_bytes(b"not the report's")

    build_report(ReportOptions(str(NAN_FILE)), dest)

    assert not (dest / "heatmap-9-k9.png").exists()  # the earlier report's own, not in the new one
    assert (tmp_path / "outside.png").read_bytes() == b"not the report's"  # never outside DIR
    assert sorted(p.name for p in dest.iterdir()) == sorted(_own(dest))


def test_an_input_inside_dir_under_a_report_name_is_refused(tmp_path: Path) -> None:
    """The state named like one of the report's pictures: replacing it would lose the input."""
    dest = tmp_path / "report"
    build_report(ReportOptions(str(NAN_FILE)), dest)
    state = dest / "bytemap.png"
    shutil.copyfile(NAN_FILE, state)
    before = {p.name: _sha(p) for p in dest.iterdir()}
    with pytest.raises(ReportError, match="is the input"):
        build_report(ReportOptions(str(state)), dest)
    assert {p.name: _sha(p) for p in dest.iterdir()} == before
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.parametrize("target", ["state", "model", "fifo", "devnull", "symlink_to_state"])
def test_dir_naming_an_input_or_a_special_file_is_refused(target: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "slot.seqdata.bin"
    shutil.copyfile(NAN_FILE, state)
    model = tmp_path / "model.gguf"
    shutil.copyfile(MODEL, model)
    sums = {state: _sha(state), model: _sha(model)}
    if target == "fifo":
        out = str(tmp_path / "pipe")
        os.mkfifo(out)
    elif target == "devnull":
        out = null_node(tmp_path)  # /dev/null, or (as root) a private node of that device
    elif target == "symlink_to_state":
        out = str(tmp_path / "link")
        os.symlink(state, out)
    else:
        out = str(state if target == "state" else model)
    listing = sorted(os.listdir(tmp_path))
    assert main([str(state), "--model", str(model), "-o", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: ") and err.count("\n") == 1, err
    assert ("not a folder" if target in ("fifo", "devnull") else "is the input") in err
    assert all(_sha(p) == s for p, s in sums.items())
    assert sorted(os.listdir(tmp_path)) == listing
    assert system_null_intact()
    if target == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)
    if target == "devnull":
        assert stat.S_ISCHR(os.lstat(out).st_mode)


def test_a_folder_of_the_users_under_a_report_name_is_refused(tmp_path: Path) -> None:
    """The user's folder named like a report file is neither replaced nor removed: the run writes nothing."""
    dest = tmp_path / "report"
    build_report(ReportOptions(str(NAN_FILE)), dest)
    (dest / "report.md").unlink()
    (dest / "report.md").mkdir()
    (dest / "report.md" / "draft.txt").write_text("mine")
    before = sorted(p.name for p in dest.iterdir())
    html = (dest / "report.html").read_bytes()
    with pytest.raises(ReportError, match="a folder, not a regular file"):
        build_report(ReportOptions(str(NAN_FILE), str(MODEL)), dest)
    assert sorted(p.name for p in dest.iterdir()) == before and (dest / "report.html").read_bytes() == html
    assert (dest / "report.md" / "draft.txt").read_text() == "mine"
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(TEMP_PREFIX)]
