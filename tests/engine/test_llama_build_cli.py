"""`kvscope llama-build`: listed among the commands, lists the pinned builds, refuses unknown ones."""

from __future__ import annotations

import pytest

from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild


def test_list_shows_both_pinned_builds(builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llama-build", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == ["0c1e5709", "b11434"]
    for ln, (name, have) in zip(lines, sorted(builds.items()), strict=True):
        assert f"writes {have.build.writes}" in ln and f"cached at {have.path}" in ln, (name, ln)


def test_an_existing_build_is_reused(builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llama-build", "--build", "b11434"]) == 0
    assert capsys.readouterr().out == f"b11434\t{builds['b11434'].path}\n"


def test_unknown_build_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llama-build", "--build", "b1"]) == 2
    err = capsys.readouterr().err
    assert err == "kvscope: llama-build: unknown llama.cpp build 'b1' (known: 0c1e5709, b11434)\n"


def test_help_lists_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "llama-build" in capsys.readouterr().out
