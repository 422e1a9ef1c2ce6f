"""Walking a fleet's slot store: local folders (symlink loops, junk, special files) and an fsspec URL."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import fsspec
import pytest

from kvharness.fixtures import DATA
from kvharness.fleet_tree import build_tree
from kvscope.core.cli.main import main
from kvscope.core.fleet.progress import Progress, status_line
from kvscope.core.fleet.scanfile import scan_entry, scan_file
from kvscope.core.fleet.source import SourceError, open_source
from kvscope.core.fleet.summary import Summary


def test_walk_lists_each_file_once_through_loops(tmp_path: Path) -> None:
    listed = build_tree(tmp_path / "root", tmp_path / "outside")
    entries = list(open_source(str(tmp_path / "root")).walk())
    assert sorted(e.rel for e in entries) == listed  # loops, hidden, temp, links to files, FIFOs: left out
    assert len({e.rel for e in entries}) == len(entries)
    for e in entries:
        assert e.local and Path(e.ref) == tmp_path / "root" / e.rel
        if e.status == "file":
            assert e.size == Path(e.ref).stat().st_size
        else:  # the links to the folder outside the tree: reported, not followed
            assert e.status == "skipped" and e.reason.startswith("link leaves SOURCE") and e.rel in (
                "mounted", "slots/mounted-again")
    url = list(open_source(f"file://{tmp_path / 'root'}").walk())
    assert [e.rel for e in url] == [e.rel for e in entries]


def test_bad_sources_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.bin").write_bytes(b"x")
    for spec in (str(tmp_path / "missing"), str(tmp_path / "file.bin"), "nosuchprotocol://bucket/slots",
                 "memory://no/such/folder"):
        with pytest.raises(SourceError):
            open_source(spec)
        assert main(["scan", spec]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvscope: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["scan", str(tmp_path), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "--scheduler needs --executor dask" in capsys.readouterr().err
    assert main(["scan", str(tmp_path), "--target", "2099-01"]) == 2
    err = capsys.readouterr().err
    assert "unknown layout generation (" in err and "unknown release '2099-01'" in err and err.count("\n") == 1


def test_old_engine_flag_still_works_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--engine`` was the name of ``--executor`` (#22): accepted for one release, with one line on stderr."""
    build_tree(tmp_path / "root", tmp_path / "outside")
    assert main(["scan", str(tmp_path / "root"), "--json", "--jobs", "2", "--executor", "local"]) == 1
    new = capsys.readouterr()
    assert new.err == ""
    assert main(["scan", str(tmp_path / "root"), "--json", "--jobs", "2", "--engine", "local"]) == 1
    old = capsys.readouterr()
    assert old.err.count("\n") == 1 and "--engine is deprecated" in old.err and "--executor" in old.err
    drop = ("elapsed_s", "files_per_s")
    assert sorted(old.out.splitlines()[:-1]) == sorted(new.out.splitlines()[:-1])  # completion order aside
    s_old, s_new = (json.loads(o.out.splitlines()[-1])["summary"] for o in (old, new))
    assert {k: v for k, v in s_old.items() if k not in drop} == {k: v for k, v in s_new.items() if k not in drop}
    assert s_old["executor"] == "local"
    assert main(["scan", str(tmp_path / "root"), "--engine", "dask", "--executor", "local"]) == 2
    assert "disagree" in capsys.readouterr().err


