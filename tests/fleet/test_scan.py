"""``kvscope scan``: one line per file, a correct summary, non-state files skipped, exit codes."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA, manifest_entries
from kvscope.core.cli.main import main
from kvscope.core.fleet.tree_scan import scan_file, scan_tree, summarise


def test_scan_file_is_pure_and_jsonable(tmp_path: Path) -> None:
    p = DATA / "llamacpp-2026-10-01/lfm2-f16-fa0-unified0-seq0.seqstate"
    r = scan_file(str(p))
    assert json.loads(json.dumps(r)) == r
    assert r["status"] == "parsed" and r["kind"] == "seq_file" and r["layout"] == "2026-10"
    assert r["sections"] == ["kv_attn", "recurrent"] and r["sequences"] == {"0": 5} and r["n_tokens"] == 5
    # without the model, the one thing the bytes cannot confirm is that no section is missing at the end
    assert r["findings"] == {"error": 0, "warning": 0, "info": 1}
    assert scan_file(str(p)) == r


def test_scan_tests_data_matches_manifests() -> None:
    root = DATA / "llamacpp-2026-10-01"
    results = {Path(r["path"]).name: r for r in scan_tree(str(root), jobs=2)}
    listed = {p.name: e for p, e in manifest_entries() if p.parent == root}
    assert set(listed) <= set(results)
    for name, entry in listed.items():
        r = results[name]
        assert r["status"] == "parsed" and r["findings"]["error"] == 0, name
        kind = {"session": "session_file", "ctx_blob": "context_blob"}.get(entry["kind"], entry["kind"])
        assert r["kind"] == kind
        if entry["model_key"] == "llama":  # plain KV cache: one cell per decoded token
            assert r["sequences"] == {k: v["n_tokens"] for k, v in entry["seqs"].items() if v["n_tokens"]}, name
    others = [r for n, r in results.items() if n not in listed]
    assert others and all(r["status"] == "skipped" for r in others)  # models, manifests, json
    s = summarise(list(results.values()))
    assert s["files"] == len(results) and s["files_with_errors"] == 0
    assert s["status"] == {"parsed": len(listed), "skipped": len(others)}


def test_scan_cli_lines_summary_exit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lab = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"
    rc = main(["scan", str(lab), "--jobs", "2"])
    out = capsys.readouterr().out.splitlines()
    files = sorted(os.listdir(lab))
    assert rc == 1  # the lab holds damaged inputs
    assert out[len(files)].startswith("summary: ") and out[len(files) + 1] == "worst files:"
    assert len(out) == len(files) + 2 + 10  # the ten worst files follow the summary, worst first
    assert all(": damaged: " in line for line in out[len(files) + 2:])  # 11 damaged files: the worst are those
    assert any(line.startswith("ERROR") and "truncated_half.seqdata.bin" in line for line in out)
    assert any(line.startswith("skipped") and "context.json" in line for line in out)
    rc = main(["scan", str(lab), "--json", "--jobs", "1"])
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "summary" in docs[-1] and docs[-1]["summary"]["files"] == len(files)
    clean = tmp_path / "slots"
    clean.mkdir()
    (clean / "slot0.bin").write_bytes((lab / "seq0.clean.seqstate").read_bytes())
    (clean / "notes.txt").write_text("not a slot\n")
    assert main(["scan", str(clean)]) == 0
    assert main(["scan", str(tmp_path / "missing")]) == 2


def _scan_as_nobody(path: str, out: Any) -> None:
    os.setgid(65534)
    os.setuid(65534)  # root reads every file: drop to nobody for a real permission failure
    out.put(scan_file(path))


def test_unreadable_file_reported_not_fatal(tmp_path: Path) -> None:
    p = tmp_path / "locked.bin"
    p.write_bytes(b"\0" * 16)
    p.chmod(0)
    if os.geteuid() != 0:
        r = scan_file(str(p))
    else:
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_scan_as_nobody, args=(str(p), q))
        child.start()
        r = q.get(timeout=60)
        child.join(60)
    assert r["status"] == "unreadable"
    assert "ermission" in r["reason"]
