"""Helpers for runs of a real ``kvscope`` child interrupted by a signal, and for what such a run leaves.

``run_until`` starts ``python -c CHILD ARGS`` in its own session with its own ``TMPDIR`` and sends
a signal after a number of its output lines or a delay; ``session_processes`` lists what of that
session still runs; ``leftovers`` waits (bounded) for the session and its TMPDIR to empty and says
what stayed; ``temporaries`` lists kvscope's ``.kvscope-tmp-*`` files under a folder. The fleet and
verify signal tests and ``bench/fuzz_fleet.py`` share them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

# kvscope's main() as a terminal runs it: SIGINT, SIGTERM and SIGHUP at their defaults first, since the
# harness itself may run under nohup or as a background job of a non-interactive shell, whose children
# inherit SIGHUP and SIGINT ignored (kvscope then rightly goes on: the signal cases would test nothing)
CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "[signal.signal(s, signal.SIG_DFL) for s in (signal.SIGTERM, signal.SIGHUP)]; "
         "from kvscope.core.cli.main import main; sys.exit(main(sys.argv[1:]))")
WAIT_S = 180.0


def session_processes(sid: int) -> list[int]:
    """Pids of the live (not zombie) processes of session ``sid``."""
    out = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except (OSError, psutil.Error):
            continue
    return out


def run_until(args: list[str], tmpdir: Path, lines: int | None = None, delay: float | None = None,
              sig: int | None = None, wait: float = WAIT_S, when: Callable[[], bool] | None = None
              ) -> tuple[int, str, str, int]:
    """Run the kvscope child with ``args``; send ``sig`` after ``lines`` lines of its stdout, ``delay``
    seconds, or as soon as ``when()`` holds (polled every 5 ms; whichever is given; at its end if it
    ends first). (status, stdout, stderr, session id)."""
    tmpdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmpdir))
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, start_new_session=True, text=True)
    assert p.stdout is not None and p.stderr is not None
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read() if p.stderr else ""), daemon=True)
    reader.start()
    out: list[str] = []
    if sig is not None and lines is not None:
        while len(out) < lines:
            line = p.stdout.readline()
            if not line:
                break
            out.append(line)
        if p.poll() is None:
            p.send_signal(sig)
    elif sig is not None and (delay is not None or when is not None):
        def fire() -> None:
            end = time.monotonic() + wait
            while when is not None and not when() and p.poll() is None and time.monotonic() < end:
                time.sleep(0.005)
            if p.poll() is None:
                p.send_signal(sig)

        timer = threading.Timer(delay or 0.0, fire)
        timer.start()
        out.append(p.stdout.read())
        timer.cancel()
    out.append(p.stdout.read())
    try:
        rc = p.wait(wait)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    reader.join(wait)
    p.stdout.close()
    p.stderr.close()
    return rc, "".join(out), "".join(err), p.pid


def leftovers(sid: int, tmpdir: Path, within: float = 30.0) -> tuple[list[int], list[str]]:
    """What session ``sid`` left once given ``within`` seconds to go: its processes, and the names in its TMPDIR."""
    end = time.monotonic() + within
    while True:
        procs = session_processes(sid)
        names = sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*")) if tmpdir.exists() else []
        if (not procs and not names) or time.monotonic() > end:
            return procs, names
        time.sleep(0.2)


def kill_session(sid: int) -> None:
    """SIGKILL whatever of session ``sid`` still runs."""
    for pid in session_processes(sid):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            continue


def temporaries(root: Path) -> list[str]:
    """kvscope's temporary outputs (``.kvscope-tmp-*``) under ``root``."""
    return sorted(str(p) for p in root.rglob(".kvscope-tmp-*")) if root.exists() else []
