"""The smaller promises of scan and migrate (#20 item 12): a full disk names DEST's path, a chained
fsspec URL is read, a copy that replaces a link does not take its target's mode, and only DEST's own
manifest is left out of a walk.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.proc_runs import CHILD
from kvscope.core.cli.main import main
from kvscope.core.fleet.source import MANIFEST_NAME, open_source

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"


def _small_files_only() -> None:
    """In the child: files of at most 2 KiB (writing more fails EFBIG, as a full disk fails ENOSPC)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))


def test_full_disk_names_the_output_not_the_source(tmp_path: Path) -> None:
    root, dest = tmp_path / "root", tmp_path / "dest"
    (root / "a").mkdir(parents=True)
    shutil.copyfile(SLOT, root / "a" / "slot.bin")  # 5 KiB: its output cannot be written
    dest.mkdir()
    p = subprocess.run([sys.executable, "-c", CHILD, "migrate", str(root), "--layout", "v4", "--out", str(dest),
                        "--json", "--jobs", "1"], capture_output=True, text=True, timeout=300, check=False,
                       preexec_fn=_small_files_only)
    assert "Traceback" not in p.stderr, p.stderr
    r = json.loads(p.stdout.splitlines()[0])
    assert r["action"] == "error" and p.returncode == 1, r
    assert r["reason"].startswith(f"{dest}/a/slot.bin: "), r  # was: the source's path
    assert str(root) not in r["reason"]
    assert not [q for q in dest.rglob("*") if q.name != MANIFEST_NAME]


def test_chained_fsspec_url_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "slots.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(SLOT, "host0/slot0.bin")
        z.writestr("host0/notes.txt", "not a slot\n")
    url = f"zip://::file://{archive}"
    entries = list(open_source(url).walk())
    assert [e.rel for e in entries] == ["host0/notes.txt", "host0/slot0.bin"]
    assert main(["scan", url, "--json", "--jobs", "1"]) == 0
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {d["path"]: d["status"] for d in docs[:-1]} == {
        f"zip://host0/notes.txt::file://{archive}": "skipped", f"zip://host0/slot0.bin::file://{archive}": "parsed"}
    assert main(["scan", url, "--jobs", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("ok         host0/slot0.bin: seq_file")


def test_copy_replacing_a_link_gets_a_new_files_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """v4 files already load in v4: copied; the output where a link was is a new file, not its target's mode."""
    v4 = tmp_path / "v4"
    v4.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(SLOT, src / "slot.bin")
    assert main(["migrate", str(src), "--layout", "v4", "--out", str(v4), "--jobs", "1"]) == 0
    capsys.readouterr()
    dest, target = tmp_path / "dest", tmp_path / "target.bin"
    dest.mkdir()
    target.write_bytes(b"someone else's")
    target.chmod(0o600)
    os.symlink(target, dest / "slot.bin")
    assert main(["migrate", str(v4), "--layout", "v4", "--out", str(dest), "--json", "--jobs", "1"]) == 0
    r = json.loads(capsys.readouterr().out.splitlines()[0])
    assert r["action"] == "copied", r
    st = (dest / "slot.bin").lstat()
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 & ~mask  # was 0o600, the target's
    assert target.read_bytes() == b"someone else's" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_manifest_name_is_left_out_at_the_top_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    shutil.copyfile(SLOT, root / MANIFEST_NAME)  # DEST's own manifest, when DEST is scanned: left out
    shutil.copyfile(SLOT, root / "sub" / MANIFEST_NAME)  # a user's file of that name, deeper: scanned
    assert [e.rel for e in open_source(str(root)).walk()] == [f"sub/{MANIFEST_NAME}"]
