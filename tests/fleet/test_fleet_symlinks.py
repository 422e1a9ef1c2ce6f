"""``kvscope migrate`` and ``scan`` with symbolic links in DEST and in SOURCE: nothing is written
through a link, nothing lands outside DEST, SOURCE never changes, and a link from SOURCE to DEST
never makes a run migrate its own outputs.

Every case runs the real command on a tree of real fixtures (:func:`kvharness.fleet_tree.build_tree`)
and checks SOURCE byte for byte (and its modes and mtimes) before and after.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvharness.fleet_tree import tree_digest
from kvscope.core.cli.main import main
from kvscope.core.fleet.source import MANIFEST_NAME

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"


def _source(root: Path, n: int = 6) -> list[str]:
    """``n`` real 2026-10 slot files in two folders; their relative paths."""
    rels = []
    for i in range(n):
        rel = f"{'ab'[i % 2]}/slot{i}.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SLOT, root / rel)
        rels.append(rel)
    return sorted(rels)


def _migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    rc = main(["migrate", *args, "--json", "--jobs", "2"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    docs = [json.loads(line) for line in captured.out.splitlines()]
    return rc, {d["rel"]: d for d in docs[:-1]}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_folder_in_dest_linked_into_source_is_not_written_through(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The data-loss case: ``ln -s SOURCE/a DEST/a``; the files of ``a`` must stay in SOURCE, unchanged."""
    root, dest = tmp_path / "root", tmp_path / "dest"
    rels = _source(root, 12)
    dest.mkdir()
    os.symlink(root / "a", dest / "a")
    before = tree_digest(root)
    rc, lines = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest))
    assert tree_digest(root) == before  # every source file still there, same bytes, modes and mtimes
    for rel in rels:
        r = lines[rel]
        if rel.startswith("a/"):
            assert r["action"] == "error" and "symbolic link" in r["reason"] and "dest/a" in r["reason"], r
        else:
            assert r["action"] == "migrated", r
    assert rc == 1
    assert os.readlink(dest / "a") == str(root / "a")  # the user's link is left as it is
    # a rerun changes nothing in SOURCE either, and does not call the written files done
    rc2, again = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest))
    assert tree_digest(root) == before and rc2 == 1
    assert {rel for rel, r in again.items() if r["action"] == "already"} == {r for r in rels if r.startswith("b/")}


def test_folder_in_dest_linked_elsewhere_gets_no_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, dest, elsewhere = tmp_path / "root", tmp_path / "dest", tmp_path / "elsewhere"
    _source(root)
    (dest / "b").mkdir(parents=True)
    elsewhere.mkdir()
    os.symlink(elsewhere, dest / "b" / "deeper")  # not on any output's path: harmless
    os.symlink(elsewhere, dest / "a")
    rc, lines = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest))
    assert rc == 1 and list(elsewhere.iterdir()) == []
    assert {r["action"] for rel, r in lines.items() if rel.startswith("a/")} == {"error"}
    assert {r["action"] for rel, r in lines.items() if rel.startswith("b/")} == {"migrated"}
    for p in dest.rglob("*"):  # every output is a real file in a real folder under DEST
        if p.is_file() and not p.is_symlink():
            assert os.path.realpath(p).startswith(str(dest.resolve()) + "/"), p


def test_output_name_that_is_a_link_is_replaced_not_followed(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A link in DEST where an output goes (to a SOURCE file, or outside) is replaced by the output;
    the file it pointed to is not touched, and the output's mode is not taken from it."""
    root, dest, outside = tmp_path / "root", tmp_path / "dest", tmp_path / "outside.bin"
    _source(root, 2)
    before = tree_digest(root)
    (dest / "a").mkdir(parents=True)
    (dest / "b").mkdir()
    os.symlink(root / "a" / "slot0.bin", dest / "a" / "slot0.bin")
    outside.write_bytes(b"not yours")
    outside.chmod(0o604)
    os.symlink(outside, dest / "b" / "slot1.bin")
    rc, lines = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest))
    assert rc == 0 and {r["action"] for r in lines.values()} == {"migrated"}
    assert tree_digest(root) == before and outside.read_bytes() == b"not yours"
    for rel in ("a/slot0.bin", "b/slot1.bin"):
        st = (dest / rel).lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 & ~_umask(), rel


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_source_link_to_dest_is_not_walked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``SOURCE/link -> DEST`` (or a folder in it): reported once as skipped, never migrated into DEST."""
    root, dest = tmp_path / "root", tmp_path / "dest"
    rels = _source(root)
    dest.mkdir()
    os.symlink(dest, root / "link")
    (dest / "sub").mkdir()
    os.symlink(dest / "sub", root / "a" / "into-sub")
    before = tree_digest(root)
    for _ in range(3):  # before the fix each rerun migrated its outputs one level deeper
        rc, lines = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest))
        assert rc == 0 and set(lines) == set(rels) | {"link", "a/into-sub"}
        assert lines["link"]["action"] == lines["a/into-sub"]["action"] == "skipped"
        assert "DEST" in lines["link"]["reason"]
    assert tree_digest(root) == before
    assert _files(dest) == set(rels) | {MANIFEST_NAME}


def test_scan_reports_a_folder_once_through_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scan follows a symlinked folder once (DEST links are a migrate matter): the same files, one line each."""
    root = tmp_path / "root"
    rels = _source(root)
    os.symlink(root / "a", root / "b" / "again")
    assert main(["scan", str(root), "--json", "--jobs", "2"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(os.path.relpath(d["path"], root) for d in docs[:-1]) == rels
