"""Progress of a long scan or migration on stderr: files done, rate, ETA (only on a terminal).

:class:`Progress` redraws one status line (``\\r``, erased at the end) at most every
:data:`INTERVAL` seconds. The total is found by a second, storage-free walk of SOURCE in a
background thread (:meth:`Source.count <kvscope.core.fleet.source.Source.count>`), so the ETA
appears once that walk is done, usually within the first seconds, while the scan itself never
waits for it. When stderr is not a terminal nothing is drawn and no counting walk runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

INTERVAL = 0.25


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def status_line(done: int, total: int | None, elapsed: float) -> str:
    """``1,234/100,000 files  512 files/s  ETA 3m13s`` (no ETA while the total is unknown)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    line = f"{done:,}" + (f"/{total:,}" if total is not None else "") + f" files  {rate:,.0f} files/s"
    if total is not None and rate > 0 and total >= done:
        line += f"  ETA {_duration((total - done) / rate)}"
    return line


class Progress:
    """The status line; ``count`` (run in a thread) gives the total, ``None`` to show no ETA."""

    def __init__(self, stream: TextIO, count: Callable[[], int] | None = None, verb: str = "") -> None:
        self.stream = stream
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self.verb = verb
        self.done = 0
        self.total: int | None = None
        self._start = time.monotonic()
        self._last = 0.0
        self._width = 0
        if self.enabled and count is not None:
            threading.Thread(target=self._count, args=(count,), daemon=True, name="kvscope-count").start()

    def _count(self, count: Callable[[], int]) -> None:
        try:
            self.total = count()
        except Exception:  # a listing error: the scan reports it, the progress line just has no ETA
            self.total = None

    def step(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last >= INTERVAL:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        text = (f"{self.verb} " if self.verb else "") + status_line(self.done, self.total, now - self._start)
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def clear(self) -> None:
        """Erase the status line (call before other output to the same terminal, and at the end)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
            self._last = 0.0
