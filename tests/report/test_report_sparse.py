"""``kvscope report`` of a big sparse file does not hash its holes (#20 item 14: 21-61 s for 20 GB).

Files above ``SHA256_MAX_BYTES`` get no sha256 (their size still names them); smaller ones keep theirs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from kvscope.core.cli.report_command import main
from kvscope.core.report.collect import SHA256_MAX_BYTES
from tests.support.report_paths import MODEL, NAN_FILE


def _overview(tmp_path: Path, f: Path) -> dict[str, object]:
    out = tmp_path / f"r-{f.name}"
    assert main([str(f), "--model", str(MODEL), "-o", str(out)]) == 1
    doc = json.loads((out / "report.json").read_text())
    return dict(doc["overview"])


def test_big_sparse_file_is_not_hashed(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    shutil.copy(NAN_FILE, big)
    with big.open("r+b") as fh:
        fh.truncate(SHA256_MAX_BYTES + 1)  # a hole: no disk used
    ov = _overview(tmp_path, big)
    assert ov["size"] == SHA256_MAX_BYTES + 1 and ov["sha256"] is None


def test_small_file_keeps_its_sha256(tmp_path: Path) -> None:
    small = tmp_path / "small.bin"
    shutil.copy(NAN_FILE, small)
    assert _overview(tmp_path, small)["sha256"] == hashlib.sha256(small.read_bytes()).hexdigest()
