"""A signal the user ignores (``nohup``: SIGHUP at SIG_IGN) does not stop a scan: kvscope keeps the
disposition it inherited (``core/stopsignals.py``), and the harness that sends signals to kvscope children
resets theirs first (``kvharness.proc_runs.CHILD``), so a test or fuzz run under nohup still tests them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from kvharness.fixtures import DATA
from kvharness.fleet_tree import write_slow_state
from kvharness.proc_runs import CHILD

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
NOHUP_CHILD = ("import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
               "from kvscope.core.cli.main import main; sys.exit(main(sys.argv[1:]))")


def _scan_with_a_hup(code: str, root: Path) -> tuple[int, list[str]]:
    p = subprocess.Popen([sys.executable, "-c", code, "scan", str(root), "--json", "--jobs", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))  # as nohup leaves it
    assert p.stdout is not None
    first = p.stdout.readline()  # a file is done: the scan runs
    p.send_signal(signal.SIGHUP)
    rest, _ = p.communicate(timeout=300)
    return p.returncode, [x for x in (first + rest).splitlines() if x.strip()]


def test_a_scan_run_under_nohup_goes_on_after_sighup(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.bin").write_bytes(SLOT.read_bytes())
    write_slow_state(root / "z-slow.bin", cells=300_000)
    rc, lines = _scan_with_a_hup(NOHUP_CHILD, root)
    assert rc in (0, 1), lines
    paths = {json.loads(x).get("path", "") for x in lines if x.startswith("{")}
    assert any(p.endswith("z-slow.bin") for p in paths), lines  # the slow file was scanned to its end


def test_the_harness_child_is_stopped_by_sighup_even_under_nohup(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.bin").write_bytes(SLOT.read_bytes())
    write_slow_state(root / "z-slow.bin", cells=300_000)
    rc, _ = _scan_with_a_hup(CHILD, root)
    assert rc == 128 + signal.SIGHUP
