"""The rotation rule has one source: the reader's inference and the memory core's caches agree with it,
and with the block sizes llama.cpp itself wrote, on every generated file of every memory class.

The reader infers the block sizes of layouts that do not store them (:mod:`kvscope.core.reader.rotation`);
the memory core builds its caches with them (:mod:`kvscope.core.memory.rot_rule`); both take llama.cpp's
rule from :mod:`kvscope.core.model.rotation_rule`. A second copy drifting on either side (another head
tested, another forced-K rule, another plan) fails here on the files where it matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA, entry_profile, load_manifest
from kvscope.core.memory.rot_rule import cache_rotation
from kvscope.core.memory.spec import MemorySpec, SpecError
from kvscope.core.reader.layouts import generation_named
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.rotation import section_heads

ENTRIES = [(DATA / folder / e["file"], e) for folder in ("gen-0c1e5709", "gen-b11434")
           for e in load_manifest(DATA / folder / "manifest.json")["files"]
           if e.get("kind") in ("seq_file", "session") and "model_file" in e]


def _one_per_setting(entries: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any]]]:
    seen: dict[tuple[str, ...], tuple[Path, dict[str, Any]]] = {}
    for path, e in entries:
        cp = e.get("context_params", {})
        key = (path.parent.name, e["model_file"], cp.get("type_k", ""), cp.get("type_v", ""), str(cp.get("env", {})))
        seen.setdefault(key, (path, e))
    return list(seen.values())


CASES = _one_per_setting(ENTRIES)


def test_the_cases_cover_rotated_caches_and_several_classes() -> None:
    assert len(CASES) >= 20
    assert len({e["memory_class"] for _, e in CASES}) >= 5
    assert any(r.get("n_rot_k") for _, e in CASES for r in e.get("expected_layout", {}).get("rotation_built", []))


@pytest.mark.parametrize(("path", "entry"), CASES, ids=[f"{p.parent.name}/{p.name}" for p, _ in CASES])
def test_reader_and_memory_core_agree_with_each_other_and_with_llama_cpp(path: Path, entry: dict[str, Any]) -> None:
    profile = entry_profile(path, entry)
    res = read_state(path, profile)
    gen = generation_named(res.layout.name)
    assert gen is not None
    disabled = bool(int(entry.get("context_params", {}).get("env", {}).get("LLAMA_ATTN_ROT_DISABLE", "0") or 0))
    try:
        spec = MemorySpec.from_profile(profile, kv_rot=gen.kv_rot)
    except SpecError:
        spec = None
    checked = 0
    for sec in res.sections:
        if sec.kind != "kv" or not sec.streams or not sec.streams[0].k_layers:
            continue
        st = sec.streams[0]
        tk = st.k_layers[0].type_id
        tv = st.v_layers[0].type_id if st.v_layers else None
        heads = section_heads(profile, sec, gen.kv_rot)
        assert heads is not None, sec.role
        reader = heads.blocks(tk, tv, disabled)
        if spec is not None:
            cache = next((c for c in spec.caches if c.role == sec.role), None)
            if cache is not None:
                assert cache_rotation(cache, tk, tv if tv is not None else tk, disabled)[0] == reader[0], sec.role
                if tv is not None:
                    assert cache_rotation(cache, tk, tv, disabled) == reader, sec.role
        if gen.kv_rot and st.n_rot_k is not None and not st.n_rot_inferred:
            # what the build itself wrote in the KV data header
            assert reader == (st.n_rot_k, st.n_rot_v if tv is not None else reader[1]), sec.role
        checked += 1
    assert checked or not any(s.kind == "kv" for s in res.sections)
