"""SIGTERM, SIGHUP or Ctrl-C to ``kvscope llama-build`` while cmake runs stops cmake and its compilers and
leaves no ``.building-*`` folder.

Issue #31 item 13: SIGTERM killed kvscope at once; cmake, make and the compilers went on building into the
``.building-*`` folder, which stayed. Now cmake runs in a process group of its own, the signal unwinds
kvscope (``kvscope.core.stopsignals.Stopped``), the group is killed and the folder removed, and the command
exits 128 + signal (130 for SIGINT) with one line.

The run is real: ``kvscope llama-build`` as a child in its own session, with a fresh cache folder
(``KVSCOPE_LLAMA_CACHE``) so that it really unpacks the pinned sdist and starts cmake.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import psutil
import pytest

from kvharness.proc_runs import run_until
from kvscope.core.engine.builds import BUILDS, InstalledBuild

SDIST_BUILD = BUILDS[0]


def _processes_in(marker: str) -> list[psutil.Process]:
    """Live processes whose command line names ``marker`` (the cache folder: cmake, make, cc1plus, c++...)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in a for a in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_while_cmake_runs_leaves_no_process_and_no_folder(sig: int, builds: dict[str, InstalledBuild],
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = builds[SDIST_BUILD.name].path.parent / "sdist" / SDIST_BUILD.sdist
    assert sdist.is_file(), sdist
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(cache))
    marker = str(cache)

    def compiling() -> bool:  # cmake --build: make and the compilers at work (the configure step is done)
        return any(p.info["cmdline"][:2] == ["cmake", "--build"] for p in _processes_in(marker))

    t0 = time.monotonic()
    try:
        rc, _, err, _ = run_until(["llama-build", "--build", SDIST_BUILD.name, "--sdist", str(sdist)],
                                  tmp_path / "tmp", delay=0.0, sig=sig, when=compiling, wait=90.0)
        took = time.monotonic() - t0
        assert cache.exists() and (cache / "sdist").is_dir()  # it did begin
        end = time.monotonic() + 5
        while _processes_in(marker) and time.monotonic() < end:
            time.sleep(0.1)
        left = [" ".join(p.info["cmdline"] or [])[:120] for p in _processes_in(marker)]
        assert left == [], left
        assert sorted(p.name for p in cache.iterdir()) == sorted(["sdist", f".{SDIST_BUILD.key}.lock"])
        assert rc == 128 + sig, (rc, err)
        assert "Traceback" not in err
        assert err.splitlines()[-1] == f"kvscope llama-build: stopped by {signal.Signals(sig).name}", err
        assert took < 90, took
    finally:
        for p in _processes_in(marker):
            with contextlib.suppress(psutil.Error):
                p.kill()
