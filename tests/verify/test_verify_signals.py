"""``kvscope verify`` killed by a signal (SIGTERM, SIGHUP, SIGKILL, SIGINT) at a random point leaves nothing:
the llama-server or libllama child it started stops, its temporary folders go, and the copies it put in a
user's slot folder are deleted (the janitor process, ``core/engine/janitor``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvharness.fake_server import FakeServer
from kvharness.fixtures import MODELS, model_path
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL, signal.SIGINT]
WAIT_S = 180.0  # bound of every wait (a loaded machine; the calibration prefills precede the restore)


def _children(pid: int) -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out[int(entry)] = comm
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"not within {WAIT_S:g} s: {what}")
        time.sleep(0.05)


def _scratch(tmp: Path) -> list[str]:
    """The run's temporary folders and files in ``tmp`` (its TMPDIR)."""
    return [n for n in os.listdir(tmp) if n.startswith("kvscope-")]


def _kill(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0)
    proc.send_signal(sig)
    proc.wait(WAIT_S)


@contextmanager
def _verify(args: list[str], tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``kvscope verify ARGS`` with TMPDIR=tmp, killed and reaped on the way out if still running."""
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "kvscope.core.cli.main", "verify", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT_S)


def _killed_run(args: list[str], tmp: Path, sig: signal.Signals, child: str, what: str,
                ready: Callable[[], bool] = lambda: True, pause_s: float = 0.0) -> None:
    """Start verify, wait for its child process named ``child*`` (and ``ready``), pause, signal it; then
    the child must stop and ``tmp`` empty."""
    kids: dict[int, str] = {}
    with _verify(args, tmp) as proc:

        def started() -> bool:
            kids.update({p: c for p, c in _children(proc.pid).items() if c.startswith(child)})
            return bool(kids) and ready()

        _until(started, f"{what} started")
        time.sleep(pause_s)
        if proc.poll() is None:
            proc.send_signal(sig)
        proc.wait(WAIT_S)
    for pid in kids:
        _until(lambda pid=pid: not _running(pid), f"{what} {pid} stopped")  # type: ignore[misc]
    _until(lambda: not _scratch(tmp), f"{tmp} emptied")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_killed_run_stops_its_llama_server_and_removes_its_folders(sig: signal.Signals, seed: int,
                                                                    builds: dict[str, InstalledBuild],
                                                                    tmp_path: Path) -> None:
    pause_s = random.Random(seed).uniform(0.0, 0.5)  # some point of the run (it may have finished)
    _killed_run([str(SEQ), "--model", str(model_path("llama")), "--engine", "server"], tmp_path / "tmp", sig,
                "llama-server", "llama-server", pause_s=pause_s)


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_killed_run_stops_its_libllama_child_and_removes_its_folders(sig: signal.Signals,
                                                                      builds: dict[str, InstalledBuild],
                                                                      tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    # the child is up once its scratch folder and the input's copy are there
    _killed_run([str(SEQ), "--model", str(model_path("llama"))], tmp, sig, "python", "the engine child",
                ready=lambda: len(_scratch(tmp)) >= 2)


@pytest.fixture(scope="module")
def real(builds: dict[str, InstalledBuild]) -> Iterator[ServerProcess]:
    with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512) as srv:
        yield srv


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_killed_run_deletes_its_copies_in_a_users_slot_folder(sig: signal.Signals, real: ServerProcess,
                                                                tmp_path: Path) -> None:
    c = real.client()
    c.complete([1, 298, 303, 308], n_predict=0)
    c.slot_save(0, "mine.bin")
    slot = Path(real.slot_dir) / "mine.bin"
    with FakeServer(real.url, real.slot_dir) as fake:
        fake.fault("restore", "silent")  # the run waits there, its copy in the user's folder

        def copies() -> list[str]:
            return [n for n in os.listdir(real.slot_dir) if n.startswith("kvscope-verify-")]

        with _verify([str(slot), "--model", str(model_path("llama")), "--engine", "server", "--server", fake.url,
                      "--slot-dir", real.slot_dir], tmp_path / "tmp") as proc:
            _until(lambda: bool(copies()) and fake.hits == ["restore#1 silent"], "the copy in the slot folder")
            _kill(proc, sig)
        _until(lambda: not copies(), f"the copies in {real.slot_dir} deleted")
        assert slot.is_file()  # the user's own files stay
