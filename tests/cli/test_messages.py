"""The one-liners of issue #31 item 20, each as a user reads it: a folder, FIFO or device named for what it is
(never "no such file"), a random file given to ``lab --context`` called what it is (not "no model"), no
"not a llama.cpp state file (not a llama.cpp state file (...))", no Python exception class name, a value
thousands of digits long cut when it is echoed, ``gui --screenshot --size`` bounded before Qt starts, and the
internal wording of ``lab --prompt``'s refusals and folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.main import main
from kvscope.core.errors import cut_long_values, error_line, path_kind

STATE = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
MODEL = DATA / "llamacpp-2026-10-01/tiny-llama.gguf"
LAB = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"


@pytest.fixture
def specials(tmp_path: Path) -> Iterator[dict[str, tuple[str, str]]]:
    """Not-a-file paths and the words that must name them."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    yield {"folder": (str(folder), "a folder, not a file"), "fifo": (str(fifo), "a FIFO (named pipe), not a regular "
                                                                               "file"),
           "device": ("/dev/zero", "a character device, not a regular file")}


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvscope: "), err
    return err.rstrip("\n")


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_rewrite_names_what_the_input_is(kind: str, specials: dict[str, tuple[str, str]], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path, words = specials[kind]
    assert main(["rewrite", path, "-o", str(tmp_path / "out.bin")]) == 2
    line = _one_line(capsys)
    assert line == f"kvscope: {path}: {words}" and "no such file" not in line


@pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
def test_gui_screenshot_names_what_the_input_is(kind: str, specials: dict[str, tuple[str, str]], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path, words = specials[kind]
    assert main(["gui", path, "--screenshot", str(tmp_path / "shot.png")]) == 2
    assert _one_line(capsys) == f"kvscope: {path}: {words}"


def test_path_kind_words(specials: dict[str, tuple[str, str]], tmp_path: Path) -> None:
    for path, words in specials.values():
        assert path_kind(path) == words
    assert path_kind(tmp_path / "nothing") == "no such file"
    os.symlink(tmp_path / "nothing", tmp_path / "dangling")
    assert path_kind(tmp_path / "dangling") == "a broken symbolic link"
    assert path_kind(STATE) == "a regular file"


@pytest.mark.parametrize("kind", ["random", "fifo", "device", "null"])
def test_lab_context_that_is_no_state_says_so(kind: str, specials: dict[str, tuple[str, str]], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``lab --context RANDOM`` said "no model: give the GGUF the state was written with"."""
    if kind == "random":
        path = tmp_path / "random.bin"
        path.write_bytes(os.urandom(4096))
        want = f"kvscope: {path}: not a llama.cpp state file"
    else:
        path, words = (specials["fifo"] if kind == "fifo" else ("/dev/zero" if kind == "device" else "/dev/null",
                                                                "a character device, not a regular file"))
        want = f"kvscope: {path}: {words}"
    assert main(["lab", "--context", str(path)]) == 2
    line = _one_line(capsys)
    assert line.startswith(want) and "no model" not in line, line


def test_lab_context_state_without_model_asks_for_the_model(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ctx = tmp_path / "ctx.state.bin"
    ctx.write_bytes((LAB / "context.state.bin").read_bytes())
    assert main(["lab", "--context", str(ctx)]) == 2
    line = _one_line(capsys)
    assert "give --model" in line and line.startswith(f"kvscope: {ctx}: no model: no context.json beside it")


def test_verify_not_a_state_file_is_said_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "random.bin"
    path.write_bytes(os.urandom(5000))
    assert main(["verify", str(path), "--model", str(MODEL)]) == 2
    line = _one_line(capsys)
    assert line.count("not a llama.cpp state file") == 1, line


def test_verify_model_folder_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(STATE), "--model", str(tmp_path)]) == 2
    line = _one_line(capsys)
    assert line.startswith(f"kvscope: {tmp_path}: a folder, not a file") and "no such" not in line


@pytest.mark.parametrize("argv", [
    ["lab", "--context", str(LAB), "--into", "9" * 5000],
    ["rewrite", str(STATE), "-o", "/nonexistent/x", "--seq-id", "9" * 5000],
    ["corrupt", str(STATE), "--corrupt", "set:at=0,value=0x" + "f" * 5000, "-o", "/nonexistent/x"],
])
def test_a_long_value_is_cut_when_echoed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A 5,000-digit value came back whole (10 kB on stderr)."""
    assert main(argv) == 2
    line = _one_line(capsys)
    assert len(line) < 400, len(line)


def test_cut_long_values() -> None:
    assert cut_long_values("x " + "9" * 100_000 + " y") == "x " + "9" * 60 + "... (100000 characters) y"
    name = "n" * 255  # a file name may be that long: kept
    assert cut_long_values(f"/a/{name}: no such file") == f"/a/{name}: no such file"
    assert len(error_line("--into " + "1" * 5000)) < 120


def _gui(*args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys\nfrom kvscope.core.cli.main import main\nrc = main(sys.argv[1:])\n"
            "print('qt imported' if 'PySide6.QtWidgets' in sys.modules else 'no qt', file=sys.stderr)\nsys.exit(rc)\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-c", code, "gui", *args], capture_output=True, text=True, timeout=120,
                          env=env)


@pytest.mark.parametrize("size", ["100000x100000", "0x0", "-5x-5", "axb", "1x", "9" * 5000 + "x1", "8193x100"])
def test_gui_screenshot_size_is_bounded_before_qt(size: str, tmp_path: Path) -> None:
    """``--size 100000x100000`` printed 7,490 lines of Qt warnings; now one line, exit 2, Qt never started."""
    r = _gui(str(STATE), "--screenshot", str(tmp_path / "s.png"), f"--size={size}")
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr[-500:]
    assert len(lines) == 2 and lines[0].startswith("kvscope: --size ") and lines[1] == "no qt", lines[:5]
    assert len(lines[0]) < 200
    assert not (tmp_path / "s.png").exists()


def test_messages_name_no_python_exception_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``lab --prompt --model LOOP`` (a symbolic link to itself) was ``internal error ... RuntimeError: Symlink
    loop``, exit 1; a file name that cannot be encoded and numbers that overflow say what is wrong without a
    Python exception name (``UnicodeEncodeError``, ``OverflowError``, ``RuntimeError``...)."""
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    cases = [(["lab", "--context", str(tmp_path / "new"), "--prompt", "hi", "--model", str(loop)],
              f"kvscope: {loop}: too many levels of symbolic links"),
             (["inspect", str(tmp_path / "bad\udcff.bin")], "kvscope: "),
             (["lab", "--context", str(LAB), "--ctx-param", "n_ctx=" + "9" * 30], "kvscope: "),
             (["verify", str(STATE), "--model", str(MODEL), "--next-token", "9" * 30], "kvscope: ")]
    for argv, start in cases:
        assert main(argv) == 2, argv
        line = _one_line(capsys)
        assert line.startswith(start) and "Error" not in line and "Exception" not in line, line
    assert not (tmp_path / "new").exists()


def test_lab_prompt_folder_and_refusal_words() -> None:
    """``lab --prompt``'s refusal for a prompt that does not fit (it said "ok rc=1") and its folder's mode."""
    from kvscope.core.lab.new_scenario import decode_refusal
    from kvscope.core.memory import ContextParams

    params = ContextParams(n_ctx=256, n_seq_max=2)
    text = decode_refusal(0, 600, None, 1, params)
    assert "ok" not in text.split(": ", 1)[1] and "rc=" not in text
    assert "do not fit the context" in text and "n_ctx 256" in text
    assert "aborted" in decode_refusal(1, 3, None, 2, params)
    assert decode_refusal(1, 3, "engine aborted: SIGABRT", None, params).endswith("engine aborted: SIGABRT")


@pytest.mark.engine
def test_lab_prompt_too_long_for_the_context_is_refused(builds: object, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Real llama.cpp: a prompt longer than the context: a clear refusal (was "...: ok rc=1"); nothing written."""
    folder = tmp_path / "scn"
    code = main(["lab", "--context", str(folder), "--model", str(MODEL), "--build", "0c1e5709", "--prompt",
                 "the quick brown fox " * 200, "--ctx-param", "n_ctx=256"])
    line = _one_line(capsys)
    assert code == 2 and "rc=" not in line and " ok" not in line, line
    assert "n_ctx" in line and "shorter prompt" in line
    assert not folder.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.engine
def test_lab_prompt_folder_has_the_umask_mode(builds: object, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The scenario folder ``lab --prompt`` writes was 0700 (``mkdtemp``); it is 0777 less the umask."""
    folder = tmp_path / "scn"
    old = os.umask(0o022)
    try:
        code = main(["lab", "--context", str(folder), "--model", str(MODEL), "--build", "0c1e5709", "--prompt",
                     "the quick brown fox", "--prompt", "a lazy dog", "--as-is", "--json"])
    finally:
        os.umask(old)
    assert code == 0, capsys.readouterr().err
    assert oct(folder.stat().st_mode & 0o777) == oct(0o755)


@pytest.fixture
def builds() -> object:
    from tests.support.llama_builds import need_build

    return need_build("0c1e5709")




def test_a_user_message_names_no_exception_class(capsys: pytest.CaptureFixture[str]) -> None:
    """Code that formats ``f"{type(e).__name__}: {e}"`` into a KvscopeError (the engine worker's reply, a fleet
    reason): the user reads the reason, not the class; an internal error's line keeps it (a bug report)."""
    import argparse

    from kvscope.core.cli.plumbing import run_command
    from kvscope.core.errors import InputError, without_class_names

    def worker_said(_: argparse.Namespace) -> int:
        raise InputError("llama.cpp cannot start on m.gguf: UnicodeEncodeError: 'utf-8' codec can't encode "
                         "character '\\udcff': surrogates not allowed; OverflowError: int too big to convert")

    assert run_command(worker_said, argparse.Namespace(command="lab")) == 2
    line = _one_line(capsys)
    assert line == ("kvscope: llama.cpp cannot start on m.gguf: 'utf-8' codec can't encode character '\\udcff': "
                    "surrogates not allowed; int too big to convert")
    assert without_class_names("internal: KeyError: 'x'") == "internal: 'x'"
    assert without_class_names("ModelErrors: a") == "ModelErrors: a"  # not a class name: kept


def test_lab_context_json_nested_too_deeply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A context.json of lists 100,000 deep was an internal error (RecursionError); found by the messages fuzz."""
    path = tmp_path / "context.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["lab", "--context", str(path)]) == 2
    assert _one_line(capsys) == f"kvscope: {path}: not a lab scenario's context.json (nested too deeply)"


def test_report_folder_with_a_deeply_nested_report_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``report -o DIR`` where DIR/report.json is lists 100,000 deep: not a report of ours, refused as any folder
    that is not one (was an internal error, RecursionError)."""
    pytest.importorskip("PySide6")
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["report", str(STATE), "-o", str(out)]) == 2
    line = _one_line(capsys)
    assert "internal error" not in line and str(out) in line, line


def test_migrate_journal_nested_too_deeply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DEST journal line nested 100,000 deep is skipped like a cut line (was an internal error, RecursionError)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    (src / "a.seqstate").write_bytes(STATE.read_bytes())
    (dest / ".kvscope-migrate.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    code = main(["migrate", str(src), "--layout", "2026-10", "--out", str(dest), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code in (0, 1) and "internal error" not in err, err
    assert (dest / "a.seqstate").read_bytes() == STATE.read_bytes()
