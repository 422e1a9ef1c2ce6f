"""Which generations load a file, and llama.cpp's answer for the others (core/analysis/compat.py)."""

from __future__ import annotations

import struct

from kvharness.fixtures import DATA, profile
from kvscope.core.analysis.compat import compat_text, compatibility
from kvscope.core.reader.parse import read_state

V3 = DATA / "llamacpp-2026-10-01"
V2 = DATA / "llamacpp-2026-08-16"


def _by_gen(path, key):  # type: ignore[no-untyped-def]
    res = read_state(path, profile=profile(key))
    return {c.generation: c for c in compatibility(res, profile(key))}


def test_v3_seq_file() -> None:
    c = _by_gen(V3 / "llama-f16-fa0-unified0-seq0.seqstate", "llama")
    assert c["2026-10"].loads and c["2026-10"].stage == "ok"
    v4 = c["2026-10-v4"]
    assert v4.loads is False and v4.stage == "header"
    assert v4.answer == "state_seq_load_file: unknown (magic, version) for sequence state file: 67677371, 00000003"
    assert v4.migratable is True and v4.build == "b11434"
    assert c["2025-05"].migratable is None  # not a framing change: the memory core decides


def test_v3_blob_in_a_v4_build_trips_on_the_rotation_fields() -> None:
    blobs = (("llama-f16-fa1-unified1-seq1.seqdata.bin", 1), ("llama-q8_0-fa1-unified0-seq0.seqdata.bin", 8))
    for name, type_id in blobs:
        c = _by_gen(V3 / name, "llama")["2026-10-v4"]
        assert c.loads is False and c.stage == "memory"
        assert c.answer == f"state_read_data: incompatible key rotation ({type_id} instead of 0)"


def test_v4_blob_in_a_v3_build_trips_on_the_key_type(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = V3 / "llama-f16-fa1-unified1-seq1.seqdata.bin"
    res = read_state(src, profile=profile("llama"))
    st = res.sections[0].streams[0]
    assert st.data_offset is not None
    data = src.read_bytes()
    at = st.data_offset + 8
    v4 = data[:at] + struct.pack("<II", 0, 0) + data[at:]
    out = tmp_path / "v4.bin"
    out.write_bytes(v4)
    c = {x.generation: x for x in compatibility(read_state(out, profile=profile("llama")), profile("llama"))}
    assert c["2026-10-v4"].loads
    assert c["2026-10"].answer.startswith("state_read_data: mismatched key type (1 != 0, layer 0)")


def test_damaged_file_says_so_for_its_own_generation(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cut = tmp_path / "cut.seqstate"
    cut.write_bytes((V3 / "llama-f16-fa0-unified0-seq0.seqstate").read_bytes()[:-50])
    c = {x.generation: x for x in compatibility(read_state(cut, profile=profile("llama")), profile("llama"))}
    assert c["2026-10"].loads is False and "damaged" in c["2026-10"].answer


def test_2026_08_blob_loads_in_0c1e5709_but_not_b11434() -> None:
    c = _by_gen(V2 / "llama-f16-fa1-unified1-seq1.seqdata.bin", "llama")
    assert c["2026-08"].loads and c["2026-10"].loads
    assert c["2026-10-v4"].loads is False and "incompatible key rotation" in c["2026-10-v4"].answer
    lines = compat_text(list(c.values()))
    assert any(line.strip().startswith("2026-10-v4 (b11434): refuses") for line in lines)


def test_the_file_bytes_serve_as_data_as_well_as_a_byte_source() -> None:
    """``compatibility(data=...)`` takes the file's bytes as well as a ByteSource: a v4 blob's answer
    for a v3 build reads its fields (it raised AttributeError on bytes)."""
    from kvharness.fixtures import DATA
    from kvscope.core.analysis.compat import compatibility
    from kvscope.core.model.profile import load_model_profile
    from kvscope.core.reader.parse import read_state
    from kvscope.core.reader.source import ByteSource

    prof = load_model_profile(DATA / "gen-models" / "llama.gguf")
    data = (DATA / "gen-b11434" / "llama-f16-fa0-unified0-seq0.seqdata.bin").read_bytes()
    res = read_state(data=data, profile=prof)
    by_bytes = [c.to_json() for c in compatibility(res, prof, data=data)]
    by_source = [c.to_json() for c in compatibility(res, prof, data=ByteSource(data))]
    assert by_bytes == by_source
    assert any(c["generation"] == "2026-10" and "key" in c["answer"] for c in by_bytes), by_bytes
