"""Framing-only migration (core/convert/to_generation.py) on the real llama.cpp fixtures: v3 <-> v4 and back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import manifest_entries, profile
from kvscope.core.convert.to_generation import MigrationPlan, plan_migration, write_plan
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.tree import coverage

V3 = [(p, e) for p, e in manifest_entries() if p.parent.name == "llamacpp-2026-10-01"]
IDS = [p.name for p, _ in V3]


def _run(plan: MigrationPlan, src: Path) -> bytes:
    out = io.BytesIO()
    n = write_plan(plan, src, out)
    assert n == plan.size == len(out.getvalue())
    return out.getvalue()


def _shape(res: ParseResult) -> list[Any]:
    """What a migration must keep: sections, streams, cells, records (types, rows) and payload sizes."""
    out: list[Any] = []
    for sec in res.sections:
        if sec.kind == "kv":
            for st in sec.streams:
                cells = st.cells.as_pairs() if st.cells is not None else []
                out.append((sec.role, st.cell_count, cells, st.v_trans, st.n_layer,
                            [(r.type, r.row_bytes, r.n_embd_v_gqa, r.data_size) for r in (*st.k_layers, *st.v_layers)]))
        else:
            out.append((sec.role, sec.cell_count, [(r.type, r.row_bytes, r.data_size) for r in sec.all_layers()]))
    return out


@pytest.mark.parametrize(("path", "entry"), V3, ids=IDS)
def test_v3_to_v4_and_back_is_exact(path: Path, entry: dict[str, Any], tmp_path: Path) -> None:
    prof = profile(entry["model_key"])
    res = read_state(path, profile=prof)
    assert res.layout.name == "2026-10" or "2026-10" in res.layout.features.get("byte_identical_layouts", [])
    res = read_state(path, profile=prof, layout="2026-10")
    plan = plan_migration(res, "v4", prof)
    assert plan.supported and plan.exact, plan.missing
    v4 = _run(plan, path)
    kv_streams = sum(1 for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.data_offset is not None)
    assert len(v4) == res.size + 8 * kv_streams
    if res.kind == "seq_file":
        assert int.from_bytes(v4[4:8], "little") == 4
    if res.kind == "session_file":
        assert int.from_bytes(v4[4:8], "little") == 11
    mig = read_state(data=v4, profile=prof, kind=res.kind)
    assert mig.n_errors == 0, [f.message for f in mig.findings]
    assert mig.layout.name == "2026-10-v4" or "2026-10-v4" in mig.layout.features.get("byte_identical_layouts", [])
    mig = read_state(data=v4, profile=prof, kind=res.kind, layout="v4")
    assert coverage(mig.root)["parsed_bytes"] == len(v4)
    assert _shape(mig) == _shape(res)
    assert mig.tokens == res.tokens
    for sec in mig.sections:
        for st in sec.streams:
            if st.data_offset is not None:  # tiny llama: head size 32, so no build rotates its rows
                assert (st.n_rot_k, st.n_rot_v) == (0, 0)
    back_src = tmp_path / "v4.bin"
    back_src.write_bytes(v4)
    back = _run(plan_migration(mig, "2026-10", prof), back_src)
    assert back == path.read_bytes()


def test_identity_plan_is_one_copy() -> None:
    path, entry = V3[0]
    res = read_state(path, profile=profile(entry["model_key"]), layout="2026-10")
    plan = plan_migration(res, "2026-10")
    assert plan.supported and plan.exact and plan.pieces == [(0, res.size)]


def test_not_framing_is_not_supported() -> None:
    path = next(p for p, _ in V3 if p.name.endswith("ctx.session"))
    res = read_state(path)
    plan = plan_migration(res, "2025-08")
    assert not plan.supported and any("outputs" in m for m in plan.missing)
    with pytest.raises(ValueError):
        write_plan(plan, path, io.BytesIO())


def test_damaged_file_is_not_exact(tmp_path: Path) -> None:
    path, entry = next((p, e) for p, e in V3 if p.name.endswith("seq0.seqstate"))
    cut = tmp_path / "cut.seqstate"
    cut.write_bytes(path.read_bytes()[:-100])
    res = read_state(cut, profile=profile(entry["model_key"]))
    plan = plan_migration(res, "v4", profile(entry["model_key"]))
    assert not plan.exact and "damaged" in plan.missing[0]


def test_quantized_head64_needs_the_model_for_rotation(tmp_path: Path) -> None:
    """A q8_0 cache whose rows could be rotated: without the model the rotation is unknown."""
    path = next(p for p, _ in V3 if p.name.startswith("llama-q8_0") and p.name.endswith("seq0.seqstate"))
    res = read_state(path)
    plan = plan_migration(res, "v4")
    # tiny llama's K rows hold 64 values (2 heads x 32): a head size of 64 would rotate them
    assert not plan.exact and any("--model" in m for m in plan.missing)
    plan = plan_migration(res, "v4", rotation="off")
    assert plan.exact
    with_model = plan_migration(read_state(path, profile=profile("llama")), "v4", profile("llama"))
    assert with_model.exact and [r["n_rot_k"] for r in with_model.rotation] == [0]
