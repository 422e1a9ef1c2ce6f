"""The corruption catalog reproduces llama.cpp's recorded failed-restore inputs byte for byte."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, profile
from kvscope.core.lab.corruptions import CATALOG, Corruption, CorruptionError, parse_spec
from kvscope.core.reader.parse import read_state

LAB = DATA / "lab"
SCENARIOS = [
    (build, sc)
    for build in ("llamacpp-2026-10-01", "llamacpp-2026-08-16")
    for sc in ("llama", "llama/fa0-unified1", "llama/fa1-unified1", "gemma2", "lfm2", "mamba")
]
WHOLE_FILE_CASES = {
    "whole_blob_truncated_half": "context.state.bin",
    "seq_file_truncated_half": "seq0.clean.seqstate",
    "session_file_truncated_half": "context.session",
}


def _cases() -> list[tuple[Path, str, str, dict[str, object]]]:
    out = []
    for build, sc in SCENARIOS:
        d = LAB / build / sc
        for name, case in json.loads((d / "observations.json").read_text())["cases"].items():
            out.append((d, sc.split("/")[0], name, case))
    return out


CASES = _cases()


@pytest.mark.parametrize(("folder", "key", "name", "case"), CASES,
                         ids=[f"{c[0].relative_to(LAB)}/{c[2]}" for c in CASES])
def test_catalog_reproduces_lab_input(folder: Path, key: str, name: str, case: dict[str, object]) -> None:
    if name == "nan_rows_valid_then_seq_rm":
        name = "nan_rows_valid"  # same bytes; the seq_rm happens after the restore
    source = WHOLE_FILE_CASES.get(name, "seq0.clean.seqdata.bin")
    if name in WHOLE_FILE_CASES:
        name = "truncated_half"
    clean = (folder / source).read_bytes()
    mutation = CATALOG[name].apply(clean, profile(key))
    assert mutation.data == (folder / str(case["input_file"])).read_bytes()
    assert mutation.description


def test_source_never_modified() -> None:
    path = LAB / "llamacpp-2026-10-01/llama/seq0.clean.seqdata.bin"
    data = path.read_bytes()
    copy = bytes(data)
    for c in CATALOG.values():
        with contextlib.suppress(CorruptionError):
            c.apply(data, profile("llama"))
    assert data == copy == path.read_bytes()


@pytest.mark.parametrize(("spec", "code"), [
    ("set:field=n_stream,value=+1", "truncated"),  # stream 1 would start at the end of the file
    ("set:field=n_stream,value=0", "stream_count_invalid"),
    ("set:field=v_trans,value=other", "row_size_mismatch"),
    ("set:field=n_layer,value=-1", "layer_count_mismatch"),
    ("set:field=type,role=k,index=0,value=q8_0", "row_size_mismatch"),
    ("set:field=row_size,role=k,index=1,value=130", "row_size_mismatch"),
    ("set:field=n_seq_id,cell=2,value=2", "seq_meta_invalid"),
    ("set:field=pos,cell=3,value=-9", "position_anomaly"),
    ("drop:role=kv,il=2", "missing_layer"),
    ("trailer:bytes=8", "trailing_bytes"),
    ("truncate:at=half", "truncated"),
])
def test_generic_mutations_are_detected(spec: str, code: str) -> None:
    clean = (LAB / "llamacpp-2026-10-01/llama/fa0-unified1/seq0.clean.seqdata.bin").read_bytes()
    m = parse_spec(spec).apply(clean, profile("llama"))
    res = read_state(data=m.data, profile=profile("llama"))
    assert code in {f.code for f in res.findings}, (m.description, [(f.code, f.offset) for f in res.findings])


def test_fill_ranges_and_cells() -> None:
    clean = (LAB / "llamacpp-2026-10-01/llama/fa0-unified1/seq0.clean.seqdata.bin").read_bytes()
    res = read_state(data=clean, profile=profile("llama"))
    v0 = res.sections[0].streams[0].v_layers[0]  # transposed V: columns of 7 cells
    m = parse_spec("fill:value=nan,role=v,index=0,cells=2-3").apply(clean, profile("llama"))
    assert len(m.ranges) == v0.n_embd_v_gqa and all(n == 2 * v0.el_bytes for _, n in m.ranges)
    changed = [i for i in range(len(clean)) if clean[i] != m.data[i]]
    assert changed and all(any(o <= i < o + n for o, n in m.ranges) for i in changed)
    k1 = res.sections[0].streams[0].k_layers[1]
    m = parse_spec("fill:value=zeros,role=k,index=1,cells=0").apply(clean, profile("llama"))
    assert m.ranges == ((k1.data_offset, k1.row_bytes),)
    assert m.data[k1.data_offset : k1.data_offset + k1.row_bytes] == bytes(k1.row_bytes)


def test_swap_and_dup_cell() -> None:
    clean = (LAB / "llamacpp-2026-10-01/llama/fa0-unified1/seq0.clean.seqdata.bin").read_bytes()
    res = read_state(data=clean, profile=profile("llama"))
    k0, k1 = res.sections[0].streams[0].k_layers[:2]
    m = CATALOG["swap_k_layers_0_1"].apply(clean)
    span = k0.data_size
    assert m.data[k0.data_offset : k0.data_offset + span] == clean[k1.data_offset : k1.data_offset + span]
    m = CATALOG["dup_cell_0"].apply(clean)
    dup = read_state(data=m.data, profile=profile("llama"))
    assert any(f.code == "position_anomaly" for f in dup.findings)


def test_bad_specs() -> None:
    with pytest.raises(CorruptionError):
        parse_spec("explode:now=1")
    with pytest.raises(CorruptionError):
        parse_spec("set:field")
    clean = (LAB / "llamacpp-2026-10-01/mamba/seq0.clean.seqdata.bin").read_bytes()
    with pytest.raises(CorruptionError):
        Corruption("set", {"field": "n_stream", "value": "2"}).apply(clean)
    with pytest.raises(CorruptionError):
        CATALOG["swa_cell_count_huge"].apply(clean)
