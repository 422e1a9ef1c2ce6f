"""Issue 31, items 1 and 2: one output-path guard for every command that writes a file.

``-o`` used to be checked against FILE only (and not at all for the node kind): ``repair``, ``corrupt`` and
``rewrite`` wrote over the ``--model`` GGUF or the ``--tokens @FILE`` with exit 0 (a multi-GB model
replaced by a 12 KB slot), and replaced a FIFO or a device node by a regular file. Now
:func:`kvscope.core.fsutil.output_problem` refuses an OUT that names any input by any path (a symlink, a
hard link, ``/proc/self/fd/N``) and an OUT that exists and is not a regular file, before anything is read:
one line on stderr, exit 2, every input's bytes unchanged, the FIFO still a FIFO, ``/dev/null`` still a
character device, and nothing left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvscope.core.cli.main import main
from kvscope.core.errors import UsageError
from kvscope.core.fsutil import check_output, output_problem
from tests.support.special_nodes import null_node, system_null_intact

ROOT = Path(__file__).resolve().parents[1]
SLOT = ROOT / "resources/examples/llama-slot.seqstate"
TINY = ROOT / "resources/examples/tiny-llama.gguf"
SLOT_TOKENS = [1, 332, 337, 47, 298, 324, 327, 316, 320, 298, 346, 349]  # the example slot's own prompt

TARGETS = ("state", "model", "tokens", "symlink", "hardlink", "procfd", "fifo", "devnull", "folder")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging (a command that opened the FIFO would block in open())."""
    def expire(_sig: int, _frame: object) -> None:
        raise TimeoutError(f"the command did not return in {seconds} s (did it open the output?)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Inputs:
    """Private copies of a slot, the model and a tokens file (hard links need the same file system)."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "in"
        self.dir.mkdir()
        self.state = self.dir / "slot.seqstate"
        self.state.write_bytes(SLOT.read_bytes())
        self.model = self.dir / "model.gguf"
        self.model.write_bytes(TINY.read_bytes())
        self.tokens = self.dir / "tokens.json"
        self.tokens.write_text(json.dumps(SLOT_TOKENS))
        self.files = (self.state, self.model, self.tokens)
        self.sums = {p: _sha(p) for p in self.files}

    def unchanged(self) -> bool:
        return all(p.is_file() and not p.is_symlink() and _sha(p) == s for p, s in self.sums.items())


def _argv(command: str, ins: Inputs, out: str) -> list[str]:
    if command == "repair":  # the engine never starts: the refusal comes first
        return ["repair", str(ins.state), "--model", str(ins.model), "--tokens", f"@{ins.tokens}", "-o", out,
                "--timeout", "5"]
    if command == "corrupt":
        return ["corrupt", str(ins.state), "--corrupt", "truncated_half", "--model", str(ins.model), "-o", out]
    return ["rewrite", str(ins.state), "--model", str(ins.model), "-o", out]


# only repair reads a --tokens @FILE: for corrupt and rewrite that file is no input
CASES = [(c, t) for c in ("repair", "corrupt", "rewrite") for t in TARGETS if t != "tokens" or c == "repair"]


@pytest.mark.parametrize(("command", "target"), CASES)
def test_out_naming_an_input_or_a_special_file_is_refused(command: str, target: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ins = Inputs(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    fd = None
    if target in ("state", "model", "tokens"):
        out = str(getattr(ins, target))
    elif target == "symlink":
        out = str(work / "link.gguf")
        os.symlink(ins.model, out)
    elif target == "hardlink":
        out = str(ins.dir / "hard.gguf")
        os.link(ins.model, out)
    elif target == "procfd":
        fd = os.open(ins.model, os.O_RDONLY)
        out = f"/proc/self/fd/{fd}"
    elif target == "fifo":
        out = str(work / "pipe")
        os.mkfifo(out)
    elif target == "devnull":
        out = null_node(work)  # /dev/null, or (as root) a private node of that device: see special_nodes
    else:
        out = str(work / "folder")
        os.mkdir(out)
        (work / "folder" / "keep.txt").write_text("mine")
    before = sorted(os.listdir(work)), sorted(os.listdir(ins.dir))
    try:
        with _deadline(60):
            code = main(_argv(command, ins, out))
    finally:
        if fd is not None:
            os.close(fd)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and lines[0].startswith("kvscope: "), captured.err
    expect = "not a regular file" if target in ("fifo", "devnull", "folder") else "is the input"
    assert expect in lines[0], lines[0]
    assert captured.out == ""
    assert ins.unchanged()
    assert (sorted(os.listdir(work)), sorted(os.listdir(ins.dir))) == before  # nothing written, nothing left
    if target == "fifo":
        assert stat.S_ISFIFO(os.lstat(out).st_mode)
    if target == "devnull":
        assert stat.S_ISCHR(os.lstat(out).st_mode)
    assert system_null_intact()
    if target == "symlink":
        assert os.path.islink(out) and os.path.samefile(out, ins.model)
    if target == "hardlink":
        assert os.path.samefile(out, ins.model)
    if target == "folder":
        assert os.listdir(out) == ["keep.txt"]


@pytest.mark.parametrize("command", ["corrupt", "rewrite"])
def test_a_fresh_out_and_a_regular_file_are_still_written(command: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The guard refuses what it must and nothing else: a new path, and an existing regular file (replaced)."""
    ins = Inputs(tmp_path)
    for out in (tmp_path / "new.seqstate", tmp_path / "old.seqstate"):
        if out.name == "old.seqstate":
            out.write_bytes(b"an earlier output")
        assert main(_argv(command, ins, str(out))) == 0, capsys.readouterr().err
        assert out.is_file() and out.read_bytes() != b"an earlier output"
    capsys.readouterr()
    assert ins.unchanged()
    assert sorted(os.listdir(tmp_path)) == ["in", "new.seqstate", "old.seqstate"]


def test_the_tokens_file_of_repair_is_named_by_any_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--tokens @FILE`` through a symlink and through a relative path with ``..``: still that input."""
    ins = Inputs(tmp_path)
    link = tmp_path / "tokens-link.json"
    os.symlink(ins.tokens, link)
    (tmp_path / "sub").mkdir()
    for out in (link, tmp_path / "sub" / ".." / "in" / "tokens.json"):
        assert main(_argv("repair", ins, str(out))) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is the input" in err
    assert ins.unchanged() and os.path.islink(link)


@pytest.mark.parametrize("target", ["state", "model", "fifo", "devnull", "folder"])
def test_gui_screenshot_is_held_to_the_same_rule(target: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``kvscope gui FILE --screenshot OUT``: refused before Qt is even imported."""
    pytest.importorskip("kvscope.app.shell.cli")
    ins = Inputs(tmp_path)
    if target == "fifo":
        out = str(tmp_path / "pipe")
        os.mkfifo(out)
    elif target == "devnull":
        out = null_node(tmp_path)
    elif target == "folder":
        out = str(tmp_path)
    else:
        out = str(getattr(ins, target))
    with _deadline(60):
        code = main(["gui", str(ins.state), "--model", str(ins.model), "--screenshot", out])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("kvscope: "), err
    assert ins.unchanged() and system_null_intact()
    if target in ("fifo", "devnull"):
        assert stat.S_ISFIFO(os.lstat(out).st_mode) if target == "fifo" else stat.S_ISCHR(os.lstat(out).st_mode)


# -- the rule itself ------------------------------------------------------------------------------------------


def test_output_problem_names_every_path_form(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x")
    os.symlink(src, tmp_path / "sym")
    os.link(src, tmp_path / "hard")
    (tmp_path / "d").mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        forms = [src, tmp_path / "sym", tmp_path / "hard", tmp_path / "d" / ".." / "a.bin", f"/proc/self/fd/{fd}",
                 f"/proc/{os.getpid()}/root{src}"]
        for form in forms:
            reason = output_problem(form, [None, tmp_path / "other", src])
            assert reason is not None and "is the input" in reason, form
    finally:
        os.close(fd)
    assert output_problem(tmp_path / "new.bin", [src]) is None
    assert output_problem(tmp_path / "hard", []) is None  # a regular file that is no input: replaced
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert output_problem(tmp_path / "dangling", [src]) is None  # the link itself is replaced


def test_output_problem_names_the_kind_of_a_special_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/null", tmp_path / "to-null")
    assert "a FIFO (named pipe), not a regular file" in (output_problem(tmp_path / "fifo", []) or "")
    assert "a character device, not a regular file" in (output_problem("/dev/null", []) or "")  # looks only
    assert "a character device" in (output_problem(tmp_path / "to-null", []) or "")  # followed: it is the node
    assert "a folder, not a regular file" in (output_problem(tmp_path, []) or "")
    assert output_problem(tmp_path, [], folder=True) is None
    assert "a FIFO (named pipe), not a folder" in (output_problem(tmp_path / "fifo", [], folder=True) or "")
    with pytest.raises(UsageError, match="not a regular file"):
        check_output("/dev/null", [], error=UsageError)

    class Mine(Exception):
        pass

    with pytest.raises(Mine, match="is the input"):
        check_output(tmp_path, [tmp_path], folder=True, error=Mine)


def test_a_name_with_a_newline_stays_one_line(tmp_path: Path) -> None:
    odd = tmp_path / "a\nb"
    odd.write_bytes(b"x")
    reason = output_problem(odd, [odd])
    assert reason is not None and "\n" not in reason and "a\\nb" in reason


@pytest.mark.parametrize("command", ["repair", "corrupt", "rewrite"])
def test_a_proc_fd_of_another_file_is_refused(command: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``/proc/self/fd/N`` of a file that is no input: the write's temporary cannot be made in /proc/self/fd
    (repair found it out only after the engine had run, with a traceback); refused first, in one line."""
    ins = Inputs(tmp_path)
    other = tmp_path / "other.bin"
    other.write_bytes(b"not an input")
    fd = os.open(other, os.O_RDONLY)
    try:
        code = main(_argv(command, ins, f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is a /proc name" in err, err
    assert other.read_bytes() == b"not an input" and ins.unchanged()
    assert output_problem(f"/proc/{os.getpid()}/root{other}", []) is None  # a real folder through /proc: fine


def test_repair_into_a_missing_folder_is_refused_before_any_engine(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ins = Inputs(tmp_path)
    assert main(_argv("repair", ins, str(tmp_path / "no" / "such" / "out.seqstate"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no folder" in err, err
    assert not (tmp_path / "no").exists() and ins.unchanged()
