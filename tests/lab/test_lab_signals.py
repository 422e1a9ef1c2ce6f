"""``kvscope lab --engine llama.cpp|server`` stopped by SIGTERM or SIGHUP leaves nothing behind.

Issue #31 item 12: the signal killed kvscope at once: its ``kvscope-lab-*`` folder (copies of the states it
restores) stayed in TMPDIR and, with a server the user runs (``--server URL --slot-dir DIR``), the
``kvscope-lab-*.bin`` files it had put in that server's slot folder stayed there. The folder is now an
:func:`kvscope.core.fsutil.temporary_folder` (removed on SIGTERM/SIGINT/SIGHUP, and by the janitor after
SIGKILL) and the slot folder's files are the janitor's to delete, as verify's are.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.proc_runs import kill_session, leftovers, run_until
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.lab.scenario import load_scenario

LAB = DATA / "lab/llamacpp-2026-10-01"
CASES = ["--corrupt", "cell_count_plus1", "--corrupt", "cell_count_minus1", "--corrupt", "cell_count_zero", "--as-is"]


def _lab_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("kvscope-lab-*"))


@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_during_a_libllama_lab_run_leaves_an_empty_tmpdir(sig: int, builds: dict[str, InstalledBuild],
                                                                 tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"

    def folder_made() -> bool:  # the run's folder for the states it restores through files
        return any(tmp.glob("*lab*"))

    rc, _, err, sid = run_until(["lab", "--context", str(LAB / "llama"), "--engine", "llama.cpp", *CASES],
                                tmp, delay=0.0, sig=sig, when=folder_made, wait=120.0)
    try:
        assert rc in (-sig, 128 + sig), (rc, err)
        assert "Traceback" not in err
        procs, names = leftovers(sid, tmp)
        assert procs == [] and names == [], (procs, names)
    finally:
        kill_session(sid)


def test_sigterm_with_a_users_server_leaves_nothing_in_its_slot_folder(builds: dict[str, InstalledBuild],
                                                                       tmp_path: Path) -> None:
    sc = load_scenario(LAB / "llama")
    slots, tmp = tmp_path / "slots", tmp_path / "tmp"
    srv = ServerProcess(sc.profile.path, build="0c1e5709", n_parallel=2, n_ctx=512, slot_dir=slots,
                        args=["--no-kv-unified", "-fa", "off", "-b", "256", "-ub", "256"])
    with srv:
        rc, _, err, sid = run_until(["lab", "--context", str(LAB / "llama"), "--engine", "server", "--server",
                                     srv.url, "--slot-dir", str(slots), *CASES],
                                    tmp, delay=0.0, sig=signal.SIGTERM, when=lambda: bool(_lab_files(slots)),
                                    wait=120.0)
        try:
            assert rc in (-signal.SIGTERM, 128 + signal.SIGTERM), (rc, err)
            procs, names = leftovers(sid, tmp)
            assert procs == [] and names == [], (procs, names)
            end = time.monotonic() + 30  # the janitor deletes them as kvscope dies
            while _lab_files(slots) and time.monotonic() < end:
                time.sleep(0.1)
            assert _lab_files(slots) == []
            assert srv.alive  # the user's server is the user's: left running
        finally:
            kill_session(sid)
