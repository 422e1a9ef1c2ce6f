"""SIGTERM and SIGHUP end a command as Ctrl-C would: by unwinding, so nothing is left behind.

Python's default for SIGTERM and SIGHUP kills the process at once: no ``finally``, no ``atexit``, so
a fleet command's worker processes, its Dask cluster and scratch space, multiprocessing's ``pymp-*``
folder and its semaphores, or ``llama-build``'s cmake, compilers and ``.building-*`` folder, were all
left behind. :func:`stopped_by_signals` turns either signal
into :class:`Stopped` (raised in the main thread, where the command runs); the command's context
managers then close the executor and remove their temporary folders, and the command exits with
``128 + signal`` (:func:`exit_status`), as a shell reports a process the signal killed. A second
signal while that cleanup runs is ignored, Ctrl-C included. Used by ``scan``/``migrate`` and
``llama-build`` (a leaf module, so every layer may). Off the main thread (where signals cannot be caught)
nothing changes.

:func:`deferred` holds SIGINT, SIGTERM and SIGHUP over a block that must not be cut in two (a Dask
``LocalCluster`` interrupted inside its constructor cannot be closed: it is never returned, and
its worker processes and scratch space outlive the run): a signal that comes meanwhile is noted
and raised again as the block ends, where what it built can be cleaned up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class Stopped(BaseException):
    """The command got SIGTERM or SIGHUP (a BaseException, like KeyboardInterrupt: no ``except Exception`` eats it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def exit_status(e: Stopped) -> int:
    """The exit status of a command stopped by ``e``'s signal: 128 + its number."""
    return 128 + e.signum


def _raise(signum: int, frame: FrameType | None) -> None:
    for sig in (signal.SIGINT, *SIGNALS):  # the cleanup that follows runs to its end
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP are noted, not acted on; as it ends, the first one
    noted is raised again (its own handler then runs: KeyboardInterrupt, :class:`Stopped`, or the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, *SIGNALS):
        handler = signal.getsignal(sig)
        if handler in (signal.SIG_IGN, None):
            continue
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        for sig, prev in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, prev)
        if noted:
            signal.raise_signal(noted[0])


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Stopped` (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # nohup: the user asked for the run to go on
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, prev in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
