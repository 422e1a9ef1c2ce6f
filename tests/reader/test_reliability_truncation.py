"""Item 1 of issue 12: a file that changes while it is read is reported, never a SIGBUS.

kvscope reads file bytes with bounded ``pread`` (``ByteSource``, the memory core's ``FileReader``,
the GGUF scanner), never through a memory map: a file cut short under the reader gives
``FileChangedError`` ("the file changed while it was read"), and a change seen by the identity
check (size, mtime, inode, device) after a pass does too. The CLI prints
``kvscope: FILE: the file changed while it was read`` and exits 2.

The concurrent test runs the real ``kvscope inspect --stats`` and ``kvscope diff`` on a 64 MiB
state while another process keeps cutting it to half its size and growing it back: every run
must end with exit 0, 1 or 2 (2 with exactly that line), never with a signal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.diff import diff_states
from kvscope.core.analysis.record_values import layer_matrix
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import CHANGED_MESSAGE, ByteSource, FileChangedError, FileIdentity
from tests.support.bigstate import run_kvscope, write_seq_state

pytestmark = pytest.mark.slow  # every truncation point of real files

SEQ = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"

# Cuts the file to half its size and grows it back (a hole of zeros) until killed.
_TOGGLER = """
import os, sys, time
path, full = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
while True:
    os.truncate(path, full // 2)
    time.sleep(0.002)
    os.truncate(path, full)
    time.sleep(0.003)
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trunc") / "big.seqstate"
    size = write_seq_state(path, cells=4096, n_layer=4, n_embd=1024)
    assert 60 << 20 < size < 70 << 20
    return path


def test_short_read_raises_file_changed(tmp_path: Path) -> None:
    path = tmp_path / "s.seqstate"
    shutil.copyfile(SEQ, path)
    src = ByteSource.open(path)
    assert src.is_file and not src.changed() and src.identity == FileIdentity.of_path(path)
    size = src.size
    os.truncate(path, 100)
    assert src.changed()
    with pytest.raises(FileChangedError) as info:
        src.raw(size - 64, 16)  # inside the size it had when opened: a short read
    assert str(info.value) == CHANGED_MESSAGE
    with pytest.raises(FileChangedError):
        src.check()
    buf = np.empty(64, np.uint8)
    with pytest.raises(FileChangedError):
        src.readinto(size - 64, buf)
    assert src.u32(size + 4) is None  # past the size it had: absent, as before
    src.close()


def test_identity_change_after_a_pass(tmp_path: Path) -> None:
    path = tmp_path / "s.seqstate"
    shutil.copyfile(SEQ, path)
    src = ByteSource.open(path)
    res = read_state(src)
    src.check()  # nothing changed: no error
    scan_stats(res, data=src)
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    os.utime(path, ns=(time.time_ns(), time.time_ns()))
    path.write_bytes(bytes(blob))  # rewritten in place, same size
    with pytest.raises(FileChangedError):
        scan_stats(res, data=src)
    rec = res.layer_records()[0][1]
    with pytest.raises(FileChangedError):
        layer_matrix(res, rec, data=src)
    with pytest.raises(FileChangedError):
        diff_states(res, res, src, src)
    src.close()


def test_replaced_file_is_a_change(tmp_path: Path) -> None:
    path = tmp_path / "s.seqstate"
    shutil.copyfile(SEQ, path)
    src = ByteSource.open(path)
    other = tmp_path / "new"
    shutil.copyfile(SEQ, other)
    os.replace(other, path)  # same bytes, another inode: what the path names is not what was read
    assert src.changed()
    src.close()
    # a result whose file no longer has its size is not scanned against the new bytes
    res = read_state(SEQ)
    cut = tmp_path / "cut.seqstate"
    shutil.copyfile(SEQ, cut)
    res.path = str(cut)
    os.truncate(cut, res.size // 2)
    with pytest.raises(FileChangedError):
        scan_stats(res)


def test_memory_core_file_reader_does_not_fault(tmp_path: Path) -> None:
    """The memory core's FileReader preads tensor rows: a file cut after it was sized raises."""
    code = f"""
import os, torch, numpy as np
from kvscope.core.memory.io import FileReader
from kvscope.core.memory.tensors import TensorStore
from kvscope.core.reader.source import FileChangedError
path = {str(tmp_path / "rows.bin")!r}
with open(path, "wb") as fh:
    fh.write(os.urandom(8 << 20))
fh = open(path, "rb")
r = FileReader(fh)
os.truncate(path, 4096)
t = torch.zeros(8 << 20, dtype=torch.uint8)
try:
    r.read_tensor(TensorStore("cpu"), t, 0, 1 << 20, 8)
except FileChangedError:
    print("changed")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "changed"


def _run_while_toggling(path: Path, argv: list[str], runs: int) -> list[tuple[int, str]]:
    full = path.stat().st_size
    tog = subprocess.Popen([sys.executable, "-c", _TOGGLER, str(path), str(full)], stdout=subprocess.PIPE,
                           text=True)
    try:
        assert tog.stdout is not None and tog.stdout.readline().strip() == "ready"
        out = []
        for _ in range(runs):
            r = run_kvscope(*argv, timeout=120)
            out.append((r.rc, r.err))
        return out
    finally:
        tog.kill()
        tog.wait()
        assert tog.stdout is not None
        tog.stdout.close()
        os.truncate(path, full)


def _check_runs(results: list[tuple[int, str]], path: str) -> None:
    for rc, err in results:
        assert rc in (0, 1, 2), f"exit {rc} (a negative status is a signal): {err[-500:]}"
        if rc == 2:
            assert err.strip() == f"kvscope: {path}: {CHANGED_MESSAGE}", err
    assert any(rc == 2 for rc, _ in results), "the truncation window was never hit"


def test_inspect_stats_while_the_file_is_cut(big: Path, tmp_path: Path) -> None:
    path = tmp_path / "live.seqstate"
    shutil.copyfile(big, path)
    _check_runs(_run_while_toggling(path, ["inspect", "--stats", str(path)], 12), str(path))
    _check_runs(_run_while_toggling(path, ["inspect", "--json", "--stats", str(path)], 6), str(path))


def test_diff_while_the_file_is_cut(big: Path, tmp_path: Path) -> None:
    path = tmp_path / "live.seqstate"
    shutil.copyfile(big, path)
    _check_runs(_run_while_toggling(path, ["diff", str(big), str(path)], 10), str(path))


def test_clean_run_is_unaffected(big: Path) -> None:
    r = run_kvscope("inspect", "--stats", str(big))
    assert r.rc == 0, r.err
    r = run_kvscope("diff", str(big), str(big))
    assert r.rc == 0 and "identical" in r.out, r.err


def test_special_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run_kvscope("inspect", str(fifo), timeout=60)  # a blocking open would hang here
    assert r.rc == 2 and r.err.strip() == f"kvscope: {fifo}: not a regular file"
    with pytest.raises(ValueError, match="not a regular file"):
        ByteSource.open(fifo)
