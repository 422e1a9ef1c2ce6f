"""Every subcommand x every output mode x every class of bad input x with and without ``--model``.

The matrix is generated from the argparse parser itself (:func:`kvscope.core.cli.main.build_parser`
with the entry-point commands): the registered subcommands, their output-mode flags (``--json``,
``--markdown``), the argument that takes the command's input (its first positional, else its first
required option) and whether it has ``--model``. A new subcommand or option is in the matrix the day
it is registered; a required argument the matrix cannot fill fails :func:`test_every_required_argument_is_filled`.

Each case must answer with one line on stderr (``kvscope...: reason``), the documented exit code and
no traceback. Most cases run in-process (fast); the unreadable-file cases and a sample of the others
run as real ``kvscope`` processes, the unreadable ones without the capabilities that let root read
every file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH; the tests run as root). Commands that need
llama.cpp (``verify``) must refuse the input before any engine starts: the engine is never reached
for these inputs, so they are quick.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path
from kvscope.core.cli.main import build_parser, main, plugin_commands

pytestmark = pytest.mark.slow  # every command over every fixture kind, in subprocesses

GOOD_STATE = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.slot-emulated.seqstate"
MODEL = model_path("llama")
MODES = ("--json", "--markdown")  # besides plain text
INPUTS = ("empty", "random", "gguf", "directory", "fifo", "missing", "unreadable")

# scan and migrate take a folder (a file is "not a directory", exit 2): an empty folder is a run over
# no file, exit 0.
DIRECTORY_COMMANDS = ("scan", "migrate")
EXPECTED: dict[tuple[str, str], int] = {(cmd, "directory"): 0 for cmd in DIRECTORY_COMMANDS}
# What the GUI does with a file it can open is to show it (its findings in the window): only the
# inputs it refuses before the window opens are command-line errors.
WINDOW_INPUTS = {"gui": ("empty", "random", "gguf", "unreadable")}


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


PARSER = build_parser(plugin_commands(None))
COMMANDS = _subparsers(PARSER)


def _input_action(p: argparse.ArgumentParser) -> argparse.Action | None:
    """The argument that takes the command's input: its first positional, else its first required option."""
    pos = [a for a in p._actions if not a.option_strings]
    if pos:
        return pos[0]
    return next((a for a in p._actions if a.option_strings and a.required), None)


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


# Values for the other required arguments, by dest (``{tmp}``: a fresh folder of the case).
FILLERS = {
    "output": "{tmp}/out",  # rewrite -o FILE, report -o DIR
    "out": "{tmp}/dest",  # migrate --out DEST
    "layout": "2026-10",  # migrate --layout GEN
    "model": str(MODEL),  # verify --model (required there)
    "b": str(GOOD_STATE),  # diff's second file
    "corrupt": "truncated_half",  # corrupt --corrupt SPEC
}


def _fill(p: argparse.ArgumentParser, skip: argparse.Action, tmp: Path) -> list[str]:
    argv: list[str] = []
    for a in p._actions:
        if a is skip or not (a.required or (not a.option_strings and a.nargs not in ("*", "?"))):
            continue
        if a.dest not in FILLERS:
            raise KeyError(a.dest)
        value = FILLERS[a.dest].format(tmp=tmp)
        argv += [a.option_strings[0], value] if a.option_strings else [value]
    return argv


@dataclass(frozen=True)
class Case:
    command: str
    mode: str  # "", "--json" or "--markdown"
    kind: str
    with_model: bool

    @property
    def id(self) -> str:
        model = "model" if self.with_model else "nomodel"
        return f"{self.command}-{self.mode.lstrip('-') or 'text'}-{self.kind}-{model}"

    @property
    def expected(self) -> int:
        return EXPECTED.get((self.command, self.kind), 2)


def _cases() -> Iterator[Case]:
    for name, p in COMMANDS.items():
        if _input_action(p) is None:
            continue  # takes no input (llama-build): nothing to give it
        opts = _options(p)
        modes = ["", *(m for m in MODES if m in opts)]
        model_required = any(a.dest == "model" and a.required for a in p._actions)
        models = [True] if model_required else ([False, True] if "--model" in opts else [False])
        for mode in modes:
            for kind in INPUTS:
                if kind in WINDOW_INPUTS.get(name, ()):
                    continue
                for m in models:
                    yield Case(name, mode, kind, m)


