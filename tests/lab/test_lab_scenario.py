"""Scenario loading: one call per lab folder, context parameters from context.json, the layout of the
build, live contexts from the whole state or from per-sequence files, and inferred parameters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from kvharness.fixtures import DATA, model_path
from kvscope.core import ggml_types as gt
from kvscope.core.lab.scenario import (
    LiveCopy,
    RestoreInput,
    ScenarioError,
    load_scenario,
    params_from_context_json,
    read_input,
)
from kvscope.core.reader.parse import read_state

LAB = DATA / "lab"
BUILDS = {"llamacpp-2026-10-01": "2026-10", "llamacpp-2026-08-16": "2026-08"}
SCENARIOS = ("llama", "llama/fa0-unified1", "llama/fa1-unified1", "mamba", "gemma2", "lfm2")
FOLDERS = [(b, s) for b in BUILDS for s in SCENARIOS]


@pytest.mark.parametrize(("build", "sc"), FOLDERS, ids=[f"{b[9:]}/{s}" for b, s in FOLDERS])
@pytest.mark.parametrize("live", ["state", "seqs"])
def test_lab_folder_in_one_call(build: str, sc: str, live: str) -> None:
    folder = LAB / build / sc
    scenario = load_scenario(folder, live=live)
    cj = json.loads((folder / "context.json").read_text())
    struct = cj["context_params_struct"]
    p = scenario.params
    assert (p.n_ctx, p.n_seq_max, p.kv_unified, p.swa_full, p.n_batch, p.n_ubatch) == (
        struct["n_ctx"], struct["n_seq_max"], struct["kv_unified"], struct["swa_full"], struct["n_batch"],
        struct["n_ubatch"])
    assert p.flash_attn == (struct["flash_attn_type"] == 1)
    assert (p.type_id_k, p.type_id_v) == (struct["type_k"], struct["type_v"])
    assert scenario.layout.name == BUILDS[build]
    assert scenario.name == f"{build}/{sc}" and scenario.folder == folder
    assert scenario.profile.arch == cj["model"]["architecture"]
    # the live context holds both sequences, byte-identical to llama.cpp's dump of it
    assert bytes(scenario.live.get_data()) == (folder / "context.state.bin").read_bytes()
    assert scenario.sequences == (0, 1) and scenario.others == (1,) and scenario.target == 0
    assert scenario.restore.kind == "seq_blob" and scenario.restore.name == "seq0.clean.seqdata.bin"
    assert scenario.restore.data == (folder / "seq0.clean.seqdata.bin").read_bytes()
    summary = scenario.summary()
    assert summary["restore"]["api"] == "seq_set_data" and summary["live_sequences"] == [0, 1]


def test_other_entry_points() -> None:
    folder = LAB / "llamacpp-2026-10-01/gemma2"
    a = load_scenario(folder / "context.json", into=1)
    b = load_scenario(folder / "context.state.bin", restore=folder / "seq0.clean.seqstate",
                      model=model_path("gemma2"))
    assert a.target == 1 and a.restore.name == "seq1.clean.seqdata.bin"
    assert b.restore.kind == "seq_file" and b.restore.api == "seq_load_file" and b.restore.reader == "file"
    assert bytes(a.live.get_data()) == bytes(b.live.get_data())
    session = b.with_restore(read_input(folder / "context.session", b.profile))
    assert session.restore.kind == "session_file" and session.live is b.live and session.target == 0


def test_without_context_json_the_parameters_are_inferred(tmp_path: Path) -> None:
    src = LAB / "llamacpp-2026-10-01/lfm2"
    shutil.copy(src / "context.state.bin", tmp_path / "live.state.bin")
    with pytest.raises(ScenarioError, match="no model"):
        load_scenario(tmp_path / "live.state.bin", restore=src / "seq0.clean.seqdata.bin")
    sc = load_scenario(tmp_path / "live.state.bin", restore=src / "seq0.clean.seqdata.bin", model=model_path("lfm2"))
    assert any("inferred" in n for n in sc.notes)
    assert bytes(sc.live.get_data()) == (src / "context.state.bin").read_bytes()
    assert sc.sequences == (0, 1)
    sc2 = load_scenario(tmp_path / "live.state.bin", restore=src / "seq0.clean.seqdata.bin",
                        model=model_path("lfm2"), overrides={"n_ctx": 512})
    assert sc2.params.n_ctx == 512


def test_flash_attention_auto_follows_the_v_layout() -> None:
    folder = LAB / "llamacpp-2026-10-01/llama/fa1-unified1"
    cj = json.loads((folder / "context.json").read_text())
    cj["context_params_struct"]["flash_attn_type"] = -1
    rows = read_state(folder / "context.state.bin", profile=load_scenario(folder).profile)
    assert params_from_context_json(cj, rows).flash_attn  # V in rows: flash attention was on
    cj["context_params_struct"] = {}
    cj["context_params"] = {"n_ctx": 256, "n_seq_max": 2, "kv_unified": True, "flash_attn": False, "type_k": "q8_0",
                            "type_v": "f16"}
    p = params_from_context_json(cj)
    assert not p.flash_attn and p.type_id_k == gt.type_id_from_name("q8_0") and p.n_batch == 2048


def test_errors(tmp_path: Path) -> None:
    folder = LAB / "llamacpp-2026-10-01/mamba"
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "nothing")
    with pytest.raises(ScenarioError, match="context.json"):
        load_scenario(tmp_path)
    with pytest.raises(ScenarioError, match="out of range"):
        load_scenario(folder, into=5, restore=folder / "seq0.clean.seqdata.bin")
    with pytest.raises(ScenarioError, match="seq7"):
        load_scenario(folder, into=7)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a state at all")
    with pytest.raises(ScenarioError, match="not a llama.cpp state"):
        load_scenario(folder, restore=junk)
    with pytest.raises(ScenarioError, match="cannot be the live"):
        load_scenario(folder, live_seqs={-1: folder / "context.state.bin"})
    with pytest.raises(ScenarioError, match="unknown input kind"):
        RestoreInput(b"", "blob")
    with pytest.raises(ScenarioError, match="unknown live source"):
        load_scenario(folder, live="decode")
    with pytest.raises(ScenarioError, match="does not load"):
        load_scenario(folder, live_seqs={0: folder / "truncated_half.seqdata.bin"})
    assert load_scenario(folder, device="cpu").live.memory.store.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ScenarioError, match="CUDA is not available"):
            load_scenario(folder, device="cuda")


def test_live_copy_reset_puts_every_byte_back() -> None:
    sc = load_scenario(LAB / "llamacpp-2026-10-01/gemma2")
    copy = LiveCopy(sc.live)
    ctx = copy.ctx
    live_bytes = bytes(sc.live.get_data())
    assert bytes(ctx.get_data()) == live_bytes
    ctx.memory.clear(True)
    ctx.seq_set_data((sc.folder or Path()).joinpath("nan_rows_valid.seqdata.bin").read_bytes(), 1)
    assert bytes(ctx.get_data()) != live_bytes
    assert copy.reset() is ctx and bytes(ctx.get_data()) == live_bytes
    live_tensors = [t for p in sc.live.memory.parts for t in p.mem.tensors()]
    assert all(a.equal(b) for a, b in zip([t for p in ctx.memory.parts for t in p.mem.tensors()], live_tensors,
                                           strict=True))  # free cells too, which get_data does not show
