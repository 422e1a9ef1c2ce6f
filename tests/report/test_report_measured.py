"""The report says what Verify measured where it measured it (#29 items 2 and 3): a dropped record's layer
Verify names replaces the reader's guess in the verdict, the top findings, the build lines and the pictured
layer; a cut slot's
llama-server answer is the same word in the build lines and the reuse lines, and after a Verify of libllama
it follows the measured answer (the prediction kept only as "predicted unknown").

The files are damaged copies of a real llama-server slot made with the lab's corruption catalog; the Verify
results have the shape ``kvscope verify --json`` writes (read back through ``--verify-json``), so no engine runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kvscope.core.cli.main import main
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from tests.support.slot_damage import LLAMA, SLOT

GUESS = "first empty slot"
REFUSED = "Unable to restore slot: No available space in KV cache or invalid slot save file"


def _verify_json(path: Path, dst: Path, restore: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    data = path.read_bytes()
    res = read_state(data=data, profile=load_model_profile(LLAMA))
    dst.write_text(json.dumps({
        "file": str(path), "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "kind": res.kind,
        "layout": res.layout.name, "verdict": "damaged", "reasons": ["the restore failed"],
        "engine": {"kind": "llama.cpp", "build": "b11434"}, "restore": restore, "records": records,
        "next_token": None, "reuse": None}))
    return dst


def _report(tmp_path: Path, path: Path, verify: Path) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "r"
    assert main(["report", str(path), "--model", str(LLAMA), "-o", str(out), "--verify-json", str(verify)]) == 1
    return (out / "report.md").read_text(), json.loads((out / "report.json").read_text())


def test_the_report_says_the_record_verify_names(tmp_path: Path) -> None:
    path = tmp_path / "dropped.seqstate"
    corrupt_file(SLOT, path, ["drop_k_layer_1"], str(LLAMA))
    verify = _verify_json(path, tmp_path / "v.json", {"ok": False, "message": "llama_state_seq_load_file failed"},
                          [{"section": "kv", "section_index": 0, "stream": 0, "role": "v", "il": 0,
                            "status": "missing"}])
    md, js = _report(tmp_path, path, verify)
    answer = "Verify names the missing record: layer 0 V (measured)"
    body = md.split("## Inspection", 1)[1]
    head = body.split("## Overview")[0]  # the verdict and the top findings
    assert GUESS not in head and answer in head, head
    assert answer in js["overview"]["verdict"]["reason"]
    assert not any(GUESS in line for line in js["overview"]["consumers_text"] + js["overview"]["reuse_text"])
    details = md.split("## Details", 1)[1]
    assert details.lstrip().startswith("What the reader alone says"), details[:200]
    dropped = [f for f in js["findings"] if f["code"] == "missing_layer"]
    assert dropped and all(f["measured"] and answer in f["message"] and GUESS in f["predicted"] for f in dropped)
    # the pictured layer is the one Verify measured (the missing V of layer 0: its K record stands in), not
    # the reader's guess (without the Verify result, its missing-layer finding pictures another layer)
    pictured = js["report"]["flagged_layers"]
    assert [(p["role"], p["layer"]) for p in pictured] == [("k", 0)], pictured
    assert pictured[0]["why"].startswith("the damaged layer 0: V missing (measured by Verify)"), pictured
    out = tmp_path / "guess"
    assert main(["report", str(path), "--model", str(LLAMA), "-o", str(out)]) == 1
    guessed = json.loads((out / "report.json").read_text())["report"]["flagged_layers"]
    assert [(p["role"], p["layer"]) for p in guessed] != [("k", 0)] and "measured" not in guessed[0]["why"], guessed


def test_a_cut_slot_has_one_server_answer_in_the_report(tmp_path: Path) -> None:
    path = tmp_path / "cut.seqstate"
    corrupt_file(SLOT, path, ["truncated_half"], str(LLAMA))
    verify = _verify_json(path, tmp_path / "v.json", {"ok": False, "message": "failed to read the state"}, [])
    md, js = _report(tmp_path, path, verify)
    lines = [line for line in md.splitlines() if "b11434" in line and "llama-server" in line]
    assert lines and not any("predicted from libllama's answer" in line for line in lines), lines
    assert f"- b11434 llama-server: refuses: {REFUSED}; predicted unknown (libllama's restore measured by Verify)" \
        in lines, lines
    for flag in ("", " --swa-full"):  # the reuse row says the same word
        assert f"llama-server b11434{flag}: refuses the slot: {REFUSED}; predicted unknown" in md, md
    assert "llama-server b11434: reuse cannot be told" not in md
    # the prediction alone (inspect --json's, the report's consumers): one word for llama-server in both
    preds = {a["build"]: a["answer"] for a in js["overview"]["consumers"] if a["consumer"] == "llama-server"}
    reuse_pred = {e["build"]: e["restores"] for e in js["overview"]["reuse_prediction"]}
    assert preds["b11434"] == "unknown" and reuse_pred["b11434"] is None


def test_records_that_drifted_under_an_ok_verify_are_not_pictured_as_damage() -> None:
    """Under Verify's ``ok`` a differing record drifted (rounding, a reused chunk): the picture is the reader's."""
    from kvscope.core.report.collect import measured_record

    res = read_state(data=SLOT.read_bytes(), profile=load_model_profile(LLAMA))
    drifted = {"verdict": "ok", "records": [{"section": res.sections[0].role, "stream": 0, "role": "k", "il": 0,
                                             "status": "differs"}]}
    assert measured_record(res, None, drifted) is None
    assert measured_record(res, None, {**drifted, "verdict": "damaged"}) is not None

