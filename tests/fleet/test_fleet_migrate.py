"""``kvscope migrate``: real fixtures into 2026-10-v4, on the local executor and a real Dask LocalCluster.

SOURCE is hashed before and after every run (it must not change), migrated files are read back
as 2026-10-v4 with no error, a second run skips everything it wrote, and a run after an output
was deleted and a source changed redoes exactly those two.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvharness.fleet_tree import build_tree, tree_digest
from kvscope.core.cli.main import main
from kvscope.core.fleet.source import MANIFEST_NAME
from kvscope.core.reader.parse import read_state

pytestmark = pytest.mark.slow  # migrate over real stores

V3_FILES = ("blobs/llama-seq2.seqdata.bin", "sessions/llama.session", "sessions/llama.state.bin",
            "slots/a/slot0.bin", "slots/a/slot1.bin", "slots/b/gemma2.seqstate", "slots/b/lfm2.seqstate")
DAMAGED = ("slots/damaged/cut.bin", "slots/damaged/huge.bin")
JUNK = ("models/tiny-mamba.gguf", "notes/empty", "notes/random.bin", "notes/readme.txt", "slots/a/deep/er/odd.json",
        "mounted", "slots/mounted-again")  # the last two: links leaving SOURCE, not followed


def _migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    rc = main(["migrate", *args, "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    docs = [json.loads(line) for line in captured.out.splitlines()]
    lines = {d["rel"]: d for d in docs[:-1]}
    assert len(lines) == len(docs) - 1
    return rc, lines, docs[-1]["summary"]


def _is_v4(path: Path) -> bool:
    res = read_state(path)
    names = {res.layout.name, *res.layout.features.get("byte_identical_layouts", ())}
    return res.n_errors == 0 and "2026-10-v4" in names


def test_migrate_restartable_and_source_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, dest = tmp_path / "root", tmp_path / "dest"
    listed = build_tree(root, tmp_path / "outside")
    before = tree_digest(root)
    rc, lines, summary = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest), "--jobs", "2")
    assert tree_digest(root) == before
    assert sorted(lines) == listed
    assert rc == 1 and summary["problems"] == len([r for r in lines.values() if r["action"] in
                                                   ("cannot", "damaged", "unreadable", "error")])
    for rel in V3_FILES:
        r = lines[rel]
        assert r["action"] == "migrated" and r["layout_from"] == "2026-10" and r["method"] == "framing", r
        out = dest / rel
        assert _is_v4(out), rel
        assert r["output_sha256"] != r["source_sha256"] and r["output_size"] == out.stat().st_size
    assert all(lines[rel]["action"] == "damaged" for rel in DAMAGED)
    assert all(lines[rel]["action"] == "skipped" for rel in JUNK)
    assert lines["slots/a/deep/er/slot2.bin"]["action"] == "cannot"  # q8_0 rows: the model must tell the rotation
    written = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert written == set(V3_FILES) | {MANIFEST_NAME}
    assert not (dest / "old").exists()  # nothing written, so no folders left behind
    manifest = [json.loads(x) for x in (dest / MANIFEST_NAME).read_text().splitlines()]
    assert sorted(m["rel"] for m in manifest) == sorted(V3_FILES)

    # a second run: everything written before is skipped by its hashes; DEST does not change
    dest_before = tree_digest(dest)
    rc2, again, _ = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest), "--jobs", "2")
    assert tree_digest(root) == before and tree_digest(dest) == dest_before
    assert {rel for rel, r in again.items() if r["action"] == "already"} == set(V3_FILES)
    assert {rel: r["action"] for rel, r in again.items() if rel not in V3_FILES} == \
        {rel: r["action"] for rel, r in lines.items() if rel not in V3_FILES}
    assert rc2 == rc

    # an output lost and a source replaced: exactly those two are done again
    (dest / "slots/a/slot0.bin").unlink()
    shutil.copyfile(DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.seqstate", root / "slots/a/slot1.bin")
    changed = tree_digest(root)
    _, third, _ = _migrate(capsys, str(root), "--layout", "v4", "--out", str(dest), "--jobs", "2")
    assert tree_digest(root) == changed
    redone = {rel for rel, r in third.items() if r["action"] == "migrated"}
    assert redone == {"slots/a/slot0.bin", "slots/a/slot1.bin"}
    assert {rel for rel, r in third.items() if r["action"] == "already"} == set(V3_FILES) - redone
    assert _is_v4(dest / "slots/a/slot1.bin")

    # v4 files already load in v4: copied byte for byte; and a scan with --target says they load
    rc4, copied, _ = _migrate(capsys, str(dest), "--layout", "2026-10-v4", "--out", str(tmp_path / "dest2"))
    assert rc4 == 0 and {rel: r["action"] for rel, r in copied.items()} == dict.fromkeys(V3_FILES, "copied")
    for rel in V3_FILES:
        assert (tmp_path / "dest2" / rel).read_bytes() == (dest / rel).read_bytes()
    assert main(["scan", str(tmp_path / "dest2"), "--target", "v4"]) == 0
    assert "target 2026-10-v4: 7 load, 0 migratable" in capsys.readouterr().out


def test_migrate_on_dask_equals_local(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    build_tree(root, tmp_path / "outside")
    before = tree_digest(root)
    rc_l, local, _ = _migrate(capsys, str(root), "--layout", "v4", "--out", str(tmp_path / "a"), "--jobs", "2")
    rc_d, dask, summary = _migrate(capsys, str(root), "--layout", "v4", "--out", str(tmp_path / "b"),
                                   "--executor", "dask", "--jobs", "2", "--batch", "4")
    assert tree_digest(root) == before and summary["executor"] == "dask" and rc_d == rc_l == 1
    assert {rel: (r["action"], r.get("reason"), r.get("output_sha256")) for rel, r in dask.items()} == \
        {rel: (r["action"], r.get("reason"), r.get("output_sha256")) for rel, r in local.items()}
    for rel in V3_FILES:
        assert (tmp_path / "b" / rel).read_bytes() == (tmp_path / "a" / rel).read_bytes()
    _, again, _ = _migrate(capsys, str(root), "--layout", "v4", "--out", str(tmp_path / "b"), "--executor", "dask",
                           "--jobs", "2")
    assert {rel for rel, r in again.items() if r["action"] == "already"} == set(V3_FILES)


def test_migrate_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    (root / "x").mkdir(parents=True)
    shutil.copyfile(DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate", root / "x" / "s.bin")
    before = tree_digest(root)
    for args in (["--layout", "v4", "--out", str(root / "x" / "out")], ["--layout", "v4", "--out", str(root)],
                 ["--layout", "v4", "--out", str(tmp_path)], ["--layout", "2099", "--out", str(tmp_path / "d")],
                 ["--layout", "v4", "--out", "s3://bucket/dest"]):
        assert main(["migrate", str(root), *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("kvscope: ") and err.count("\n") == 1
    assert tree_digest(root) == before and not os.path.exists(tmp_path / "d")


def test_a_file_of_another_model_is_not_called_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With a model the files do not fit, migrate says so (``cannot``: not with that model), as the verdict
    does (model mismatch), and never calls sound bytes damaged; the files of that model migrate."""
    src = DATA / "llamacpp-2026-10-01"
    root = tmp_path / "src"
    root.mkdir()
    for name in ("qwen2vl-f16-fa0-unified0-seq0.seqstate", "llama-f16-fa0-unified0-seq0.seqstate"):
        shutil.copyfile(src / name, root / name)
    rc, lines, _ = _migrate(capsys, str(root), "--layout", "v4", "--out", str(tmp_path / "dest"),
                            "--model", str(src / "tiny-llama.gguf"))
    other = lines["qwen2vl-f16-fa0-unified0-seq0.seqstate"]
    assert other["action"] == "cannot" and "not with the model given" in other["reason"], other
    assert lines["llama-f16-fa0-unified0-seq0.seqstate"]["action"] == "migrated"
    assert rc == 1
