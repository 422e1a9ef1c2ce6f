"""The one CLI plumbing: lazy command discovery, run_command's one-line failures, one-line usage errors,
the KEY=VALUE parser, and the one error hierarchy the commands raise."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.core import errors
from kvscope.core.cli.main import build_parser, main
from kvscope.core.cli.plumbing import OneLineParser, parse_pairs, run_command
from kvscope.core.cli.reference import subcommands
from kvscope.core.cli.registry import core_commands, core_front_ends, plugin_commands

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("PySide6", "pyqtgraph", "shiboken6", "torch", "kvscope.app")


def _imported_after(code: str) -> list[str]:
    probe = (f"import sys, io, contextlib\n{code}\n"
             f"print(__import__('json').dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(r.stdout.splitlines()[-1]))


@pytest.mark.parametrize("command", sorted(core_commands()))
def test_core_command_help_imports_neither_qt_nor_torch_nor_the_app(command: str) -> None:
    """``kvscope verify --help`` once loaded every entry-point command (the app's) to look for ``verify``."""
    code = ("from kvscope.core.cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()): rc = main([{command!r}, '--help'])\n"
            "assert rc == 0, rc")
    assert _imported_after(code) == []


def test_front_end_modules_import_only_the_standard_library() -> None:
    code = "\n".join(f"import {fe.module}" for fe in core_front_ends())
    assert _imported_after(code) == []
    r = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('numpy' in sys.modules)"],
                       capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == "False"


def test_commands_are_listed_one_module_each() -> None:
    """Every core command is in the registry's literal list, defined by core/cli/<name>_command.py, which
    registers just it; a command module left out of the list (or a list entry with no module) fails here."""
    from kvscope.core.cli.registry import COMMAND_MODULES

    found = core_commands()
    assert set(found) == set(COMMAND_MODULES)
    assert {"inspect", "diff", "scan", "migrate", "rewrite", "lab", "verify", "repair", "corrupt", "report",
            "llama-build"} == set(found)
    for name, module in COMMAND_MODULES.items():
        assert module == f"kvscope.core.cli.{name.replace('-', '_')}_command", name
        assert found[name].module == module and found[name].commands == (name,)
    on_disk = {p.stem for p in (ROOT / "core" / "cli").glob("*_command.py")}
    assert on_disk == {m.rsplit(".", 1)[1] for m in COMMAND_MODULES.values()}
    ap = build_parser(plugin_commands(None))
    assert list(subcommands(ap)) == [*COMMAND_MODULES, "gui"]  # the help lists them in the registry's order
    assert plugin_commands("verify") == {} and plugin_commands("report") == {}
    assert set(plugin_commands("gui")) == {"gui"}
    for fe in core_front_ends():  # each declares what it registers, and registers just that
        sub = argparse.ArgumentParser().add_subparsers()
        fe.register(sub)
        assert set(sub.choices) == set(fe.commands), fe.module


def _args(command: str = "inspect") -> argparse.Namespace:
    return argparse.Namespace(command=command)


def test_run_command_turns_a_kvscope_error_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def bad(_: argparse.Namespace) -> int:
        raise errors.InputError("x.bin: not\na state file \u202e(evil)")

    assert run_command(bad, _args()) == 2
    err = capsys.readouterr().err
    assert err == "kvscope: x.bin: not\\na state file \\u202e(evil)\n"

    def stopped(_: argparse.Namespace) -> int:
        raise errors.Cancelled("stopped")

    assert run_command(stopped, _args()) == errors.EXIT_INTERRUPTED


def test_run_command_unexpected_error_is_one_line_exit_3(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """An internal error exits 3 (EXIT_INTERNAL), never 1: a script would read 1 as findings in the file."""
    def broken(_: argparse.Namespace) -> int:
        return {}["missing"]  # type: ignore[no-any-return]

    monkeypatch.delenv("KVSCOPE_DEBUG", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert run_command(broken, _args("lab")) == errors.EXIT_INTERNAL == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("kvscope: internal error in kvscope lab: KeyError: 'missing'") and "please report it" in err
    monkeypatch.setenv("KVSCOPE_DEBUG", "1")
    assert run_command(broken, _args("lab")) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'missing'" in err


def test_run_command_memory_and_interrupt(capsys: pytest.CaptureFixture[str]) -> None:
    def oom(_: argparse.Namespace) -> int:
        raise MemoryError

    def interrupted(_: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    assert run_command(oom, _args()) == 2 and capsys.readouterr().err == "kvscope: out of memory\n"
    assert run_command(interrupted, _args()) == 130


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvscope: inspect: the following arguments are required: file (see kvscope inspect --help)\n")
    assert main(["nonesuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvscope: ") and "nonesuch" in err
    assert main(["lab", "--context", "x", "--engine", "warp"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    p = OneLineParser(prog="kvscope")
    p.add_argument("--n", type=int)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "many"])
    assert e.value.code == 2


def test_parse_pairs() -> None:
    assert parse_pairs(["n_ctx= 512", " type_k =q8_0", "n_ctx=1024"], "--ctx-param") == {"n_ctx": "1024",
                                                                                         "type_k": "q8_0"}
    assert parse_pairs(None, "--x") == {} and parse_pairs(["a="], "--x") == {"a": ""}
    for bad in ("novalue", "=1", " =1"):
        with pytest.raises(errors.UsageError, match="expected KEY=VALUE") as e:
            parse_pairs([bad], "--ctx-param")
        assert e.value.message.startswith("--ctx-param ")


# the exception classes that carry a reason for the user: each is a KvscopeError
USER_ERRORS = [
    ("kvscope.core.model.profile", "ModelProfileError"), ("kvscope.core.model.gguf_metadata", "GGUFMetadataError"),
    ("kvscope.core.reader.source", "FileChangedError"), ("kvscope.core.convert.to_generation", "SourceChanged"),
    ("kvscope.core.memory.params", "ParamsError"), ("kvscope.core.memory.spec", "SpecError"),
    ("kvscope.core.memory.layout", "LayoutError"), ("kvscope.core.memory.infer", "InferError"),
    ("kvscope.core.memory.result", "RestoreFailure"),
    ("kvscope.core.engine.abi", "ABIMismatch"), ("kvscope.core.verify.compare", "Cancelled"),
    ("kvscope.core.fleet.executors", "ExecutorError"), ("kvscope.core.lab.scenario", "ScenarioError"),
    ("kvscope.core.lab.runner", "LabError"), ("kvscope.core.lab.corruptions", "CorruptionError"),
    ("kvscope.core.lab.engine_live", "EngineLabError"),
]


@pytest.mark.parametrize(("module", "name"), USER_ERRORS)
def test_user_errors_share_one_base(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, errors.KvscopeError)
    e = cls.__new__(cls)
    Exception.__init__(e, "a\nb")
    assert e.message == "a\\nb" and isinstance(e.exit_code, int)


def test_error_message_can_be_set_and_is_escaped() -> None:
    e = errors.SetupError("http 500")
    e.message = "server said \x1b[31mno"
    assert e.message == "server said \\x1b[31mno"
    assert errors.error_line(e) == "kvscope: server said \\x1b[31mno"
    assert errors.error_line(ValueError("x" * 5000)).endswith("... (5000 characters)")
