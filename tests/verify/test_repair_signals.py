"""``kvscope repair`` stopped by SIGTERM or SIGHUP while it rebuilds leaves nothing in TMPDIR.

Issue #31 item 12: the signal killed kvscope at once and its ``kvscope-repair-*`` folder, with the
rebuilt state (``rebuilt.*``, a copy of the user's tokens' state), stayed in TMPDIR. The folder is now
an :func:`kvscope.core.fsutil.temporary_folder` (removed by fsutil's SIGTERM/SIGINT/SIGHUP cleanup),
so the run leaves no process of its session and an empty TMPDIR. Real engine: the pinned 0c1e5709.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kvharness.fixtures import model_path
from kvharness.proc_runs import kill_session, leftovers, run_until
from kvharness.states import drop_records, kv_records, write_states
from kvscope.core.engine.builds import InstalledBuild


def _rebuilt(tmp: Path) -> bool:
    return any(tmp.glob("*repair*/rebuilt*"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_while_repair_rebuilds_leaves_an_empty_tmpdir(sig: int, builds: dict[str, InstalledBuild],
                                                             tmp_path: Path) -> None:
    paths = write_states("0c1e5709", tmp_path / "states")
    k, _v = kv_records(paths["seq_file"])
    bad = drop_records(paths["seq_file"], tmp_path / "dropped.seqstate", [k[1]])
    out, tmp = tmp_path / "fixed.seqstate", tmp_path / "tmp"
    rc, _, err, sid = run_until(["repair", str(bad), "--model", str(model_path("llama")), "-o", str(out)],
                                tmp, delay=0.0, sig=sig, when=lambda: _rebuilt(tmp), wait=120.0)
    try:
        assert rc in (-sig, 128 + sig), (rc, err)  # stopped by the signal, not done first
        assert "Traceback" not in err and not out.exists()
        procs, names = leftovers(sid, tmp)
        assert procs == [] and names == [], (procs, names)
    finally:
        kill_session(sid)
