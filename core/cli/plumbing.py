"""The command line's plumbing, one copy for every subcommand.

* the exit codes (:data:`EXIT_OK` 0, :data:`EXIT_FINDINGS` 1, :data:`EXIT_BAD_INPUT` 2,
  :data:`EXIT_INTERRUPTED` 130) and the message prefix ``kvscope: `` (from :mod:`kvscope.core.errors`);
* :func:`parse_pairs`, the ``KEY=VALUE`` parser of repeatable options;
* :class:`OneLineParser`: argparse whose usage errors are one line (``kvscope: inspect: the following
  arguments are required: file (see kvscope inspect --help)``), exit 2;
* :func:`run_command`: runs a subcommand and flushes its standard output; a
  :class:`~kvscope.core.errors.KvscopeError` becomes its one-line message and its exit code; an output that
  cannot be written (``> /dev/full``: ENOSPC) one line and exit 2; any other exception is an internal error
  (:func:`internal_error`): one line naming a file that holds the traceback, exit 3
  (:data:`~kvscope.core.errors.EXIT_INTERNAL`), never exit 1, which a script reads as findings.

The subcommand front-ends below this layer (``kvscope.core.cli.lab_command``, ``kvscope.core.cli.verify_command``...)
raise the errors and use the exit codes of :mod:`kvscope.core.errors` directly.
"""

from __future__ import annotations

import argparse
import errno
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from kvscope.core.engine.cli_options import parse_pairs
from kvscope.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PREFIX,
    KvscopeError,
    error_line,
)
from kvscope.core.textsafe import safe_text

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["EXIT_BAD_INPUT", "EXIT_FINDINGS", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "PREFIX",
           "OneLineParser", "fail", "flush_stdout", "internal_error", "parse_pairs", "run_command"]

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
        """``kvscope: inspect: MESSAGE (see kvscope inspect --help)``; the top parser's own errors (an unknown
        option after any command, an unknown command) name no command: ``kvscope: MESSAGE (see kvscope --help)``,
        not ``kvscope: kvscope: ...``."""
        _, _, command = self.prog.partition(" ")  # "kvscope inspect" -> "inspect"; "kvscope" -> ""
        print(error_line(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)"), file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """As argparse's, without swallowing the OSError of a full disk: ``--help > /dev/full`` fails (exit 2)."""
        if message:
            (file or sys.stderr).write(message)


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


# a write that failed because the output has no room or is gone: the output's fault, not kvscope's
_WRITE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EFBIG") if hasattr(errno, n))


def flush_stdout() -> None:
    """Flush standard output now, inside the handlers (left to the interpreter's exit, a failed flush prints
    ``Exception ignored ...`` and exits 120)."""
    if sys.stdout is not None:
        sys.stdout.flush()


def _output_failed(e: OSError) -> int:
    """``> /dev/full``: one line, exit 2; stdout is pointed at /dev/null so the final flush cannot fail again."""
    _quiet_stdout()
    return fail(f"cannot write the output: {(e.strerror or str(e)).lower()}", EXIT_BAD_INPUT)


def internal_error(e: BaseException, command: str | None = None) -> int:
    """An unexpected exception (a bug in kvscope): its traceback goes to a file (``$TMPDIR/kvscope-internal-
    error-PID-TIME.txt``), stderr gets one line that names it, the exit code is 3 (``KVSCOPE_DEBUG=1`` prints
    the traceback on stderr too)."""
    if debugging():
        traceback.print_exception(e)
    where = f" in kvscope {command}" if command else ""
    what = safe_text(" ".join(str(e).split()), 300)
    reason = f"{type(e).__name__}: {what}" if what else type(e).__name__
    try:
        report = _write_report(e, command)
        details = f"details in {report}"
    except OSError as oe:
        details = f"the details could not be written ({oe.strerror or oe}); {DEBUG_VARIABLE}=1 prints them"
    return fail(f"internal error{where}: {reason} \N{EM DASH} please report it; {details}", EXIT_INTERNAL)


def version() -> str:
    """kvscope's installed version (``unknown`` when it runs from a source tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def _write_report(e: BaseException, command: str | None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = os.path.join(tempfile.gettempdir(), f"kvscope-internal-error-{os.getpid()}-{stamp}.txt")
    text = (f"kvscope {version()} internal error{f' in kvscope {command}' if command else ''}\n"
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
            f"command line: {' '.join(safe_text(a, 1000) for a in sys.argv)}\n"
            f"python {platform.python_version()} on {platform.platform()}\n\n"
            + "".join(traceback.format_exception(e)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
        fh.write(text)
    return path


def run_command(func: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """``func(args)`` as a process exit code; every failure is one line on stderr."""
    try:
        code = int(func(args))
        flush_stdout()
        return code
    except KvscopeError as e:
        return fail(e)
    except BrokenPipeError:  # the reader stopped reading (``| head``): not a failure
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except MemoryError:
        return fail("out of memory")
    except OSError as e:
        if e.errno in _WRITE_ERRNOS and e.filename is None:  # a stream's write (stdout), not a file kvscope opened
            return _output_failed(e)
        return internal_error(e, getattr(args, "command", None))
    except Exception as e:
        return internal_error(e, getattr(args, "command", None))
