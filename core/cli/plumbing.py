"""The command line's plumbing, one copy for every subcommand.

* the exit codes (:data:`EXIT_OK` 0, :data:`EXIT_FINDINGS` 1, :data:`EXIT_BAD_INPUT` 2,
  :data:`EXIT_INTERRUPTED` 130) and the message prefix ``kvscope: `` (from :mod:`kvscope.core.errors`);
* :func:`parse_pairs`, the ``KEY=VALUE`` parser of repeatable options;
* :class:`OneLineParser`: argparse whose usage errors are one line (``kvscope: inspect: the following
  arguments are required: file (see kvscope inspect --help)``), exit 2;
* :func:`run_command`: runs a subcommand; a :class:`~kvscope.core.errors.KvscopeError` becomes its
  one-line message and its exit code, any other exception one line and exit 1, without a traceback
  unless ``KVSCOPE_DEBUG=1``.

The subcommand front-ends below this layer (``kvscope.core.lab.lab_cli``, ``kvscope.core.verify.cli``...)
raise the errors and use the exit codes of :mod:`kvscope.core.errors` directly.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from kvscope.core.engine.cli_options import parse_pairs
from kvscope.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PREFIX,
    KvscopeError,
    error_line,
)

__all__ = ["EXIT_BAD_INPUT", "EXIT_FINDINGS", "EXIT_INTERRUPTED", "EXIT_OK", "PREFIX", "OneLineParser", "fail",
           "parse_pairs", "run_command"]

DEBUG_VARIABLE = "KVSCOPE_DEBUG"


def debugging() -> bool:
    """``KVSCOPE_DEBUG=1``: unexpected errors print their traceback too."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def fail(error: BaseException | str, code: int | None = None) -> int:
    """Print ``kvscope: REASON`` on stderr; returns ``code``, else the error's own exit code (2 for text)."""
    print(error_line(error), file=sys.stderr)
    if code is not None:
        return code
    return error.exit_code if isinstance(error, KvscopeError) else EXIT_BAD_INPUT


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit 2 (its subparsers alike)."""

    def error(self, message: str) -> NoReturn:
        print(error_line(f"{self.prog.removeprefix('kvscope ')}: {message} (see {self.prog} --help)"),
              file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def run_command(func: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """``func(args)`` as a process exit code; every failure is one line on stderr."""
    try:
        return int(func(args))
    except KvscopeError as e:
        return fail(e)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except MemoryError:
        return fail("out of memory")
    except Exception as e:
        if debugging():
            traceback.print_exc()
        where = f" in kvscope {args.command}" if getattr(args, "command", None) else ""
        hint = "" if debugging() else f" ({DEBUG_VARIABLE}=1 prints the traceback)"
        return fail(f"internal error{where}: {type(e).__name__}: {e}{hint}", EXIT_FINDINGS)
