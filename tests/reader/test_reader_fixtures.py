"""Every real fixture (the model variants of tests/data/variants-* too) parses to exactly what its manifest
says, with and without the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import FOLDER_GENERATION, KIND, VARIANT_FOLDERS, entry_profile, manifest_entries
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section
from kvscope.core.reader.tree import check_tiling, coverage

# every check over every real fixture (3,928 cases); test_reader_without_model stays in the fast loop
pytestmark = pytest.mark.slow

ENTRIES = manifest_entries() + manifest_entries(VARIANT_FOLDERS)
IDS = [f"{p.parent.name}/{p.name}" for p, _ in ENTRIES]


def _layers_k(recs: list[LayerRecord]) -> list[dict[str, Any]]:
    return [{"type": r.type, "row_bytes": r.row_bytes} for r in recs]


def _layers_v(recs: list[LayerRecord]) -> list[dict[str, Any]]:
    return [
        {"type": r.type, "el_bytes": r.el_bytes, "n_embd_v_gqa": r.n_embd_v_gqa}
        if r.transposed
        else {"type": r.type, "row_bytes": r.row_bytes}
        for r in recs
    ]


# The generator names DeepSeek-V4's parts as llama.cpp's source does; kvscope's roles say which
# kv_raw half and which kind of block each one is.
DSV4_ROLES = {"kv_base": "kv_raw_base", "kv_swa": "kv_raw_swa", "kv_csa": "kcache_csa", "kv_hca": "kcache_hca",
              "kv_lid": "kcache_lid", "csa_state": "comp_csa", "hca_state": "comp_hca", "lid_state": "comp_lid",
              "dsv4_header": "dsv4"}
KINDS = {"kv": "kv", "recurrent": "recurrent", "dsv4_header": "dsv4_header", "dsv4_k_cache": "dsv4_kcache",
         "dsv4_comp_state": "dsv4_comp"}


def _check_stream(mine: KvStream, want: dict[str, Any]) -> None:
    assert mine.cell_count == want["cell_count"]
    if "cell_count_offset" in want:
        assert mine.offset == want["cell_count_offset"]
    if want["cell_count"] == 0 and "v_trans" not in want:
        return
    assert mine.v_trans == want["v_trans"]
    assert mine.n_layer == want["n_layer"]
    if "n_rot_k" in want:  # v4: the rotation words as written
        assert (mine.n_rot_k, mine.n_rot_v, mine.n_rot_inferred) == (want["n_rot_k"], want["n_rot_v"], False)
    assert _layers_k(mine.k_layers) == want["k_layers"]
    assert _layers_v(mine.v_layers) == want["v_layers"]
    assert mine.cells is not None or want["cell_count"] == 0
    got_cells = mine.cells.as_pairs() if mine.cells is not None else []
    assert got_cells == [[c[0], c[1]] for c in want["cells_pos_seqids"]]
    if "k_data_offsets" in want:
        assert [r.data_offset for r in mine.k_layers] == want["k_data_offsets"]
        assert [r.data_offset for r in mine.v_layers] == want["v_data_offsets"]
    if "cell_ext_values" in want:
        assert mine.cells is not None and mine.cells.ext is not None
        assert mine.cells.ext_bytes == want["cell_ext_bytes"]
        assert mine.cells.ext.tolist() == want["cell_ext_values"]


def _check_block(sec: Section, part: dict[str, Any]) -> None:
    """A DeepSeek-V4 header, K-cache or compressor block: its words and tensor-stream records."""
    for key in ("version", "mode", "n_rows", "ns", "n_layer", "ratio", "state_size", "n_embd_state"):
        if key in part:
            assert sec.fields[key] == part[key], key
    want: list[dict[str, Any]] = []
    for layer in part.get("layers", []):
        want += [layer[r] for r in ("kv", "score")] if "kv" in layer else [layer]
        for rec in ([layer["kv"], layer["score"]] if "kv" in layer else [layer]):
            rec.setdefault("il", layer["il"])
    got = [{"il": r.il, "type": r.type, "row_size": r.row_bytes, "data_offset": r.data_offset,
            "rows": r.n_rows // max(1, sec.fields.get("ns", 1))} for r in sec.records]
    assert got == [{k: w[k] for k in ("il", "type", "row_size", "data_offset", "rows")} for w in want]


def _check_section(sec: Section, part: dict[str, Any], with_model: bool, dsv4: bool) -> None:
    kind = KINDS[part.get("kind", "recurrent" if part["name"] == "recurrent" else "kv")]
    assert sec.kind == kind
    role = DSV4_ROLES[part["name"]] if dsv4 else part["name"]
    if with_model or sec.role_certain or dsv4:
        assert sec.role == role
    assert sec.offset == part["offset"]
    assert sec.offset + sec.size == part["end"]
    if kind.startswith("dsv4"):
        _check_block(sec, part)
        return
    if kind == "kv":
        assert sec.n_stream == part["n_stream"]
        assert len(sec.streams) == len(part["streams"])
        for mine, want in zip(sec.streams, part["streams"], strict=True):
            _check_stream(mine, want)
    else:
        assert sec.cell_count == part["cell_count"]
        assert sec.s_trans == part["s_trans"]
        assert sec.n_layer_written == part["n_layer_written"]
        assert _layers_k(sec.r_layers) == part["r_layers"]
        assert _layers_k(sec.s_layers) == part["s_layers"]
        assert [r.row_bytes for r in sec.p_layers] == [p["row_bytes"] for p in part.get("p_layers", [])]
        if with_model:
            assert [r.il for r in sec.p_layers] == [p["il"] for p in part.get("p_layers", [])]
        cells = sec.cells.as_pairs() if sec.cells is not None else []
        assert cells == [[c[0], c[1]] for c in part["cells_pos_seqids"]]


def _expected_tokens(entry: dict[str, Any]) -> list[int]:
    raw = entry["token_payload"]["tokens"] or []
    if raw and raw[0] == -1:  # llama-server packed payload: [-1, version, n, tokens...]
        return list(raw[3 : 3 + raw[2]])
    return list(raw)


def _check(res: ParseResult, path: Path, entry: dict[str, Any], with_model: bool) -> None:
    assert res.kind == KIND[entry["kind"]]
    assert [f for f in res.findings if f.severity == "error"] == []
    cov = coverage(res.root)
    assert cov["unparsed_bytes"] == 0 and cov["trailing_bytes"] == 0 and cov["untrusted_bytes"] == 0
    assert check_tiling(res.root) == []
    gp = entry["generator_parse"]
    hdr = gp.get("header", {})
    for key in ("magic", "version", "n_token_count", "io_magic", "seq_id"):
        if key in hdr:
            assert res.header[key] == hdr[key], key
    if "arch_string" in hdr:
        assert res.header["arch"] == hdr["arch_string"]
    assert res.memory_offset == hdr["memory_offset"]
    assert res.tokens == _expected_tokens(entry)
    assert len(res.sections) == len(gp["parts"])
    dsv4 = any(p.get("kind") == "dsv4_header" for p in gp["parts"])
    for sec, part in zip(res.sections, gp["parts"], strict=True):
        _check_section(sec, part, with_model, dsv4)
    want_gen = FOLDER_GENERATION[path.parent.name]
    names = {res.layout.name} | {a["name"] for a in res.layout.alternatives if a["indistinguishable"]}
    assert want_gen in names, (res.layout.name, res.layout.alternatives)
    if with_model and entry.get("flags") == 1:
        p = entry_profile(path, entry)
        if p.expected_sections(True) != p.expected_sections(False) and want_gen != "2025-08":
            assert res.partial


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=IDS)
def test_fixture_with_model(path: Path, entry: dict[str, Any]) -> None:
    res = read_state(path, profile=entry_profile(path, entry))
    _check(res, path, entry, with_model=True)


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=IDS)
def test_fixture_without_model(path: Path, entry: dict[str, Any]) -> None:
    res = read_state(path)
    _check(res, path, entry, with_model=False)
