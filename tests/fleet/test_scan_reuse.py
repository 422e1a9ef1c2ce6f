"""scan --target GEN says per slot file what that generation's llama-server does with it (#18 item 5):
restores or refuses, the tokens it would reuse at its defaults and with --swa-full, and the summary
counts the slots that restore but will not be reused. The answers are checked against real servers
in tests/engine/test_reuse_fixtures.py; here, that scan carries them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.main import main

GEN = DATA / "gen-b11434"


def _scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    rc = main(["scan", *args, "--json", "--jobs", "1"])
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return rc, {Path(d["path"]).name: d for d in docs[:-1]}, docs[-1]["summary"]


def test_scan_target_predicts_restore_and_reuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("gemma2-f16-fa0-unified0-slot.seqstate", "lfm2-swa-f16-fa0-unified0-slot.seqstate",
                 "llama-f16-fa0-unified0-slot.seqstate", "mamba-f16-fa0-unified0-slot.seqstate",
                 "llama-f16-fa0-unified0-ctx.state.bin"):
        shutil.copyfile(GEN / name, tmp_path / name)
    rc, files, summary = _scan(capsys, str(tmp_path), "--target", "2026-10-v4")
    assert rc == 0
    srv = {n: r["target"]["server"] for n, r in files.items()}
    assert srv["llama-f16-fa0-unified0-ctx.state.bin"] is None  # llama-server restores slot files only
    # without the model: the SWA window is not known, the rest is
    assert srv["gemma2-f16-fa0-unified0-slot.seqstate"]["reused_tokens"] is None
    assert srv["gemma2-f16-fa0-unified0-slot.seqstate"]["swa_full_reused_tokens"] == 9
    for n, tokens in (("llama-f16-fa0-unified0-slot.seqstate", 12), ("mamba-f16-fa0-unified0-slot.seqstate", 12)):
        assert (srv[n]["build"], srv[n]["restore"], srv[n]["reused_tokens"], srv[n]["wasted"]) == \
            ("b11434", "loads", tokens, False), (n, srv[n])
    assert summary["target"]["restore_not_reused"] == 0


def test_the_summary_counts_slots_restored_but_not_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(2):
        shutil.copyfile(GEN / "gemma2-f16-fa0-unified0-slot.seqstate", tmp_path / f"g{i}.bin")
    model = DATA / "gen-models" / "gemma2.gguf"
    rc, files, summary = _scan(capsys, str(tmp_path), "--target", "2026-10-v4", "--model", str(model))
    assert rc == 0 and summary["target"]["restore_not_reused"] == 2
    s = files["g0.bin"]["target"]["server"]
    got = (s["restore"], s["reused_tokens"], s["reprocessed_tokens"], s["swa_full_reused_tokens"])
    assert got == ("loads", 0, 9, 9)
    assert s["wasted"] and "--swa-full" in s["fix"] and "forcing full prompt re-processing" in s["reuse_reason"]
    # another generation's server refuses it: no reuse to speak of, and not counted as wasted
    rc, files, summary = _scan(capsys, str(tmp_path), "--target", "2026-10", "--model", str(model))
    s = files["g0.bin"]["target"]["server"]
    assert (s["build"], s["restore"], s["reused_tokens"]) == ("0c1e5709", "refuses", 0)
    assert "unknown (magic, version)" in s["reason"] and summary["target"]["restore_not_reused"] == 0
    main(["scan", str(tmp_path), "--target", "2026-10-v4", "--model", str(model), "--jobs", "1"])
    text = capsys.readouterr().out
    assert "llama-server b11434 restores, reuses 0/9 tokens (--swa-full: 9)" in text
    assert "2 slots restore but will not be reused by llama-server" in text
