"""A folder ``scan`` or ``migrate`` cannot list is reported as such (one line, exit 1), never skipped in silence.

The commands run in a child process; as root (which reads every folder) the child drops
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set first, so the permission failures
are the kernel's own.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvharness.proc_runs import CHILD

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def _no_permission_bypass() -> None:
    """In the child before exec: root keeps its uid but loses the capabilities that skip permission checks."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """``ok/slot.bin``; ``locked/`` (mode 0: not listed); ``nox/`` (mode 0444: listed, its names not
    statable), each holding a real slot file."""
    root = tmp_path / "root"
    for sub in ("ok", "locked", "nox"):
        (root / sub).mkdir(parents=True)
        shutil.copyfile(SLOT, root / sub / "slot.bin")
    (root / "locked").chmod(0)
    (root / "nox").chmod(0o444)
    try:
        yield root
    finally:
        for sub in ("locked", "nox"):
            (root / sub).chmod(0o755)


def _run(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    pre = _no_permission_bypass if os.geteuid() == 0 else None
    p = subprocess.run([sys.executable, "-c", CHILD, *args, "--json", "--jobs", "2"], capture_output=True,
                       text=True, timeout=300, check=False, preexec_fn=pre)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()], p.stderr


def test_scan_reports_unlisted_folders(tree: Path) -> None:
    rc, docs, err = _run("scan", str(tree))
    lines, summary = docs[:-1], docs[-1]["summary"]
    by = {os.path.relpath(d["path"], tree): d for d in lines}
    assert by["ok/slot.bin"]["status"] == "parsed", err
    assert by["locked"]["status"] == "unreadable" and "ermission" in by["locked"]["reason"]
    assert by["nox/slot.bin"]["status"] == "unreadable" and "ermission" in by["nox/slot.bin"]["reason"]
    assert set(by) == {"ok/slot.bin", "locked", "nox/slot.bin"}
    assert summary["status"] == {"parsed": 1, "unreadable": 2} and rc == 1


def test_migrate_reports_unlisted_folders(tree: Path) -> None:
    dest = tree.parent / "dest"
    dest.mkdir()
    rc, docs, err = _run("migrate", str(tree), "--layout", "v4", "--out", str(dest))
    lines, summary = {d["rel"]: d for d in docs[:-1]}, docs[-1]["summary"]
    assert lines["ok/slot.bin"]["action"] == "migrated", err
    assert lines["locked"]["action"] == lines["nox/slot.bin"]["action"] == "unreadable"
    assert "folder not listed" in lines["locked"]["reason"]
    assert summary["problems"] == 2 and rc == 1
    assert {p.name for p in dest.rglob("*")} == {"ok", "slot.bin", ".kvscope-migrate.jsonl"}
