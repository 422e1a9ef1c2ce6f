"""A ``--server-bin`` whose ``--help`` never returns is refused within ``--timeout``, and nothing is left running.

Issue #31 item 17: kvscope asked ``--server-bin --help`` with a fixed 30 s limit (``--timeout`` ignored),
ended in an internal error, and left the process (and what it started) running. The probe now runs in
its own process group, is given ``--timeout`` seconds, and on expiry the group is killed and the
command says so in one line, exit 2.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kvharness.fixtures import DATA, model_path
from kvharness.proc_runs import CHILD
from kvscope.core.engine.server import ServerSetupError, server_flags

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"


def _hanging_server(tmp_path: Path, marker: str) -> Path:
    """A 'llama-server' whose --help starts a child and sleeps for ever (both carry ``marker`` in their environment)."""
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\nexport KVSCOPE_PROBE_MARK={marker}\nsleep 1000 &\nexec sleep 1001\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _running(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("KVSCOPE_PROBE_MARK") == marker and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_server_flags_gives_up_after_its_timeout_and_kills_the_group(tmp_path: Path) -> None:
    marker = f"kvscope-probe-{os.getpid()}-a"
    script = _hanging_server(tmp_path, marker)
    t0 = time.monotonic()
    with pytest.raises(ServerSetupError) as e:
        server_flags(script, 1.5)
    assert time.monotonic() - t0 < 10
    assert "--help gave no answer within 1.5 s" in e.value.message and "\n" not in e.value.message
    assert _running(marker) == []


@pytest.mark.slow  # waits out a timeout
def test_verify_with_a_hanging_server_bin_is_refused_within_timeout(tmp_path: Path) -> None:
    marker = f"kvscope-probe-{os.getpid()}-b"
    script = _hanging_server(tmp_path, marker)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CHILD, "verify", str(SLOT), "--model", str(model_path("llama")),
                        "--engine", "server", "--server-bin", str(script), "--timeout", "3"],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    try:
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("kvscope: "), r.stderr
        assert "--help gave no answer within 3 s" in r.stderr and "internal error" not in r.stderr
        assert took < 25, took  # the 3 s probe, the imports and the parse; was a fixed 30 s
        time.sleep(0.5)
        assert _running(marker) == []
    finally:
        for pid in _running(marker):
            os.kill(pid, 9)