def test_fsspec_memory_filesystem_walk_and_scan(tmp_path: Path) -> None:
    """A non-local fsspec file system (fsspec's in-memory one): listing, remote reads, same answers."""
    fs = fsspec.filesystem("memory")
    names = ["llama-f16-fa0-unified0-seq0.seqstate", "lfm2-f16-fa0-unified0-seq1.seqstate",
             "llama-f16-fa0-unified0-ctx.session"]
    try:
        for i, name in enumerate(names):
            fs.pipe(f"/fleet13/host{i % 2}/{name}", (DATA / "llamacpp-2026-10-01" / name).read_bytes())
        fs.pipe("/fleet13/host0/notes.txt", b"not a slot")
        fs.pipe("/fleet13/.hidden/x.bin", b"hidden")
        source = open_source("memory://fleet13")
        entries = list(source.walk())
        assert [source.relative(e.ref) for e in entries] == [e.rel for e in entries]
        assert [e.rel for e in entries] == sorted(["host0/llama-f16-fa0-unified0-seq0.seqstate",
                                                   "host0/llama-f16-fa0-unified0-ctx.session",
                                                   "host0/notes.txt", "host1/lfm2-f16-fa0-unified0-seq1.seqstate"])
        for e in entries:
            assert not e.local and e.ref.startswith("memory://") and e.size == fs.size(e.ref)
            r = scan_entry(e, target="v4")
            local = tmp_path / Path(e.rel).name
            local.write_bytes(fs.cat_file(e.ref))
            want = scan_file(str(local), target="v4")
            assert r == want | {"path": e.ref}
    finally:
        fs.rm("/fleet13", recursive=True)


def test_scan_text_lines_and_summary_of_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = build_tree(tmp_path / "root", tmp_path / "outside")
    rc = main(["scan", str(tmp_path / "root"), "--target", "v4", "--jobs", "2"])
    out = capsys.readouterr().out.splitlines()
    lines, summary = out[:len(listed)], out[len(listed):]
    assert sorted(line.split()[1].rstrip(":") for line in lines) == listed
    assert summary[0].startswith(f"summary: {len(listed)} files") and "verdicts: " in summary[0]
    assert summary[1].startswith("target 2026-10-v4: ") and summary[2] == "worst files:"
    assert "slots/damaged/huge.bin: damaged: " in "\n".join(summary[3:5])
    assert any("| 2026-10-v4: migratable" in line for line in lines if "slots/a/slot0.bin" in line)
    assert rc == 1  # damaged files, and files that will not load in v4 and cannot be migrated


def test_summary_keeps_counts_and_only_the_worst(tmp_path: Path) -> None:
    s = Summary("2026-10-v4", worst=3)
    base = scan_file(str(DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"), target="v4")
    for i in range(1000):
        r = dict(base, path=f"f{i}")
        if i % 100 == 7:
            r = {"path": f"f{i}", "status": "error", "reason": "worker died: SIGKILL"}
        s.add(r)
    j = s.to_json()
    assert j["files"] == 1000 and j["status"] == {"parsed": 990, "error": 10} and j["workers_lost"] == 10
    assert j["target"]["migratable"] == 990 and len(j["worst_files"]) == 3
    assert [w["path"] for w in j["worst_files"]] == ["f7", "f107", "f207"]  # worst first, then in scan order
    assert json.loads(json.dumps(j)) == j


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_on_a_terminal_only() -> None:
    assert status_line(50, None, 10.0) == "50 files  5 files/s"
    assert status_line(500, 1500, 10.0) == "500/1,500 files  50 files/s  ETA 20s"
    term = _Terminal()
    p = Progress(term, lambda: 1500, "scan")
    p.total = 1500
    p.step(10)
    p.clear()
    text = term.getvalue()
    assert text.startswith("\rscan 10/1,500 files") and text.endswith("\r")
    plain = io.StringIO()
    q = Progress(plain, lambda: 1 // 0)  # no terminal: no line, and the counting walk never runs
    q.step(5)
    q.clear()
    assert plain.getvalue() == "" and q.total is None


def test_scan_file_result_is_pure_with_target(tmp_path: Path) -> None:
    p = tmp_path / "slot.bin"
    shutil.copyfile(DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate", p)
    r = scan_file(str(p), target="2026-10-v4")
    assert r == scan_file(str(p), target="v4") == json.loads(json.dumps(r))
    assert r["verdict"] == "healthy" and r["target"]["status"] == "migratable" and r["target"]["loads"] is False
    assert "target" not in scan_file(str(p))
