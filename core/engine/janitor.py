"""A watcher process that cleans up after kvscope however kvscope ends (SIGTERM, SIGHUP, SIGKILL included).

kvscope starts processes (llama-server, the libllama child) and makes files (their temporary
folders, the copies it puts in a user's slot folder). ``close()`` and garbage collection remove
them, but a process killed by a signal runs neither. :func:`janitor` starts, once per kvscope
process, ``python -m kvscope.core.engine.janitor`` in its own session (a terminal's hang-up or
Ctrl-C does not reach it) and tells it, one JSON line each on a pipe, what to clean: a process
group to stop, a folder to remove, a file pattern in a folder to delete. When kvscope is done with
something it says so (``forget``). When the pipe closes, which the kernel does for a process that
dies of any signal, the janitor stops the remaining process groups (SIGTERM, SIGKILL after 5 s),
removes the folders and the matching files, and exits. A process group is stopped only while its
leader is still the process that was registered (its start time in ``/proc`` is compared), so a
reused process id is never signalled. Stdlib only; nothing happens where the janitor cannot start.

``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the child ends, and the
app starts engines from worker threads.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import IO, Any

_STOP_S = 5.0


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, ``/proc/PID/stat`` field 22), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        return int(text.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class Janitor:
    """The parent's side: the pipe to the watcher. Every method is safe to call when the watcher is gone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = os.getpid()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kvscope.core.engine.janitor"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
            self._pipe = self._proc.stdin
        except OSError:
            self._proc = None
        else:
            atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """A normal exit: close the pipe (the watcher cleans what is still registered and exits) and reap it."""
        if self._proc is None or os.getpid() != self._owner:
            return
        with self._lock:
            pipe, self._pipe = self._pipe, None
        with contextlib.suppress(OSError, ValueError):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(_STOP_S + 5)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _send(self, **msg: Any) -> None:
        with self._lock:
            if self._pipe is None or os.getpid() != self._owner:
                return
            try:
                self._pipe.write((json.dumps(msg) + "\n").encode())
                self._pipe.flush()
            except (OSError, ValueError):
                self._pipe = None

    def watch_group(self, pid: int) -> None:
        """Stop the process group led by ``pid`` (a child started with ``start_new_session``) if kvscope dies."""
        self._send(op="group", pid=pid, start=start_time(pid))

    def watch_dir(self, path: str) -> None:
        self._send(op="dir", path=os.path.abspath(path))

    def watch_files(self, folder: str, pattern: str) -> None:
        """Delete the files of ``folder`` whose names match ``pattern`` (``fnmatch``) if kvscope dies."""
        self._send(op="files", path=os.path.abspath(folder), pattern=pattern)

    def forget(self, op: str, key: str | int) -> None:
        """Done with an entry (``group`` pid, ``dir`` path, ``files`` folder/pattern)."""
        if op == "dir":
            key = os.path.abspath(str(key))
        self._send(op="forget", what=op, key=key)

    def release(self, group: int, dirs: Iterable[str]) -> None:
        """An engine's end: its process group is done with (it exited) and its folders are removed."""
        self.forget("group", group)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
            self.forget("dir", d)


_janitor: Janitor | None = None
_janitor_lock = threading.Lock()


def janitor() -> Janitor:
    """This process's janitor (started on first use; again in a forked child)."""
    global _janitor
    with _janitor_lock:
        if _janitor is None or _janitor._owner != os.getpid():
            _janitor = Janitor()
        return _janitor


# --- the watcher ------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as fh:
        if fh.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _stop_group(pid: int, start: int | None) -> None:
    if start is not None and start_time(pid) != start:
        return  # the leader is gone (its id may be someone else's now)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)
    end = time.monotonic() + _STOP_S
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def clean(groups: dict[int, int | None], dirs: set[str], files: set[tuple[str, str]]) -> None:
    """Stop the groups, then remove the folders and the matching files."""
    for pid, start in groups.items():
        _stop_group(pid, start)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    for folder, pattern in files:
        with contextlib.suppress(OSError):
            for name in fnmatch.filter(os.listdir(folder), pattern):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.path.isdir(path) and not os.path.islink(path):
                        os.rmdir(path)
                    else:
                        os.unlink(path)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end stops us
    groups: dict[int, int | None] = {}
    dirs: set[str] = set()
    files: set[tuple[str, str]] = set()
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
            op = msg["op"]
            if op == "group":
                groups[int(msg["pid"])] = msg.get("start")
            elif op == "dir":
                dirs.add(str(msg["path"]))
            elif op == "files":
                files.add((str(msg["path"]), str(msg["pattern"])))
            elif op == "forget":
                what, key = msg["what"], msg["key"]
                if what == "group":
                    groups.pop(int(key), None)
                elif what == "dir":
                    dirs.discard(str(key))
                elif what == "files":
                    files.difference_update({f for f in files if f"{f[0]}/{f[1]}" == key})
        except (ValueError, KeyError, TypeError):
            continue
    clean(groups, dirs, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
