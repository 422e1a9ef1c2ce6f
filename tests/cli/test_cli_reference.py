"""docs/cli.md is what the parser says: every command, its options and its exit codes."""

from __future__ import annotations

from pathlib import Path

from kvscope.core.cli.reference import exit_codes_text, full_parser, render, subcommands

DOC = Path(__file__).parent.parent.parent / "docs" / "cli.md"


def test_docs_cli_md_matches_the_parser() -> None:
    want = render(full_parser())
    assert DOC.read_text() == want, "docs/cli.md is out of date: python -m kvscope.core.cli.reference > docs/cli.md"


def test_every_command_and_option_is_documented_with_its_exit_codes() -> None:
    text = render(full_parser())
    for name, p in subcommands(full_parser()).items():
        section = text.split(f"\n## kvscope {name}\n", 1)[1].split("\n## ", 1)[0]
        for a in p._actions:
            for flag in a.option_strings:
                if flag not in ("-h", "--help") and a.help != "==SUPPRESS==":
                    assert f"`{flag}`" in section, (name, flag)
        assert "**Exit codes**: as above." not in section, f"{name}: its module documents no exit codes"
        assert " 2 " in section.split("**Exit codes**", 1)[1], name


def test_exit_codes_come_from_the_module_docstring() -> None:
    assert exit_codes_text("kvscope.core.cli.diff_command", None).startswith(": 0 identical, 1 different, 2 ")
    assert exit_codes_text(None, "exit status: 0 fine, 2 not") == ": 0 fine, 2 not"
    assert exit_codes_text(None, None) == ""
