"""The one error hierarchy of kvscope, and the exit codes every command shares.

A failure the user must read (bad input, a usage error, a missing engine) is a :class:`KvscopeError`:
it carries the process ``exit_code`` and a one-line :attr:`~KvscopeError.message` (escaped: a file
name or a string from a file cannot split it or reorder it on screen; a value thousands of digits long,
echoed back, is cut to its start and its length: :func:`cut_long_values`). The command line prints
:func:`error_line` of it and exits with its code; the app shows the same message. The exception
classes of the other modules derive from these (keeping ``ValueError`` beside where callers catch
that), so one ``except KvscopeError`` catches every failure kvscope means to report.

Exit codes: :data:`EXIT_OK` 0; :data:`EXIT_FINDINGS` 1 (the command ran and found something: error
findings, a verdict other than ok, disagreements, files left unmigrated); :data:`EXIT_BAD_INPUT` 2
(unreadable or unusable input, a usage error, a missing engine, an output that cannot be written);
:data:`EXIT_INTERNAL` 3 (an internal error: a bug in kvscope, never a verdict on the input; the command line
writes its traceback to a file and names it); :data:`EXIT_INTERRUPTED` 130 (Ctrl-C).

:func:`path_kind` names what a path that should be a regular file is instead (a folder, a FIFO, a
device...), so that no message says "no such file" for something that exists.
"""

from __future__ import annotations

import os
import re

from kvscope.core.textsafe import file_kind, safe_text

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3  # a bug in kvscope: a script must not read it as findings (1) or bad input (2)
EXIT_INTERRUPTED = 130

PREFIX = "kvscope: "  # every line kvscope writes about a failure starts with it
MESSAGE_LIMIT = 2000  # characters of one message (a file can make a reason as long as it likes)


class KvscopeError(Exception):
    """A failure meant for the user: one line (:attr:`message`) and the process exit code."""

    exit_code: int = EXIT_BAD_INPUT
    _message: str | None = None

    @property
    def message(self) -> str:
        """The reason as one printable line (control and bidi characters escaped, long ones cut)."""
        text = self._message if self._message is not None else (str(self) or type(self).__name__)
        return safe_text(cut_long_values(without_class_names(text)), MESSAGE_LIMIT)

    @message.setter
    def message(self, text: str) -> None:  # subclasses that keep a message of their own (an HTTP error's)
        self._message = text


class UsageError(KvscopeError):
    """The command line asks for something that cannot be done (a bad option value, options that conflict)."""


class InputError(KvscopeError):
    """An input (a state file, a model, a folder) is missing, unreadable, special or not what it must be."""


class SetupError(KvscopeError):
    """What the command needs to run is missing (an engine, a build, an optional dependency)."""


class Cancelled(KvscopeError):
    """The user stopped the work."""

    exit_code = EXIT_INTERRUPTED


def error_line(error: BaseException | str) -> str:
    """``kvscope: REASON`` for an error or a message, one escaped line (no newline at the end)."""
    if isinstance(error, KvscopeError):
        return PREFIX + error.message
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    return PREFIX + safe_text(cut_long_values(text), MESSAGE_LIMIT)


# ``UnicodeEncodeError: `` or ``OverflowError: `` put before a reason by code that formatted an exception
_CLASS_NAME = re.compile(r"\b(?:[A-Z][A-Za-z0-9]*(?:Error|Exception)|KeyboardInterrupt|StopIteration): ")


def without_class_names(text: str) -> str:
    """``text`` without the Python exception class names put before a reason (``OverflowError: int too big``
    reads ``int too big``): a user's message says what is wrong, not which Python class said it. Only the
    messages of :class:`KvscopeError` lose them; an internal error's line keeps its class (it is a bug report)."""
    if "Error: " not in text and "Exception: " not in text and ": " not in text:
        return text
    return _CLASS_NAME.sub("", text)


VALUE_LIMIT = 256  # a run of letters and digits this long is a value echoed back (a file name has at most 255)
_LONG_VALUE = re.compile(rf"\w{{{VALUE_LIMIT},}}")


def cut_long_values(text: str) -> str:
    """``text`` with every run of letters and digits of :data:`VALUE_LIMIT` or more (a 100,000-digit number
    given as an option and echoed back) cut to its first 60 characters and its length."""
    if len(text) < VALUE_LIMIT:
        return text
    return _LONG_VALUE.sub(lambda m: f"{m.group(0)[:60]}... ({len(m.group(0))} characters)", text)


def path_kind(path: str | os.PathLike[str]) -> str:
    """Why ``path`` is not a regular file one could read, as words for a message: ``"no such file"``,
    ``"a folder, not a file"``, ``"a FIFO (named pipe), not a regular file"``, ``"a character device, not a
    regular file"``... (``"a regular file"`` when it is one; the reason ``stat`` gives when it cannot tell)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else "no such file"
    except OSError as e:
        return safe_text(e.strerror or "cannot be read").lower()
    except ValueError:  # a NUL byte in the name
        return "not a valid file name"
    what = file_kind(mode)
    if what == "a regular file":
        return what
    return f"{what}, not a file" if what == "a folder" else f"{what}, not a regular file"
