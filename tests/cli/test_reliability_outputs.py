"""Item 7 of issue 12: no leftovers, and the permissions a plain write would give.

An interrupted or killed write used to leave its hidden temporary file beside the destination
(and ``scan`` would read it as a state); outputs got ``mkstemp``'s 0600 even when they replaced a
0644 file. Now SIGTERM/SIGINT/SIGHUP remove the temporary files of a write in progress, every
temporary name starts with ``TEMP_PREFIX``, and an output gets ``0o666 & ~umask`` (or the mode of
the file it replaces).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.fsutil import (
    TEMP_PREFIX,
    atomic_writer,
    current_umask,
    is_temp_name,
    output_mode,
    temporary_folder,
    write_atomic,
)

# Starts an atomic write (streaming or a temporary folder), says so, then waits to be killed.
_WRITER = """
import signal, sys, time
# as started from a terminal: a job started in the background without job control (a CI runner's
# shell) inherits SIGINT ignored, and Python then leaves it ignored; one started under nohup inherits
# SIGHUP ignored (kvscope then leaves it ignored too, as it should)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from kvscope.core.fsutil import atomic_writer, temporary_folder
kind, dest = sys.argv[1], sys.argv[2]
if kind == "file":
    with atomic_writer(dest, "test") as fh:
        fh.write(b"x" * (1 << 20))
        fh.flush()
        print("writing", flush=True)
        while True:
            fh.write(b"y" * 4096)
            time.sleep(0.01)
else:
    with temporary_folder(dest, "test") as d:
        open(d + "/part", "wb").write(b"x" * 1000)
        print("writing", flush=True)
        while True:
            time.sleep(0.01)
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)



@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_new_file_mode_follows_umask(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        write_atomic(tmp_path / "a.txt", "hello")
        with atomic_writer(tmp_path / "b.bin") as fh:
            fh.write(b"\x00" * 10)
        plain = tmp_path / "plain.txt"
        with open(plain, "w") as fh2:
            fh2.write("x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.txt") == _mode(plain) == 0o666 & ~mask
    assert _mode(tmp_path / "b.bin") == 0o666 & ~mask
    assert (tmp_path / "a.txt").read_text() == "hello"


@pytest.mark.parametrize(("existing", "mask"), [(0o644, 0o077), (0o600, 0o022), (0o640, 0o002)])
def test_replacing_keeps_the_mode(tmp_path: Path, existing: int, mask: int) -> None:
    dest = tmp_path / "out.json"
    dest.write_text("old")
    dest.chmod(existing)
    old = os.umask(mask)
    try:
        assert output_mode(dest) == existing
        write_atomic(dest, "new")
    finally:
        os.umask(old)
    assert dest.read_text() == "new" and _mode(dest) == existing


def test_streaming_writer_and_failure_leave_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "big.bin"
    with atomic_writer(dest, "rewrite") as fh:
        names = os.listdir(tmp_path)
        assert len(names) == 1 and names[0].startswith(TEMP_PREFIX + "rewrite-") and is_temp_name(names[0])
        for i in range(64):
            fh.write(bytes([i]) * 65536)
    assert dest.stat().st_size == 64 * 65536 and os.listdir(tmp_path) == ["big.bin"]
    with pytest.raises(RuntimeError), atomic_writer(dest) as fh:
        fh.write(b"partial")
        raise RuntimeError("boom")
    assert os.listdir(tmp_path) == ["big.bin"] and dest.stat().st_size == 64 * 65536  # old content kept
    with pytest.raises(KeyboardInterrupt), atomic_writer(tmp_path / "c.bin") as fh:
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["big.bin"]


@pytest.mark.parametrize("kind", ["file", "folder"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_killed_mid_write_leaves_nothing(tmp_path: Path, kind: str, sig: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "result.bin" if kind == "file" else out
    p = subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(dest)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "writing"
        assert any(is_temp_name(n) for n in os.listdir(out))  # the temporary is there while it writes
        p.send_signal(sig)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.communicate()  # drain and close the pipes (no ResourceWarning)
    assert p.returncode != 0
    if sig != signal.SIGINT:  # SIGINT is Python's KeyboardInterrupt: a traceback and status 1
        assert p.returncode == -sig  # the process still dies of the signal
    assert os.listdir(out) == []


def test_temporary_folder_mode_and_cleanup(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with temporary_folder(tmp_path, "report.new") as d:
            assert is_temp_name(d) and os.path.basename(d).startswith(TEMP_PREFIX + "report.new-")
            assert _mode(Path(d)) == 0o755
            final = tmp_path / "report"
            os.rename(d, final)
    finally:
        os.umask(old)
    assert os.listdir(tmp_path) == ["report"]
    with pytest.raises(OSError), temporary_folder(tmp_path) as d:
        raise OSError("disk full")
    assert os.listdir(tmp_path) == ["report"]


def test_memory_core_save_file_is_atomic(tmp_path: Path) -> None:
    """The memory core's ``*_save_file`` streams through atomic_writer: the mode of a plain write."""
    from kvharness.fixtures import profile
    from kvscope.core.memory.context import MemoryContext

    ctx = MemoryContext.create(profile("llama"))
    dest = tmp_path / "s.seqstate"
    old = os.umask(0o022)
    try:
        n = ctx.seq_save_file(dest, 0, [])
    finally:
        os.umask(old)
    assert dest.stat().st_size == n and _mode(dest) == 0o644 and os.listdir(tmp_path) == ["s.seqstate"]


def test_rewrite_output_mode(tmp_path: Path) -> None:
    """``kvscope rewrite`` replaces a 0644 output with a 0644 output, leaving no temporary file."""
    src = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
    dest = tmp_path / "out.seqstate"
    dest.write_bytes(b"old")
    dest.chmod(0o644)
    model = DATA / "llamacpp-2026-10-01" / "tiny-llama.gguf"
    p = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "rewrite", str(src), "-o", str(dest),
                        "--model", str(model)], capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    assert _mode(dest) == 0o644 and dest.read_bytes() == src.read_bytes()
    assert os.listdir(tmp_path) == ["out.seqstate"]


def test_rewrite_escapes_its_output_name_on_stdout(tmp_path: Path) -> None:
    """The line naming OUT escapes a name's control and bidi characters, as the error lines do."""
    src = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
    dest = tmp_path / "out\x1b[31m\u202e.seqstate"
    p = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "rewrite", str(src), "-o", str(dest)],
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    assert dest.read_bytes() == src.read_bytes()
    assert "\x1b" not in p.stdout and "\u202e" not in p.stdout and "out\\x1b" in p.stdout, p.stdout


def test_a_signal_as_the_temporary_file_is_made_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cleanup of a SIGTERM landing right after the temporary file is created (before the old code
    registered it) removes that file: it is registered before it exists."""
    import kvscope.core.fsutil as fsutil

    real_open = os.open

    def open_then_signal(path: str, flags: int, mode: int = 0o777, *a: object, **k: object) -> int:
        fd = real_open(path, flags, mode, *a, **k)  # type: ignore[arg-type]
        if os.path.basename(path).startswith(TEMP_PREFIX):
            os.close(fd)
            fsutil.remove_temporaries()  # what the SIGTERM handler does first
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(os, "open", open_then_signal)
    with pytest.raises(KeyboardInterrupt), atomic_writer(tmp_path / "out.bin") as fh:
        fh.write(b"never")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
