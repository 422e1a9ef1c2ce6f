"""A link inside SOURCE to a folder outside it (``/``, ``/proc/self``, an ancestor) is not followed.

Issue #31 item 14: a link to ``/`` inside a scanned tree made ``kvscope scan`` walk the whole machine
(188,907 lines in 120 s, never finished). The walk now reports such a link as one ``skipped`` line
(``link leaves SOURCE``) and lists SOURCE's own files only; links inside SOURCE are still followed once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from kvharness.fixtures import DATA
from kvharness.proc_runs import CHILD
from kvscope.core.fleet.source import open_source

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"


def _source(root: Path) -> list[str]:
    rels = ["a/slot0.bin", "a/deep/slot1.bin", "b/slot2.bin"]
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SLOT, root / rel)
    return rels


def test_scan_does_not_walk_links_to_root_or_proc(tmp_path: Path) -> None:
    root = tmp_path / "src"
    rels = _source(root)
    os.symlink("/", root / "a" / "to-root")
    os.symlink("/proc/self", root / "b" / "to-proc-self")
    os.symlink(tmp_path, root / "to-parent")  # an ancestor of SOURCE: the walk would come back in through it
    os.symlink(root / "a", root / "b" / "inside")  # inside SOURCE: followed once, as before (a/ is walked first)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CHILD, "scan", str(root), "--json", "--jobs", "2"],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert "Traceback" not in r.stderr, r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    lines = {os.path.relpath(d["path"], root): d for d in docs[:-1]}
    assert set(lines) == set(rels) | {"a/to-root", "b/to-proc-self", "to-parent"}, sorted(lines)[:20]
    for rel in ("a/to-root", "b/to-proc-self", "to-parent"):
        assert lines[rel]["status"] == "skipped" and lines[rel]["reason"].startswith("link leaves SOURCE"), lines[rel]
    assert all(lines[rel]["status"] == "parsed" for rel in rels)
    assert docs[-1]["summary"]["files"] == len(rels) + 3
    assert took < 60, took


def test_text_line_names_the_link(tmp_path: Path) -> None:
    root = tmp_path / "src"
    _source(root)
    os.symlink("/", root / "to-root")
    r = subprocess.run([sys.executable, "-c", CHILD, "scan", str(root), "--jobs", "1"],
                       capture_output=True, text=True, timeout=120)
    hits = [ln for ln in r.stdout.splitlines() if "to-root" in ln]
    assert len(hits) == 1 and "link leaves SOURCE (-> /)" in hits[0], r.stdout


def test_walk_of_a_link_loop_and_a_link_to_the_source_itself(tmp_path: Path) -> None:
    """Loops inside SOURCE are walked once and end (as before); nothing is reported twice."""
    root = tmp_path / "src"
    rels = _source(root)
    os.symlink(root, root / "a" / "loop")
    os.symlink("../..", root / "a" / "deep" / "up")
    entries = list(open_source(str(root)).walk())
    assert sorted(e.rel for e in entries) == sorted(rels)
