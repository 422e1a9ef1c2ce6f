"""Tests for kvscope.core.model.profile: GGUF model -> expected llama.cpp state memory layout."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvscope.core.model.gguf_metadata import read_gguf_metadata
from kvscope.core.model.profile import (
    ExpectedSection,
    ModelProfile,
    load_model_profile,
)

DATA = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
MANIFEST_MROPE = json.loads((DATA / "manifest-mrope.json").read_text())
MODELS: dict[str, dict[str, Any]] = {**MANIFEST["models"], **MANIFEST_MROPE["models"]}
MODEL_KEYS = ["llama", "mamba", "gemma2", "lfm2", "qwen2vl"]
MEMORY_CLASS = {"llama": "kv", "gemma2": "iswa", "mamba": "recurrent", "lfm2": "hybrid", "qwen2vl": "kv"}


def model_path(key: str) -> Path:
    return DATA / MODELS[key]["file"]


@pytest.fixture(scope="module")
def profiles() -> dict[str, ModelProfile]:
    return {key: load_model_profile(model_path(key)) for key in MODEL_KEYS}


# ---------------------------------------------------------------------------------------------
# Real tiny models against the manifests
# ---------------------------------------------------------------------------------------------


def test_manifests_cover_all_tiny_models() -> None:
    assert sorted(MODELS) == sorted(MODEL_KEYS)
    for key in MODEL_KEYS:
        assert model_path(key).is_file()


@pytest.mark.parametrize("key", MODEL_KEYS)
def test_tiny_model_matches_manifest_layout(key: str, profiles: dict[str, ModelProfile]) -> None:
    entry = MODELS[key]
    layout = entry["layout"]
    p = profiles[key]
    n = layout["n_layer"]

    assert p.arch == layout["arch"] == entry["hparams"]["arch"]
    assert p.path == str(model_path(key))
    assert p.n_layer == n
    assert p.n_embd == layout["n_embd"]
    assert p.n_vocab == entry["n_vocab"] == len(p.vocab)
    assert p.memory_class == MEMORY_CLASS[key]

    if "head_dim" in layout:
        assert p.head_dim_k == layout["head_dim"]
        assert p.head_dim_v == layout["head_dim"]
    if "n_head" in layout:
        assert p.n_head == (layout["n_head"],) * n
    if "n_head_kv_per_layer" in layout:
        assert list(p.n_head_kv) == layout["n_head_kv_per_layer"]
    if "n_embd_k_gqa_per_layer" in layout:
        assert [p.n_embd_k_gqa(il) for il in range(n)] == layout["n_embd_k_gqa_per_layer"]
    if "n_embd_v_gqa_per_layer" in layout:
        assert [p.n_embd_v_gqa(il) for il in range(n)] == layout["n_embd_v_gqa_per_layer"]

    assert list(p.attn_layers) == layout.get("attn_layers", [])
    assert list(p.swa_layers) == layout.get("swa_layers", [])
    assert list(p.kv_swa_layers) == layout.get("swa_layers", [])
    if "full_layers" in layout:
        assert list(p.kv_base_layers) == layout["full_layers"]
    assert p.n_swa == layout.get("n_swa", 0)
    assert list(p.recurrent_layers) == layout.get("recr_layers", [])
    assert p.n_embd_r == layout.get("n_embd_r", 0)
    assert p.n_embd_s == layout.get("n_embd_s", 0)
    assert p.n_pos_per_embd == layout.get("n_pos_per_embd", 1)
    assert p.has_cell_ext() == (layout.get("n_pos_per_embd", 1) > 1)
    assert all(p.has_v(il) for il in range(n))
    assert p.tokenizer_model == "llama"
    assert p.notes == ()

    loaded = entry["loaded_by_llama_cpp"]
    assert p.n_swa == loaded["n_swa"]
    assert (p.memory_class == "recurrent") == loaded["is_recurrent"]
    assert p.memory_class.startswith("hybrid") == loaded["is_hybrid"]
    assert p.n_head_kv[0] == loaded["n_head_kv"]
    assert p.n_head[0] == loaded["n_head"]


def test_recurrent_row_bytes_match_manifest(profiles: dict[str, ModelProfile]) -> None:
    for key in ("mamba", "lfm2"):
        layout = MODELS[key]["layout"]
        assert profiles[key].n_embd_r * 4 == layout["r_row_bytes_f32"]
        assert profiles[key].n_embd_s * 4 == layout["s_row_bytes_f32"]


def _sections(p: ModelProfile, partial: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(s.role, s.kind, s.layers) for s in p.expected_sections(partial)]


def test_expected_sections_of_tiny_models(profiles: dict[str, ModelProfile]) -> None:
    kv = ("kv", "kv", (0, 1, 2, 3))
    assert _sections(profiles["llama"], False) == [kv]
    assert _sections(profiles["llama"], True) == [kv]
    assert _sections(profiles["qwen2vl"], False) == [kv]

    base = ("kv_base", "kv", (1, 3))
    swa = ("kv_swa", "kv", (0, 2))
    assert _sections(profiles["gemma2"], False) == [base, swa]
    assert _sections(profiles["gemma2"], True) == [swa]

    recr = ("recurrent", "recurrent", (0, 1, 2))
    assert _sections(profiles["mamba"], False) == [recr]
    assert _sections(profiles["mamba"], True) == [recr]

    attn = ("kv_attn", "kv", (1, 3))
    recr2 = ("recurrent", "recurrent", (0, 2))
    assert _sections(profiles["lfm2"], False) == [attn, recr2]
    assert _sections(profiles["lfm2"], True) == [recr2]
    assert profiles["llama"].expected_sections(False)[0].head_k == (32, 32, 32, 32)


def _manifest_layouts() -> Iterator[tuple[str, dict[str, Any]]]:
    for manifest in (MANIFEST, MANIFEST_MROPE):
        for f in manifest["files"]:
            layout = f.get("expected_layout")
            if layout:
                yield f["model_key"], layout


def test_per_file_expected_layouts_agree(profiles: dict[str, ModelProfile]) -> None:
    seen = 0
    for key, layout in _manifest_layouts():
        p = profiles[key]
        rows = layout.get("k_row_bytes_per_layer")
        if rows and layout.get("kv_cache_type_k") == "f16":
            assert {int(il): 2 * p.n_embd_k_gqa(int(il)) for il in rows} == {
                int(il): b for il, b in rows.items()
            }
            seen += 1
        if "kv_cell_ext_bytes" in layout or "kv_cell_ext" in layout:
            assert p.has_cell_ext() == bool(layout.get("kv_cell_ext_bytes", layout.get("kv_cell_ext")))
    assert seen > 0


@pytest.mark.parametrize("key", MODEL_KEYS)
def test_fast_scanner_and_gguf_reader_agree(key: str) -> None:
    path = str(model_path(key))
    fast = read_gguf_metadata(path)
    ref = read_gguf_metadata(path, backend="gguf")
    assert fast.keys() == ref.keys()
    for k, v in fast.items():
        r = ref[k]
        if isinstance(v, np.ndarray):
            assert isinstance(r, np.ndarray)
            assert np.array_equal(v, r), k
        else:
            assert type(v) is type(r), k
            assert v == r, k
    assert load_model_profile(path, backend="gguf") == load_model_profile(path)


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(ValueError):
        load_model_profile(model_path("llama"), backend="nope")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------


def _manifest_token_seqs() -> Iterator[tuple[str, list[int]]]:
    for manifest in (MANIFEST, MANIFEST_MROPE):
        for f in manifest["files"]:
            for seq in (f.get("seqs") or {}).values():
                if seq.get("token_ids"):
                    yield f["model_key"], seq["token_ids"]


def test_detokenize_manifest_token_ids(profiles: dict[str, ModelProfile]) -> None:
    count = 0
    for key, ids in _manifest_token_seqs():
        p = profiles[key]
        text = p.detokenize(ids)
        assert text.strip()
        assert "<?" not in text
        for tid in ids:
            assert p.token_text(tid) is not None
        count += 1
    assert count > 10


def test_detokenize_known_sequence(profiles: dict[str, ModelProfile]) -> None:
    for p in profiles.values():
        assert p.detokenize([1, 298, 303, 308, 311]) == "<s> the quick brown fox"
        assert p.token_text(1) == "<s>"  # control token: its text
        assert p.token_text(298) == " the"
        assert p.token_text(p.n_vocab) is None
        assert p.token_text(len(p.vocab) + 100) is None
        assert p.token_text(-1) is None
        assert p.detokenize([298, p.n_vocab]) == f" the<?{p.n_vocab}>"
        assert p.detokenize([]) == ""


def _profile(**kw: Any) -> ModelProfile:
    """A hand-built profile with only the required fields (4 layers, plain KV cache)."""
    base: dict[str, Any] = dict(
        path="x.gguf",
        arch="llama",
        n_layer=4,
        n_embd=64,
        n_vocab=0,
        n_head=(4,) * 4,
        n_head_kv=(2,) * 4,
        head_dim_k=16,
        head_dim_v=16,
        n_swa=0,
        swa_layers=(),
        recurrent_layers=(),
        n_embd_r=0,
        n_embd_s=0,
        n_pos_per_embd=1,
        memory_class="kv",
        vocab=(),
        tokenizer_model="",
    )
    base.update(kw)
    if "vocab" in kw and "n_vocab" not in kw:
        base["n_vocab"] = len(kw["vocab"])
    return ModelProfile(**base)


def test_sentencepiece_byte_tokens() -> None:
    vocab = ("<unk>", "<s>", "<0xE2>", "<0x82>", "<0xAC>", "<0x41>", "<0x0A>", "<0x00>", "▁cost", "s")
    p = _profile(vocab=vocab, tokenizer_model="llama")
    assert p.detokenize([8, 9, 2, 3, 4]) == " costs€"
    assert p.detokenize([1, 5, 6]) == "<s>A\n"
    assert p.token_text(2) == "<0xE2>"  # half a character: keeps its token text
    assert p.token_text(5) == "A"
    assert p.token_text(6) == "\n"
    assert p.token_text(7) == "<0x00>"  # control character: keeps its token text
    assert p.token_text(8) == " cost"
    assert p.detokenize([2, 8]) == "\ufffd cost"


def _gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table, written out independently of the module under test."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def test_gpt2_byte_level_detokenize() -> None:
    enc = _gpt2_bytes_to_unicode()

    def piece(text: str) -> str:
        return "".join(enc[b] for b in text.encode("utf-8"))

    ri = "日".encode()
    vocab = (
        piece("Hello"),
        piece(" world"),
        piece("\n"),
        "<|endoftext|>",
        enc[ri[0]],
        enc[ri[1]] + enc[ri[2]],
        "<|im start|>",
        "Ġ",
    )
    assert vocab[1] == "Ġworld" and vocab[2] == "Ċ"
    types = (1, 1, 1, 3, 1, 1, 4, 1)
    p = _profile(vocab=vocab, token_types=types, tokenizer_model="gpt2")
    assert p.detokenize([0, 1, 2, 3, 4, 5]) == "Hello world\n<|endoftext|>日"
    assert p.token_text(1) == " world"
    assert p.token_text(3) == "<|endoftext|>"
    assert p.token_text(4) == "\\xe6"
    assert p.token_text(6) == "<|im start|>"  # user-defined: verbatim, the space survives
    assert p.token_text(7) == " "
    # stray continuation bytes, then an unfinished lead byte: replacement characters, no exception
    assert set(p.detokenize([5, 4])) == {"\ufffd"}


def test_bert_wordpiece_detokenize() -> None:
    p = _profile(vocab=("[CLS]", "play", "##ing", "ball"), token_types=(3, 1, 1, 1), tokenizer_model="bert")
    assert p.detokenize([1, 2, 3]) == "playing ball"


def test_profile_is_frozen_and_repr_is_small(profiles: dict[str, ModelProfile]) -> None:
    p = profiles["llama"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n_layer = 5  # type: ignore[misc]
    assert "quick" not in repr(p)
    assert len(repr(p)) < 1500
    with pytest.raises(IndexError):
        p.n_embd_k_gqa(4)
    with pytest.raises(IndexError):
        p.n_embd_v_gqa(-1)


def test_hand_built_profiles_derive_layers() -> None:
    hybrid = _profile(
        n_head_kv=(0, 2, 0, 2),
        recurrent_layers=(0, 2),
        memory_class="hybrid_iswa",
        swa_layers=(1,),
        n_swa=16,
    )
    assert hybrid.attn_layers == (1, 3)
    assert hybrid.kv_base_layers == (3,)
    assert hybrid.kv_swa_layers == (1,)
    assert _sections(hybrid, False) == [
        ("kv_base", "kv", (3,)),
        ("kv_swa", "kv", (1,)),
        ("recurrent", "recurrent", (0, 2)),
    ]
    assert _sections(hybrid, True) == [
        ("kv_swa", "kv", (1,)),
        ("recurrent", "recurrent", (0, 2)),
    ]
    assert hybrid.expected_sections(False)[0] == ExpectedSection("kv_base", "kv", (3,), partial_keep=False)
    assert _profile(memory_class="none").expected_sections(False) == []
    assert _profile(memory_class="none").expected_sections(True) == []
    assert not _profile().has_cell_ext()
    assert _profile(n_pos_per_embd=4).has_cell_ext()


def test_no_qt_or_torch_import() -> None:
    code = (
        "import sys, kvscope.core.model.profile;"
        "roots = ('PySide6', 'PyQt5', 'PyQt6', 'torch', 'pyqtgraph');"
        "bad = [m for m in sys.modules if m.split('.')[0] in roots];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
