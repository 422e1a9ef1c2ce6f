"""The CLI reference (``docs/cli.md``), written from the parser itself so it cannot drift from it.

Every subcommand with its one-line help, its arguments (argparse's own usage line, then one row per
argument: flags or name, value, default, choices, help) and its exit codes, taken from the paragraph
of the front-end module's docstring that says ``Exit codes`` (the module that registers the command:
:mod:`kvscope.core.cli.registry`). ``python -m kvscope.core.cli.reference > docs/cli.md`` rewrites the
file; tests/cli/test_cli_reference.py checks that it equals what the parser says now.
"""

from __future__ import annotations

import argparse
import re
import sys

from kvscope.core.cli.main import build_parser
from kvscope.core.cli.registry import core_commands, plugin_commands
from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK

_EXIT_RE = re.compile(r"\b(Exit codes|Exit status|exit status)\b")


def subcommands(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands, by name, in the order they were registered."""
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _helps(ap: argparse.ArgumentParser) -> dict[str, str]:
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {c.dest: c.help or "" for c in a._choices_actions}
    return {}


def exit_codes_text(module: str | None, epilog: str | None) -> str:
    """What a command documents about its exit codes: the first sentence of its front-end module's
    docstring that names them (from the words ``Exit codes`` on), else its parser's epilog, else ''."""
    mod = sys.modules.get(module or "")
    for par in re.split(r"\n\s*\n", (mod.__doc__ or "") if mod is not None else ""):
        m = _EXIT_RE.search(par)
        if m:
            text = " ".join(par[m.end():].split())
            end = re.search(r"\.(\s+[A-Z]|$)", text)
            return (text[: end.start() + 1] if end else text).replace("``", "`")
    if epilog and (m := _EXIT_RE.search(epilog)):
        return " ".join(epilog[m.end():].split())
    return ""


def _modules(ap: argparse.ArgumentParser) -> dict[str, str]:
    """Command -> the module that registers it (the core front-ends, else the module of its function)."""
    core = {name: fe.module for name, fe in core_commands().items()}
    return {name: core.get(name) or str(getattr(p.get_default("func"), "__module__", "") or "")
            for name, p in subcommands(ap).items()}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(a: argparse.Action) -> str:
    if a.nargs == 0:
        return ""
    if a.metavar is not None:
        return str(a.metavar)
    if a.choices is not None:
        return ""  # listed as "one of"
    return a.dest.upper() if a.option_strings else a.dest


def _row(a: argparse.Action) -> str:
    name = ", ".join(f"`{s}`" for s in a.option_strings) if a.option_strings else f"`{_value(a)}`"
    value = f"`{_value(a)}`" if a.option_strings and _value(a) else ""
    extra = []
    if a.required and a.option_strings:
        extra.append("required")
    if (a.nargs in ("*", "+") or isinstance(a, argparse._AppendAction)) and "repeatable" not in (a.help or ""):
        extra.append("repeatable" if a.option_strings else f"nargs {a.nargs}")
    if a.choices is not None:
        extra.append("one of " + ", ".join(f"`{c}`" for c in a.choices))
    if a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0:
        extra.append(f"default `{a.default}`")
    help_text = (a.help or "").replace("%%", "%")
    notes = f" ({'; '.join(extra)})" if extra else ""
    return f"| {name} | {value} | {_cell(help_text)}{_cell(notes)} |"


def _usage(p: argparse.ArgumentParser) -> str:
    text = p.format_usage().strip()
    return " ".join(text.removeprefix("usage:").split())


def render(ap: argparse.ArgumentParser) -> str:
    """The reference as Markdown."""
    helps = _helps(ap)
    lines = [
        "# kvscope command line reference",
        "",
        "Generated from the parser by `python -m kvscope.core.cli.reference > docs/cli.md`;",
        "`tests/cli/test_cli_reference.py` fails when it no longer matches the parser.",
        "",
        "## Exit codes",
        "",
        "Every command uses the same codes (`kvscope.core.errors`); each command's section says what they mean",
        "for it. A failure is always one line on stderr starting with `kvscope: `, never a traceback: an",
        "internal error (a bug in kvscope) exits 3, and its line names the file that holds the traceback",
        "(`KVSCOPE_DEBUG=1` prints it on stderr too).",
        "",
        "| code | meaning |",
        "| --- | --- |",
        f"| {EXIT_OK} | done, nothing to report |",
        f"| {EXIT_FINDINGS} | done, and something was found: error findings, a verdict other than ok, "
        "a file a newer llama.cpp wrote (`newer`), disagreements, files left unmigrated |",
        f"| {EXIT_BAD_INPUT} | bad input (missing, unreadable, special or not a state file), a usage error, "
        "a missing engine, or an output that cannot be written (a full disk) |",
        f"| {EXIT_INTERNAL} | internal error: a bug in kvscope, not a verdict on the input (please report it "
        "with the file the message names) |",
        f"| {EXIT_INTERRUPTED} | interrupted (Ctrl-C) |",
        "",
        "## Commands",
        "",
    ]
    cmds = subcommands(ap)
    modules = _modules(ap)
    lines += [f"- [`{name}`](#kvscope-{name}): {_cell(helps.get(name, ''))}" for name in cmds]
    for name, p in cmds.items():
        lines += ["", f"## kvscope {name}", "", _cell(helps.get(name, "")), "", "```", _usage(p), "```", ""]
        if p.description:
            lines += [" ".join(p.description.split()).replace("``", "`"), ""]
        rows = [a for a in p._actions if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS]
        if rows:
            lines += ["| argument | value | meaning |", "| --- | --- | --- |", *(_row(a) for a in rows), ""]
        codes = exit_codes_text(modules.get(name), p.epilog)
        sep = " " if codes.startswith("(") else ""
        lines.append(f"**Exit codes**{sep}{codes}" if codes else "**Exit codes**: as above.")
    return "\n".join(lines) + "\n"


def full_parser() -> argparse.ArgumentParser:
    """The parser with every command, the entry-point ones included."""
    return build_parser(plugin_commands(None))


if __name__ == "__main__":
    sys.stdout.write(render(full_parser()))
