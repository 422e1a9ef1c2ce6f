"""The failed restores the fixture generator observed in the real builds, replayed in the memory core.

tests/data/gen-0c1e5709 and gen-b11434 hold states of every memory class written by the pinned
builds; each manifest's ``failed_restore_observations`` records what the build did with a damaged
one (truncations, a wrong K type, a wrong cell count, a rotation mismatch between contexts). Each
is replayed in the core (``contained``), from the scenario's whole-context state in a context of
the same model and parameters: the same return value, and the same positions of every sequence
afterwards (where the build aborted reading a truncated sequence file, the core reports the
truncation instead, as documented). The byte-identical round trips of every generated file are in
test_mem_roundtrip.py.
"""

from __future__ import annotations

import json
import struct
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.memory import ContextParams, MemoryContext
from kvscope.core.model.profile import ModelProfile, load_model_profile

DATA = Path(__file__).resolve().parents[1] / "data"
FOLDERS = {"gen-0c1e5709": "2026-10", "gen-b11434": "2026-10-v4"}


@cache
def _manifest(folder: str) -> dict[str, Any]:
    return json.loads((DATA / folder / "manifest.json").read_text())  # type: ignore[no-any-return]


@cache
def _profile(folder: str, model_file: str) -> ModelProfile:
    return load_model_profile(DATA / folder / model_file)


def _entries() -> list[tuple[str, dict[str, Any]]]:
    return [(folder, e) for folder in FOLDERS for e in _manifest(folder)["files"]]


def _observations() -> list[tuple[str, dict[str, Any]]]:
    return [(folder, o) for folder in FOLDERS for o in _manifest(folder)["failed_restore_observations"]]


ENTRIES = _entries()
OBSERVATIONS = _observations()


def test_the_generated_fixtures_are_all_here() -> None:
    classes = {e["memory_class"] for _, e in ENTRIES}
    assert {f for f, _ in ENTRIES} == set(FOLDERS)
    assert {"llama_kv_cache_dsa", "llama_kv_cache_dsa_iswa", "llama_memory_hybrid_idx", "llama_kv_cache_msa",
            "llama_kv_cache_dsv4", "llama_memory_hybrid_iswa"} <= classes, classes
    assert len(OBSERVATIONS) >= 100


def _scenario_files(folder: str, model: str, scenario: str) -> dict[str, dict[str, Any]]:
    out = {}
    for e in _manifest(folder)["files"]:
        if e["model_key"] == model and e["scenario"] == scenario and e.get("seq_id") in (0, None):
            if e["kind"] == "ctx_blob":
                out["ctx"] = e
            elif e["kind"] == "seq_blob" and not e["flags"]:
                out["blob"] = e
            elif e["kind"] == "seq_file" and "slot" not in e["file"]:
                out["file"] = e
    return out


def _core(folder: str, entry: dict[str, Any]) -> MemoryContext:
    """A core context of the entry's model and parameters holding its scenario's whole state."""
    cp = entry["context_params"]
    params = ContextParams(n_ctx=cp["n_ctx"], n_seq_max=cp["n_seq_max"], kv_unified=cp["kv_unified"],
                           flash_attn=bool(cp["flash_attn"]), type_k=cp["type_k"], type_v=cp["type_v"],
                           swa_full=cp["swa_full"], n_batch=cp["n_batch"], n_ubatch=cp["n_ubatch"],
                           rot_disabled=cp["env"].get("LLAMA_ATTN_ROT_DISABLE") == "1")
    ctx = MemoryContext.create(_profile(folder, entry["model_file"]), params, FOLDERS[folder])
    res = ctx.set_data((DATA / folder / entry["file"]).read_bytes())
    assert res.ok, res
    return ctx


def _mutate(data: bytes, mutation: dict[str, Any]) -> bytes:
    if mutation["kind"] == "truncate":
        assert len(data) == mutation["original_size"]
        return data[: len(data) - mutation["removed_bytes"]]
    assert mutation["kind"] == "field"
    out = bytearray(data)
    fmt = "<i" if mutation["from"] < 0 or mutation["to"] < 0 else "<I"
    assert struct.unpack_from(fmt, out, mutation["offset"])[0] == mutation["from"]
    struct.pack_into(fmt, out, mutation["offset"], mutation["to"])
    return bytes(out)


@pytest.mark.parametrize(("folder", "obs"), OBSERVATIONS,
                         ids=[f"{f[4:]}-{o['model_key']}-{o['case']}" for f, o in OBSERVATIONS])
def test_failed_restores_as_the_build_observed(folder: str, obs: dict[str, Any]) -> None:
    src, _, dst = obs["scenario"].partition("->")
    files = _scenario_files(folder, obs["model_key"], src)
    into = _scenario_files(folder, obs["model_key"], dst or src)
    ctx = _core(folder, into["ctx"])
    before = {str(s): [ctx.memory.seq_pos_min(s), ctx.memory.seq_pos_max(s)] for s in range(len(obs["before"]))}
    assert before == obs["before"]
    mutation = obs["mutation"]
    if obs["api"].startswith("llama_state_seq_load_file"):
        data = _mutate((DATA / folder / files["file"]["file"]).read_bytes(), mutation)
        res = ctx.seq_load_file(None, 0, 1 << 16, data=data)
    else:
        raw = (DATA / folder / files["blob"]["file"]).read_bytes()
        data = raw if mutation["kind"] == "context" else _mutate(raw, mutation)
        res = ctx.seq_set_data(data, 0)
    if obs["aborted"]:
        # a sequence file cut inside its payload: llama.cpp's POSIX reader reads past the end without
        # noticing and trips an assert (process abort, docs §2.2); the core says the file is truncated
        assert obs["api"].startswith("llama_state_seq_load_file") and mutation["kind"] == "truncate"
        assert (res.ok, res.check) == (False, "truncated"), res
        return
    assert res.returned == obs["return"], (res, obs["log"])
    after = {str(s): [ctx.memory.seq_pos_min(s), ctx.memory.seq_pos_max(s)] for s in range(len(obs["after"]))}
    assert after == obs["after"], (res, obs["log"])
