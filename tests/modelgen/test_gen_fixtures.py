"""The generated fixtures in tests/data/gen-*: every file is what its manifest says, the walker
accounts for every byte, the API sizes equal the files, every round trip gave the bytes back, and
every memory class has every kind of state in both builds."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import gen_fixtures
import pytest
from fixture_scenarios import MODELS, PARTIAL_CLASSES, plan
from state_walker import Plan, WalkError, walk

from kvharness.fixtures import DATA
from kvscope.core.modelgen import load_recipe

BUILDS = ("0c1e5709", "b11434")
ROT_FIELDS = {"0c1e5709": False, "b11434": True}


def _manifest(build: str) -> dict[str, Any]:
    return json.loads((DATA / f"gen-{build}" / "manifest.json").read_text())  # type: ignore[no-any-return]


ENTRIES = [(b, e) for b in BUILDS for e in _manifest(b)["files"]]
IDS = [f"{b}/{e['file']}" for b, e in ENTRIES]


@pytest.mark.parametrize(("build", "entry"), ENTRIES, ids=IDS)
def test_file_is_what_the_manifest_says(build: str, entry: dict[str, Any]) -> None:
    data = (DATA / f"gen-{build}" / entry["file"]).read_bytes()
    assert len(data) == entry["size"]
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert entry["api_return"]["equals_file_size"] is True
    layout = walk(data, entry["kind"], plan(load_recipe(entry["model_key"]), ROT_FIELDS[build], entry["flags"]))
    assert layout == entry["generator_parse"]
    assert layout["parts"][-1]["end"] == len(data)
    rt = entry["roundtrip"]
    assert rt["return_equals_size"] in (True, None) and rt["resaved_identical"] is True


@pytest.mark.parametrize("build", BUILDS)
def test_every_class_has_every_kind(build: str) -> None:
    man = _manifest(build)
    assert sorted(man["models"]) == sorted(MODELS)
    have: dict[str, set[str]] = {}
    for e in man["files"]:
        kind = "slot" if e["api"].startswith("llama-server") else e["kind"] + ("-partial" if e["flags"] else "")
        have.setdefault(e["memory_class"], set()).add(kind)
    for cls, kinds in have.items():
        want = {"seq_file", "seq_blob", "seq_blob-partial", "ctx_blob", "session", "slot"}
        assert kinds == want, cls
    assert len(have) == 10
    for cls in PARTIAL_CLASSES:
        part = [e for e in man["files"] if e["memory_class"] == cls and e["flags"]]
        full = [e for e in man["files"] if e["memory_class"] == cls and e["kind"] == "seq_blob" and not e["flags"]]
        assert len(part) == len(full) and all(p["size"] < f["size"] for p, f in zip(part, full, strict=True)), cls


@pytest.mark.parametrize("build", BUILDS)
def test_rotation_fields_follow_the_build(build: str) -> None:
    for e in _manifest(build)["files"]:
        for part in e["generator_parse"]["parts"]:
            for st in part.get("streams", []):
                if st["cell_count"]:
                    assert ("n_rot_k" in st) is ROT_FIELDS[build]
                    if ROT_FIELDS[build] and e["scenario"] in ("A", "B", "D", "F"):
                        assert (st["n_rot_k"], st["n_rot_v"]) == (0, 0) or part["name"] in ("kv_lid", "kv_idx")


def test_failed_restores_are_recorded() -> None:
    for build in BUILDS:
        obs = _manifest(build)["failed_restore_observations"]
        cases = {(o["model_key"], o["case"]) for o in obs}
        for m in MODELS:
            assert (m, "truncated_1") in cases and (m, "wrong_cell_count") in cases
        for o in obs:
            assert o["return"] == 0 or o["aborted"] or o["case"] == "rot_mismatch", o


def test_walker_reproduces_the_older_generator() -> None:
    """The walker parses the 0c1e5709 fixtures of tests/data/llamacpp-2026-10-01 (written by another
    generator) exactly as their manifests say."""
    mem = {"llama": "llama_kv_cache", "gemma2": "llama_kv_cache_iswa", "mamba": "llama_memory_recurrent",
           "lfm2": "llama_memory_hybrid", "qwen2vl": "llama_kv_cache"}
    folder = DATA / "llamacpp-2026-10-01"
    n = 0
    for mf in ("manifest.json", "manifest-mrope.json"):
        for e in json.loads((folder / mf).read_text())["files"]:
            el = e["expected_layout"]
            p = Plan(memory=mem[e["model_key"]], flags=e.get("flags") or 0,
                     cell_ext_bytes=el.get("kv_cell_ext_bytes", 0), recr_layers=tuple(el.get("recr_layers", [])))
            got = walk((folder / e["file"]).read_bytes(), e["kind"], p)
            want = e["generator_parse"]
            assert {k: got["header"][k] for k in want["header"]} == want["header"]
            assert len(got["parts"]) == len(want["parts"])
            for a, b in zip(got["parts"], want["parts"], strict=True):
                for k, v in b.items():
                    if k == "streams":
                        for sa, sb in zip(a["streams"], v, strict=True):
                            assert {kk: sa[kk] for kk in sb} == sb
                    else:
                        assert a[k] == v, (e["file"], k)
            n += 1
    assert n > 100


def test_walker_refuses_what_it_cannot_account_for() -> None:
    e = next(e for b, e in ENTRIES if b == "b11434" and e["kind"] == "seq_blob" and e["model_key"] == "lfm2")
    data = (DATA / "gen-b11434" / e["file"]).read_bytes()
    p = plan(load_recipe("lfm2"), True, e["flags"])
    with pytest.raises(WalkError):
        walk(data[:-1], "seq_blob", p)
    with pytest.raises(WalkError, match="bytes left"):
        walk(data + b"\0", "seq_blob", p)
    with pytest.raises(WalkError):
        walk(data, "seq_blob", plan(load_recipe("lfm2"), False, e["flags"]))  # v3 layout: no rotation words


def test_check_reports_a_changed_byte(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(DATA / "gen-models", a)
    shutil.copytree(DATA / "gen-models", b)
    assert gen_fixtures.compare(a, b) == []
    f = b / "llama.gguf"
    raw = bytearray(f.read_bytes())
    raw[1000] ^= 1
    f.write_bytes(bytes(raw))
    (b / "extra.bin").write_bytes(b"x")
    diffs = gen_fixtures.compare(a, b)
    assert diffs == [f"only in {b}: extra.bin", "llama.gguf: differs at byte 1000 (sizes "
                     f"{len(raw)} / {len(raw)})"]


def test_inputs_stamp_follows_the_inputs(tmp_path: Path) -> None:
    root = Path(gen_fixtures.ROOT)
    for rel in gen_fixtures.INPUTS:
        src = root / rel
        dst = tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    h = gen_fixtures.inputs_hash(tmp_path)
    assert h == gen_fixtures.inputs_hash(root)
    (tmp_path / "core" / "modelgen" / "archs" / "llama.json").write_text("{}")
    assert gen_fixtures.inputs_hash(tmp_path) != h
