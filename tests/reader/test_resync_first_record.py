"""A damaged header of a cache's first K record (no record before it to resync on): the reader resumes
where that record's own row size puts the next header, and reads every other record as in the healthy file
(it stopped there before, and verify named every record of the file missing)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state

SLOTS = sorted((DATA / "gen-b11434").glob("*-f16-fa0-unified0-slot.seqstate")) + sorted(
    (DATA / "gen-0c1e5709").glob("*-f16-fa0-unified0-slot.seqstate"))


def _model(path: Path) -> Path:
    gen = sorted((m for m in (DATA / "gen-models").glob("*.gguf")), key=lambda m: len(m.stem), reverse=True)
    return next(m for m in gen if path.name.startswith(m.stem + "-"))


def _records(res) -> list[tuple[str, str, int, int, int]]:  # type: ignore[no-untyped-def]
    return [(sec.role, role, r.header_offset, r.type_id, r.data_size) for sec in res.sections for st in sec.streams
            for role, recs in (("k", st.k_layers), ("v", st.v_layers)) for r in recs]


CASES = []
for p in SLOTS:
    prof = load_model_profile(_model(p))
    res = read_state(data=p.read_bytes(), profile=prof)
    for sec in res.sections:
        for st in sec.streams:
            if len(st.k_layers) >= 2 and not res.findings:
                CASES.append(pytest.param(p, sec.role, id=f"{p.parent.name}/{p.name}:{sec.role}"))


@pytest.mark.parametrize("value", [0x7FFF, 0])  # an unknown type id; a known type of another size (f32)
@pytest.mark.parametrize(("path", "role"), CASES)
def test_a_first_k_record_with_a_bad_type_is_skipped_and_the_rest_read(path: Path, role: str, value: int) -> None:
    prof = load_model_profile(_model(path))
    data = path.read_bytes()
    healthy = read_state(data=data, profile=prof)
    st = next(s for sec in healthy.sections if sec.role == role for s in sec.streams if len(s.k_layers) >= 2)
    first = st.k_layers[0]
    if value == first.type_id:
        value += 1
    bad = bytearray(data)
    struct.pack_into("<i", bad, first.header_offset, value)
    res = read_state(data=bytes(bad), profile=prof)
    codes = [f.code for f in res.findings]
    assert "resynced" in codes, res.findings
    skipped = (role, "k", first.header_offset, first.type_id, first.data_size)
    assert _records(res) == [r for r in _records(healthy) if r != skipped]
    assert res.tokens == healthy.tokens
