"""Exit codes a script can trust: an internal error exits 3 (never 1, "findings") with one line that names a file
holding the traceback; an output that cannot be written (``> /dev/full``) is one line and exit 2, no traceback."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.core import errors
from kvscope.core.cli import plumbing
from kvscope.core.cli.main import main

_FILE_RE = re.compile(r"details in (\S+kvscope-internal-error-\d+-[0-9-]+\.txt)$")


def _report_file(err: str) -> Path:
    m = _FILE_RE.search(err.rstrip("\n"))
    assert m, err
    return Path(m.group(1))


def test_internal_error_code_is_its_own() -> None:
    assert errors.EXIT_INTERNAL == 3
    assert errors.EXIT_INTERNAL not in (errors.EXIT_OK, errors.EXIT_FINDINGS, errors.EXIT_BAD_INPUT)


def test_injected_internal_error_exits_3_with_the_traceback_in_a_file(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A command that raises RuntimeError (a bug) through the real ``main``: exit 3, one line, the file."""
    import kvscope.core.cli.inspect_command as inspect_command

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("injected \x1b[31mbug\u202e")

    monkeypatch.setattr(inspect_command, "cmd_inspect", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(plumbing.DEBUG_VARIABLE, raising=False)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    assert main(["inspect", "x.bin"]) == errors.EXIT_INTERNAL
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("kvscope: internal error in kvscope inspect: ")
    assert "Traceback" not in err and "\x1b" not in err and "\u202e" not in err
    assert "please report it; details in " in err
    report = _report_file(err)
    assert report.parent == tmp_path and report.is_file()
    text = report.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: injected" in text
    assert "in broken" in text  # the frame that raised
    assert oct(report.stat().st_mode & 0o777) == oct(0o600)


def test_run_command_internal_error_is_3_not_1(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(_: argparse.Namespace) -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    monkeypatch.setattr(plumbing, "_write_report", lambda e, c: str(tmp_path / "r.txt"))
    assert plumbing.run_command(broken, argparse.Namespace(command="lab")) == 3
    err = capsys.readouterr().err
    assert err == (f"kvscope: internal error in kvscope lab: KeyError: 'missing' \u2014 please report it; details in "
                   f"{tmp_path / 'r.txt'}\n")


def test_internal_error_when_the_details_cannot_be_written(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_: argparse.Namespace) -> int:
        raise ValueError("x" * 100_000)

    def no_room(e: BaseException, c: str | None) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plumbing, "_write_report", no_room)
    assert plumbing.run_command(broken, argparse.Namespace(command="scan")) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600, len(err)
    assert "could not be written (No space left on device)" in err and "KVSCOPE_DEBUG=1" in err


def test_real_process_internal_error_exits_3(tmp_path: Path) -> None:
    """The installed entry point in a child process: a command made to raise exits 3, the file holds the
    traceback, stderr is that one line."""
    code = ("import sys, kvscope.core.cli.corrupt_command as c\n"
            "def boom(args): raise RuntimeError('injected in a child')\n"
            "c.cmd_corrupt = boom\n"
            "from kvscope.core.cli.main import main\n"
            "sys.exit(main(['corrupt', 'a', '--corrupt', 'b', '-o', 'c']))\n")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(plumbing.DEBUG_VARIABLE, None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("kvscope: internal error in kvscope corrupt: RuntimeError: injected in a child")
    report = _report_file(r.stderr)
    assert report.parent == tmp_path
    assert "RuntimeError: injected in a child" in report.read_text()


def test_debug_prints_the_traceback_too(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    def broken(_: argparse.Namespace) -> int:
        raise RuntimeError("deep")

    monkeypatch.setenv(plumbing.DEBUG_VARIABLE, "1")
    monkeypatch.setattr(plumbing, "_write_report", lambda e, c: str(tmp_path / "r.txt"))
    assert plumbing.run_command(broken, argparse.Namespace(command="lab")) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith(f"details in {tmp_path / 'r.txt'}")


def _kvscope(*args: str, stdout: int | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys\nfrom kvscope.core.cli.main import main\nsys.exit(main())\n"
    return subprocess.run([sys.executable, "-c", code, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


@pytest.mark.parametrize("argv", [("corrupt", "--list"), ("--help",), ("corrupt", "--help"), ("--version",)])
def test_output_on_a_full_disk_is_one_line_exit_2(argv: tuple[str, ...]) -> None:
    """``kvscope corrupt --list > /dev/full`` printed a traceback (the interpreter's final flush) and exited 120."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        r = _kvscope(*argv, stdout=fd)
    finally:
        os.close(fd)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr == "kvscope: cannot write the output: no space left on device\n"


def test_a_reader_that_stops_is_not_a_failure() -> None:
    """``kvscope corrupt --list | head -1``: the rest is not wanted; no message, no traceback."""
    p = subprocess.Popen([sys.executable, "-c", "import sys\nfrom kvscope.core.cli.main import main\n"
                          "sys.exit(main(['corrupt', '--list']))\n"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # before it writes
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=120) == 0 and err == ""


def test_an_unreadable_input_is_not_an_output_failure(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a write with no room (ENOSPC, EDQUOT, EFBIG) is the output's fault: an OSError with a file name is a
    bug to report (exit 3), not "cannot write the output"."""
    def full(_: argparse.Namespace) -> int:
        raise OSError(28, "No space left on device")

    def named(_: argparse.Namespace) -> int:
        raise OSError(28, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(plumbing, "_write_report", lambda e, c: str(tmp_path / "r.txt"))
    assert plumbing.run_command(full, argparse.Namespace(command="scan")) == 2
    assert capsys.readouterr().err == "kvscope: cannot write the output: no space left on device\n"
    assert plumbing.run_command(named, argparse.Namespace(command="scan")) == 3
