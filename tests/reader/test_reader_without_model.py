"""Without the model, every generated file of every memory class parses as it does with the model.

The rule: a file read without ``--model`` gives the same structure (sections, streams, cells and
their extensions, records, tokens, coverage) as with it, and no finding above info that the
with-model reading lacks; what only the model can tell is an info finding (``unconfirmed_end``).
The files are every one the pinned builds wrote in ``tests/data/gen-*`` and the model variants of
``tests/data/variants-*`` (qwen4exp without PLE: an indexer cache without the cell extension its
attention cache carries).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA, VARIANT_FOLDERS, entry_profile, manifest_entries
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import LayerRecord, ParseResult, Section
from kvscope.core.reader.tree import coverage

FOLDERS = ("gen-0c1e5709", "gen-b11434", *VARIANT_FOLDERS)
ENTRIES = manifest_entries(FOLDERS)
IDS = [f"{p.parent.name}/{p.name}" for p, _ in ENTRIES]
# what a reading without the model may add: that it cannot confirm the end
UNCERTAIN = {"unconfirmed_end"}


def _records(recs: list[LayerRecord]) -> list[tuple[Any, ...]]:
    return [(r.role, r.type_id, r.header_offset, r.data_offset, r.data_size, r.n_rows, r.row_bytes, r.el_bytes,
             r.n_embd_v_gqa) for r in recs]


def _section(sec: Section) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": sec.kind, "offset": sec.offset, "size": sec.size, "trusted": sec.trusted,
                           "records": _records(sec.all_layers()), "fields": sec.fields}
    if sec.kind == "kv":
        # the rotation words as written (older layouts have none; the model infers them there)
        out["streams"] = [(st.offset, st.cell_count, st.v_trans, st.n_layer,
                           None if st.n_rot_inferred or st.n_rot_k is None else (st.n_rot_k, st.n_rot_v),
                           st.cells.as_pairs() if st.cells is not None else None,
                           st.cells.ext_bytes if st.cells is not None else None,
                           st.cells.ext.tolist() if st.cells is not None and st.cells.ext is not None else None)
                          for st in sec.streams]
    elif sec.kind == "recurrent":
        out["cells"] = sec.cells.as_pairs() if sec.cells is not None else None
        out["recurrent"] = (sec.cell_count, sec.s_trans, sec.n_layer_written)
    return out


def _structure(res: ParseResult) -> dict[str, Any]:
    return {"kind": res.kind, "header": res.header, "tokens": res.tokens, "memory": (res.memory_offset,
            res.memory_end), "coverage": coverage(res.root), "sections": [_section(s) for s in res.sections]}


def test_every_memory_class_is_walked() -> None:
    classes = {e["memory_class"] for _, e in ENTRIES}
    assert {"llama_kv_cache", "llama_kv_cache_iswa", "llama_memory_recurrent", "llama_memory_hybrid",
            "llama_memory_hybrid_iswa", "llama_memory_hybrid_idx", "llama_kv_cache_dsa", "llama_kv_cache_dsa_iswa",
            "llama_kv_cache_msa", "llama_kv_cache_dsv4"} <= classes
    assert {p.parent.name for p, _ in ENTRIES} == set(FOLDERS)
    assert all((DATA / f / "manifest.json").is_file() for f in FOLDERS)


@pytest.mark.parametrize(("path", "entry"), ENTRIES, ids=IDS)
def test_without_model_as_with_model(path: Path, entry: dict[str, Any]) -> None:
    bare = read_state(path)
    full = read_state(path, profile=entry_profile(path, entry))
    assert _structure(bare) == _structure(full)
    assert bare.layout.name == full.layout.name
    known = {(f.code, f.offset) for f in full.findings}
    extra = [(f.severity, f.code, f.message) for f in bare.findings if (f.code, f.offset) not in known]
    assert all(sev == "info" and code in UNCERTAIN for sev, code, _ in extra), extra


def _kv_ext(res: ParseResult) -> list[tuple[str, int | None]]:
    return [(sec.role, st.cells.ext_bytes if st.cells is not None else None)
            for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.cell_count]


@pytest.mark.parametrize("name", ["qwen4exp-nople-f16-fa1-unified1-ctx.session",
                                  "qwen4exp-nople-f16-fa0-unified0-ctx.state.bin",
                                  "qwen4exp-nople-q8_0-fa1-unified0-seq1.seqstate",
                                  "qwen4exp-nople-f16-fa0-unified0-seq2.seqdata.bin"])
def test_indexer_without_the_cell_extension_of_its_attention_cache(name: str) -> None:
    """qwen4exp without PLE: the attention cells carry M-RoPE's 12 bytes, the indexer cells none
    (llama.cpp builds the indexer cache with rope type NONE), each section read with its own."""
    res = read_state(DATA / "variants-b11434" / name)
    assert [s.role for s in res.sections] == ["kv_attn", "recurrent", "kv_idx"]
    assert {role: ext for role, ext in _kv_ext(res)} == {"kv_attn": 12, "kv_idx": 0}
    assert res.n_errors == 0 and coverage(res.root)["parsed_bytes"] == res.size
    # the three sections are the whole hybrid-idx state (no section can follow them), and its
    # indexer holds K records only (no V record can have been cut off)
    assert not [f for f in res.findings if f.code == "unconfirmed_end"]


@pytest.mark.parametrize("folder", ["variants-b11434", "gen-b11434"])
def test_damaged_session_keeps_the_extension_its_architecture_string_fixes(folder: str) -> None:
    """A damaged qwen4exp session read without the model: its arch string is an M-RoPE one, so the
    cells carry the extension; reading them without it took token ids for n_seq_id ("cell 4:
    implausible n_seq_id ...") instead of naming the damage."""
    prefix = "qwen4exp-nople" if folder.startswith("variants") else "qwen4exp"
    path = DATA / folder / f"{prefix}-f16-fa1-unified1-ctx.session"
    clean = read_state(path)
    rec = clean.sections[1]
    assert rec.kind == "recurrent" and rec.node is not None
    s_trans = next(c for c in rec.node.children if c.name == "s_trans")
    data = bytearray(path.read_bytes())
    data[s_trans.offset : s_trans.offset + 4] = (7).to_bytes(4, "little")
    res = read_state(data=bytes(data), path=str(path))
    assert res.layout.features["cell_ext_bytes"] == 12
    assert _kv_ext(res)[0][1] == 12
    assert not [f for f in res.findings if f.code == "seq_meta_invalid"], res.findings
    assert res.n_errors and min(f.offset for f in res.findings if f.severity == "error") >= rec.offset
