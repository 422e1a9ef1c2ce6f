"""Helpers of the fleet tests: a slot store of real fixtures, a slow real-format state, a worker killer.

``build_tree`` copies real llama.cpp fixtures of every generation (and damaged lab files) into
nested folders, with junk beside them (text, random bytes, an empty file, a GGUF model), a
temporary file kvscope would leave if SIGKILLed, a hidden folder, symlinks that loop (to the
folder itself, to an ancestor), one to a folder outside the tree, a broken one, a symlinked file
and a FIFO. ``write_slow_state`` writes a current-layout sequence-state file with millions of
cells whose payload is a hole, so the reader takes a while on it while the disk holds little.
``Killer`` sends a signal, for real, to the child process that has a given file open.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import struct
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from kvharness.fixtures import DATA
from kvscope.core.fsutil import TEMP_PREFIX

SEQ_MAGIC = 0x67677371
F16 = 1

# (source under tests/data, destination under the tree)
TREE_FILES = (
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate", "slots/a/slot0.bin"),
    ("llamacpp-2026-10-01/llama-f16-fa0-unified1-seq1.seqstate", "slots/a/slot1.bin"),
    ("llamacpp-2026-10-01/llama-q8_0-fa1-unified0-seq0.seqstate", "slots/a/deep/er/slot2.bin"),
    ("llamacpp-2026-10-01/lfm2-f16-fa0-unified0-seq1.seqstate", "slots/b/lfm2.seqstate"),
    ("llamacpp-2026-10-01/gemma2-f16-fa0-unified0-swafull1-seq0.seqstate", "slots/b/gemma2.seqstate"),
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-seq2.seqdata.bin", "blobs/llama-seq2.seqdata.bin"),
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.session", "sessions/llama.session"),
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.state.bin", "sessions/llama.state.bin"),
    ("llamacpp-2026-08-16/llama-f16-fa0-unified0-seq1.seqstate", "old/2026-08/slot1.bin"),
    ("llamacpp-2026-04-26/llama-f16-fa0-unified0-seq0.seqstate", "old/2026-04/slot0.bin"),
    ("llamacpp-2025-08-14/llama-f16-fa0-unified0-seq2.seqstate", "old/2025-08/slot2.bin"),
    ("llamacpp-2025-05-08/llama-f16-fa0-seq0.seqstate", "old/2025-05/slot0.bin"),
    ("lab/llamacpp-2026-10-01/llama/fa0-unified1/seq_file_truncated_half.seqstate", "slots/damaged/cut.bin"),
    ("lab/llamacpp-2026-10-01/llama/fa0-unified1/cell_count_huge.seqdata.bin", "slots/damaged/huge.bin"),
    ("llamacpp-2026-10-01/tiny-mamba.gguf", "models/tiny-mamba.gguf"),
)
JUNK = ("notes/readme.txt", "notes/random.bin", "notes/empty", "slots/a/deep/er/odd.json")
SKIPPED_BY_WALK = (f"slots/a/{TEMP_PREFIX}rewrite-x", ".hidden/slot9.bin", "slots/link-file.bin",
                   "slots/fifo")


def build_tree(root: Path, outside: Path | None = None) -> list[str]:
    """Lay the slot store out under ``root``; the relative paths a scan must report, sorted."""
    for src, dst in TREE_FILES:
        p = root / dst
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / src, p)
    rng = np.random.default_rng(13)
    (root / "notes").mkdir()
    (root / "notes/readme.txt").write_text("slots of the staging fleet\n")
    (root / "notes/random.bin").write_bytes(rng.bytes(3000))
    (root / "notes/empty").write_bytes(b"")
    (root / "slots/a/deep/er/odd.json").write_text('{"not": "a slot"}\n')
    # never listed: kvscope's own temporary file, a hidden folder, a symlinked file, a FIFO
    (root / f"slots/a/{TEMP_PREFIX}rewrite-x").write_bytes((DATA / TREE_FILES[0][0]).read_bytes()[:100])
    (root / ".hidden").mkdir()
    shutil.copyfile(DATA / TREE_FILES[0][0], root / ".hidden/slot9.bin")
    os.symlink(root / "slots/a/slot0.bin", root / "slots/link-file.bin")
    os.mkfifo(root / "slots/fifo")
    # loops: the folder itself, an ancestor; a broken link
    os.symlink(".", root / "slots/a/self")
    os.symlink("../../..", root / "slots/a/deep/er/up")
    os.symlink(root / "does-not-exist", root / "slots/broken")
    listed = [dst for _, dst in TREE_FILES] + list(JUNK)
    if outside is not None:  # a folder outside the tree, linked twice: links leaving SOURCE are not
        outside.mkdir(parents=True, exist_ok=True)  # followed, each is one "skipped" line (#31 item 14)
        shutil.copyfile(DATA / "llamacpp-2026-10-01/llama-f16-fa1-unified0-seq2.seqstate", outside / "ext.bin")
        os.symlink(outside, root / "mounted")
        os.symlink(outside, root / "slots/mounted-again")
        listed += ["mounted", "slots/mounted-again"]
    return sorted(listed)


def write_slow_state(path: Path, cells: int = 2_000_000, n_embd: int = 32) -> Path:
    """A valid 2026-10 seq file (one sequence of ``cells`` cells, one F16 layer) with a sparse payload."""
    row = 2 * n_embd
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", SEQ_MAGIC, 3, cells) + (np.arange(cells, dtype=np.int32) % 32000).tobytes())
        meta = np.zeros((cells, 3), dtype=np.int32)
        meta[:, 0] = np.arange(cells)
        meta[:, 1] = 1
        fh.write(struct.pack("<II", 1, cells) + meta.tobytes())
        fh.write(struct.pack("<II", 0, 1))
        for _ in range(2):  # K, then V (not transposed): a record header, then a hole
            fh.write(struct.pack("<iQ", F16, row))
            fh.seek(cells * row, os.SEEK_CUR)
        fh.truncate(fh.tell())
    return path


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 (or the link target, or the kind) of everything under ``root``."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() + f":{st.st_mtime_ns}:{oct(st.st_mode)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "special"
    return out


class Killer(threading.Thread):
    """Send ``sig`` to each of the first ``times`` descendant processes of this one seen with ``path`` open."""

    def __init__(self, path: Path, sig: int = signal.SIGKILL, times: int = 1, timeout: float = 120.0,
                 delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.path = str(path.resolve())
        self.sig = sig
        self.times = times
        self.timeout = timeout
        self.delay = delay  # seconds between seeing the file open and the signal (if it is still open)
        self.victims: list[int] = []
        self._stop_event = threading.Event()

    @property
    def victim(self) -> int | None:
        return self.victims[0] if self.victims else None

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        me = psutil.Process()
        end = time.monotonic() + self.timeout
        while not self._stop_event.is_set() and time.monotonic() < end and len(self.victims) < self.times:
            for child in me.children(recursive=True):
                if child.pid in self.victims:
                    continue
                try:
                    if any(f.path == self.path for f in child.open_files()):
                        if self.delay:
                            time.sleep(self.delay)
                            if not any(f.path == self.path for f in child.open_files()):
                                continue
                        child.send_signal(self.sig)
                        self.victims.append(child.pid)
                        break
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            time.sleep(0.002)


class ServerKiller(threading.Thread):
    """Send ``sig`` to this process's multiprocessing fork server, ``times`` times: each time once a
    worker it forked has one of ``paths`` open (so files are in flight), the next time the new one's."""

    def __init__(self, paths: list[Path], sig: int = signal.SIGKILL, times: int = 1, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.paths = {str(p.resolve()) for p in paths}
        self.sig = sig
        self.times = times
        self.timeout = timeout
        self.victims: list[int] = []
        self.orphans: list[int] = []  # the workers each killed server had forked (no longer anyone's children)
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        import multiprocessing.forkserver as fs

        end = time.monotonic() + self.timeout
        while not self._stop_event.is_set() and time.monotonic() < end and len(self.victims) < self.times:
            time.sleep(0.005)
            pid = getattr(fs._forkserver, "_forkserver_pid", None)
            if pid is None or pid in self.victims:
                continue
            try:
                kids = psutil.Process(pid).children()
                if any(f.path in self.paths for c in kids for f in c.open_files()):
                    os.kill(pid, self.sig)
                    self.victims.append(pid)
                    self.orphans += [c.pid for c in kids]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError):
                continue