CASES = list(_cases())


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A folder holding one input of every class."""
    root = Path(tempfile.mkdtemp(prefix="kvscope-matrix-"))
    (root / "empty.bin").write_bytes(b"")
    (root / "random.bin").write_bytes(bytes(range(256)) * 64)
    shutil.copy(MODEL, root / "model-as-state.gguf")
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    locked = root / "locked.bin"
    locked.write_bytes(GOOD_STATE.read_bytes())
    locked.chmod(0)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _input_path(root: Path, kind: str) -> str:
    return str(root / {"empty": "empty.bin", "random": "random.bin", "gguf": "model-as-state.gguf",
                       "directory": "folder", "fifo": "fifo", "missing": "missing.bin",
                       "unreadable": "locked.bin"}[kind])


def _argv(case: Case, root: Path, tmp: Path) -> list[str]:
    p = COMMANDS[case.command]
    action = _input_action(p)
    assert action is not None
    bad = _input_path(root, case.kind)
    argv = [case.command, *([action.option_strings[0], bad] if action.option_strings else [bad])]
    argv += _fill(p, action, tmp)
    if case.with_model and "--model" not in argv:
        argv += ["--model", str(MODEL)]
    return argv + ([case.mode] if case.mode else [])


def _check(case: Case, rc: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert rc == case.expected, f"exit {rc}, expected {case.expected}; stderr: {err!r}"
    lines = err.splitlines()
    if case.expected == 2:
        assert len(lines) == 1, f"expected one line on stderr: {err!r}"
        assert lines[0].startswith("kvscope"), lines[0]
    else:
        assert len(lines) <= 1, err


def test_the_matrix_covers_every_command_that_takes_input() -> None:
    assert {"inspect", "diff", "scan", "migrate", "rewrite", "lab", "verify", "report", "gui"} <= set(COMMANDS)
    assert {c.command for c in CASES} == {n for n, p in COMMANDS.items() if _input_action(p) is not None}
    assert {c.mode for c in CASES if c.command == "inspect"} == {"", "--json", "--markdown"}
    assert {(c.command, c.with_model) for c in CASES if c.command == "verify"} == {("verify", True)}


def test_every_required_argument_is_filled(tmp_path: Path) -> None:
    """A required argument with no filler: add one to FILLERS so the new command joins the matrix."""
    for name, p in COMMANDS.items():
        action = _input_action(p)
        if action is not None:
            _fill(p, action, tmp_path)  # KeyError names the argument
        else:
            assert not [a for a in p._actions if a.required], name


@pytest.mark.parametrize("case", [c for c in CASES if c.kind != "unreadable"], ids=lambda c: c.id)
def test_bad_input_in_process(case: Case, shared: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(_argv(case, shared, tmp_path))
    _check(case, rc, capsys.readouterr().err)


_libc = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def _without_root_reads() -> None:
    """In the child before exec: root keeps its uid but loses the right to read what it may not (the
    interpreter under /root stays runnable, which it would not be for ``nobody``)."""
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _run_kvscope(argv: list[str], unprivileged: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", *argv], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env=env,
                          preexec_fn=_without_root_reads if unprivileged and os.geteuid() == 0 else None)


UNREADABLE = [c for c in CASES if c.kind == "unreadable"]
# a sample of real processes beside the in-process runs: each input class once, each command once
SAMPLE = [c for c in CASES if c.kind != "unreadable" and c.mode == "" and (
    (c.command == "inspect" and not c.with_model) or (c.kind == "fifo" and c.with_model))]


@pytest.mark.parametrize("case", UNREADABLE, ids=lambda c: c.id)
def test_unreadable_input(case: Case, shared: Path, tmp_path: Path) -> None:
    r = _run_kvscope(_argv(case, shared, tmp_path), unprivileged=True)
    _check(case, r.returncode, r.stderr)
    if case.command not in DIRECTORY_COMMANDS:  # the report too: it runs without the gui extra (report.md, .json)
        assert "ermission" in r.stderr or "no model" in r.stderr  # lab asks for the model first


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.id)
def test_bad_input_in_a_real_process(case: Case, shared: Path, tmp_path: Path) -> None:
    r = _run_kvscope(_argv(case, shared, tmp_path), unprivileged=False)
    _check(case, r.returncode, r.stderr)


def test_the_fixture_files_are_what_they_say(shared: Path) -> None:
    assert stat.S_ISFIFO(os.stat(shared / "fifo").st_mode)
    assert os.stat(shared / "locked.bin").st_mode & 0o777 == 0
