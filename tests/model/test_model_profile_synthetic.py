"""Model profiles of synthetic GGUFs (the architecture table) and errors on bad GGUF files."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from kvharness.fixtures import model_path
from kvscope.core.model.profile import (
    ModelProfile,
    ModelProfileError,
    load_model_profile,
)

DATA = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"



# ---------------------------------------------------------------------------------------------
# Synthetic GGUF models (architecture table)
# ---------------------------------------------------------------------------------------------

U32 = gguf.GGUFValueType.UINT32


def write_gguf(
    path: Path,
    arch: str,
    n_layer: int,
    *,
    n_embd: int = 64,
    n_head: int | Sequence[int] | None = 4,
    n_head_kv: int | Sequence[int] | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
    kv: dict[str, Any] | None = None,
    tokens: Sequence[str] | None = None,
    tokenizer: str = "llama",
    endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
) -> Path:
    """Write a metadata-only GGUF (one tiny tensor) for the profile loader."""
    w = gguf.GGUFWriter(str(path), arch, endianess=endian)
    w.add_block_count(n_layer)
    w.add_embedding_length(n_embd)
    w.add_context_length(256)
    if n_head is not None:
        w.add_head_count(n_head if isinstance(n_head, int) else list(n_head))
    if n_head_kv is not None:
        w.add_head_count_kv(n_head_kv if isinstance(n_head_kv, int) else list(n_head_kv))
    for key, value in (kv or {}).items():
        full = key.format(arch=arch)
        if isinstance(value, bool):
            w.add_bool(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            w.add_array(full, list(value))
    if extra is not None:
        extra(w)
    w.add_tokenizer_model(tokenizer)
    w.add_token_list(list(tokens) if tokens is not None else ["<unk>", "<s>", "</s>", "▁a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def load(path: Path) -> ModelProfile:
    fast = load_model_profile(path)
    assert load_model_profile(path, backend="gguf") == fast
    return fast


def test_gemma3_swa_pattern_6(tmp_path: Path) -> None:
    p = load(
        write_gguf(
            tmp_path / "g3.gguf", "gemma3", 12, n_head_kv=1, kv={"{arch}.attention.sliding_window": 512}
        )
    )
    assert p.memory_class == "iswa"
    assert p.n_swa == 512
    assert p.swa_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert p.kv_base_layers == (5, 11)
    assert [(s.role, s.layers) for s in p.expected_sections(True)] == [("kv_swa", p.swa_layers)]


def test_gemma2_default_window_and_cohere2(tmp_path: Path) -> None:
    p = load(write_gguf(tmp_path / "g2.gguf", "gemma2", 6))
    assert (p.n_swa, p.swa_layers, p.memory_class) == (4096, (0, 2, 4), "iswa")
    c = load(write_gguf(tmp_path / "c2.gguf", "cohere2", 8, kv={"{arch}.attention.sliding_window": 4096}))
    assert c.swa_layers == (0, 1, 2, 4, 5, 6)


def test_sliding_window_pattern_key_overrides_table(tmp_path: Path) -> None:
    flags = [True, False, False, True, True, False]
    p = load(
        write_gguf(
            tmp_path / "a.gguf",
            "gemma3",
            6,
            kv={"{arch}.attention.sliding_window": 128, "{arch}.attention.sliding_window_pattern": flags},
        )
    )
    assert p.swa_layers == (0, 3, 4)
    assert p.kv_base_layers == (1, 2, 5)
    # a period on an architecture the table does not know
    q = load(
        write_gguf(
            tmp_path / "b.gguf",
            "afmoe",
            6,
            kv={"{arch}.attention.sliding_window": 64, "{arch}.attention.sliding_window_pattern": 3},
        )
    )
    assert (q.memory_class, q.n_swa, q.swa_layers) == ("iswa", 64, (0, 1, 3, 4))
    with pytest.raises(ModelProfileError, match="entries"):
        load_model_profile(
            write_gguf(
                tmp_path / "c.gguf",
                "gemma3",
                6,
                kv={"{arch}.attention.sliding_window": 8, "{arch}.attention.sliding_window_pattern": [True]},
            )
        )


def test_swa_special_cases(tmp_path: Path) -> None:
    phi3 = load(write_gguf(tmp_path / "phi3.gguf", "phi3", 4, kv={"{arch}.attention.sliding_window": 2047}))
    assert (phi3.memory_class, phi3.n_swa, phi3.swa_layers) == ("kv", 0, ())
    l4 = load(write_gguf(tmp_path / "l4.gguf", "llama4", 8))
    assert (l4.memory_class, l4.n_swa, l4.swa_layers) == ("iswa", 8192, (0, 1, 2, 4, 5, 6))
    l4off = load(write_gguf(tmp_path / "l4b.gguf", "llama4", 8, kv={"{arch}.attention.sliding_window": 0}))
    assert (l4off.memory_class, l4off.swa_layers) == ("kv", ())
    olmo = load(write_gguf(tmp_path / "o.gguf", "olmo2", 8))
    assert olmo.memory_class == "kv"
    olmo_swa = load(
        write_gguf(tmp_path / "o2.gguf", "olmo2", 8, kv={"{arch}.attention.sliding_window": 4096})
    )
    assert olmo_swa.swa_layers == (0, 1, 2, 4, 5, 6)
    st = load(write_gguf(tmp_path / "st.gguf", "smallthinker", 8, kv={"{arch}.attention.sliding_window": 1}))
    assert (st.n_swa, st.swa_layers) == (4096, (1, 2, 3, 5, 6, 7))  # dense first
    ex = load(write_gguf(tmp_path / "ex.gguf", "exaone4", 30))
    assert ex.memory_class == "kv"
    plain = load(write_gguf(tmp_path / "q.gguf", "qwen2", 4, kv={"{arch}.attention.sliding_window": 4096}))
    assert plain.memory_class == "kv"


def test_gemma3n_shared_kv_and_nextn_layers(tmp_path: Path) -> None:
    g = load(write_gguf(tmp_path / "g.gguf", "gemma3n", 30, kv={"{arch}.attention.sliding_window": 512}))
    assert g.attn_layers == tuple(range(20))
    assert g.kv_base_layers == (4, 9, 14, 19)
    s = load(
        write_gguf(
            tmp_path / "s.gguf",
            "gemma3n",
            10,
            kv={"{arch}.attention.sliding_window": 512, "{arch}.attention.shared_kv_layers": 4},
        )
    )
    assert s.attn_layers == tuple(range(6))
    m = load(write_gguf(tmp_path / "m.gguf", "glm4moe", 5, kv={"{arch}.nextn_predict_layers": 1}))
    assert m.attn_layers == (0, 1, 2, 3)


def test_swa_head_sizes(tmp_path: Path) -> None:
    p = load(
        write_gguf(
            tmp_path / "g4.gguf",
            "gemma4",
            4,
            n_head_kv=2,
            kv={
                "{arch}.attention.sliding_window": 512,
                "{arch}.attention.sliding_window_pattern": [True, False, True, False],
                "{arch}.attention.key_length": 128,
                "{arch}.attention.value_length": 128,
                "{arch}.attention.key_length_swa": 64,
                "{arch}.attention.value_length_swa": 32,
            },
        )
    )
    assert p.memory_class == "iswa"
    assert [p.n_embd_k_gqa(il) for il in range(4)] == [128, 256, 128, 256]
    assert [p.n_embd_v_gqa(il) for il in range(4)] == [64, 256, 64, 256]


def test_mamba2_and_rwkv_state_sizes(tmp_path: Path) -> None:
    ssm = {
        "{arch}.ssm.conv_kernel": 4,
        "{arch}.ssm.inner_size": 256,
        "{arch}.ssm.state_size": 16,
        "{arch}.ssm.group_count": 2,
        "{arch}.ssm.time_step_rank": 8,
    }
    m2 = load(write_gguf(tmp_path / "m2.gguf", "mamba2", 3, n_head=None, kv=ssm))
    assert m2.memory_class == "recurrent"
    assert m2.recurrent_layers == (0, 1, 2)
    assert m2.attn_layers == ()
    assert m2.n_embd_r == 3 * (256 + 2 * 2 * 16)
    assert m2.n_embd_s == 16 * 256
    assert m2.head_dim_k == 0

    r6 = load(write_gguf(tmp_path / "r6.gguf", "rwkv6", 2, n_head=None, kv={"{arch}.wkv.head_size": 64}))
    assert (r6.memory_class, r6.n_embd_r, r6.n_embd_s) == ("recurrent", 2 * 64, 64 * 64)
    r7 = load(
        write_gguf(
            tmp_path / "r7.gguf",
            "rwkv7",
            2,
            n_head=None,
            kv={"{arch}.wkv.head_size": 64, "{arch}.token_shift_count": 1},
        )
    )
    assert (r7.n_embd_r, r7.n_embd_s) == (64, 64 * 64)


def test_hybrid_architectures(tmp_path: Path) -> None:
    ssm = {"{arch}.ssm.conv_kernel": 4, "{arch}.ssm.inner_size": 128, "{arch}.ssm.state_size": 16}
    jamba = load(write_gguf(tmp_path / "j.gguf", "jamba", 8, n_head_kv=[0, 0, 0, 8, 0, 0, 0, 8], kv=ssm))
    assert jamba.memory_class == "hybrid"
    assert jamba.attn_layers == (3, 7)
    assert jamba.recurrent_layers == (0, 1, 2, 4, 5, 6)
    assert (jamba.n_embd_r, jamba.n_embd_s) == (3 * 128, 16 * 128)
    assert jamba.n_embd_k_gqa(3) == 8 * 16 and jamba.n_embd_k_gqa(0) == 0

    gh = load(write_gguf(tmp_path / "gh.gguf", "granitehybrid", 4, n_head_kv=[0, 4, 0, 0], kv=ssm))
    assert (gh.attn_layers, gh.recurrent_layers) == ((1,), (0, 2, 3))

    def nemotron_ff(w: gguf.GGUFWriter) -> None:
        w.add_feed_forward_length([0, 512, 0, 512])

    nh = load(
        write_gguf(tmp_path / "nh.gguf", "nemotron_h", 4, n_head_kv=[0, 0, 4, 0], kv=ssm, extra=nemotron_ff)
    )
    assert nh.recurrent_layers == (0,)  # no kv heads and no MLP
    assert nh.attn_layers == (2,)  # MLP-only layers 1 and 3 hold neither
    assert nh.n_ff == (0, 512, 0, 512)

    fh = load(write_gguf(tmp_path / "fh.gguf", "falcon-h1", 3, n_head_kv=2, kv=ssm))
    assert fh.memory_class == "hybrid"
    assert fh.attn_layers == (0, 1, 2) and fh.recurrent_layers == (0, 1, 2)

    qn = load(write_gguf(tmp_path / "qn.gguf", "qwen3next", 8, n_head_kv=2, kv=ssm))
    assert qn.attn_layers == (3, 7)
    assert qn.recurrent_layers == (0, 1, 2, 4, 5, 6)
    assert qn.n_pos_per_embd == 1

    q35 = load(
        write_gguf(
            tmp_path / "q35.gguf", "qwen35", 4, n_head_kv=2, kv={**ssm, "{arch}.full_attention_interval": 2}
        )
    )
    assert (q35.attn_layers, q35.recurrent_layers) == ((1, 3), (0, 2))
    assert q35.n_pos_per_embd == 4 and q35.has_cell_ext()

    lfm_swa = load(
        write_gguf(
            tmp_path / "lfm.gguf",
            "lfm2",
            4,
            n_head_kv=[0, 2, 0, 2],
            kv={
                "{arch}.shortconv.l_cache": 3,
                "{arch}.attention.sliding_window": 64,
                "{arch}.attention.sliding_window_pattern": [False, True, False, False],
            },
        )
    )
    assert lfm_swa.memory_class == "hybrid_iswa"
    # lfm2's load_hparams makes every attention layer SWA when sliding_window > 0 and never reads
    # sliding_window_pattern (src/models/lfm2.cpp of both pinned trees): the base cache is empty
    assert [(s.role, s.kind, s.layers) for s in lfm_swa.expected_sections(False)] == [
        ("kv_base", "kv", ()),
        ("kv_swa", "kv", (1, 3)),
        ("recurrent", "recurrent", (0, 2)),
    ]
    assert lfm_swa.n_embd_r == 64 * 2 and lfm_swa.n_embd_s == 0


def test_unknown_architecture_guesses(tmp_path: Path) -> None:
    ssm = {"{arch}.ssm.conv_kernel": 4, "{arch}.ssm.inner_size": 128, "{arch}.ssm.state_size": 16}
    h = load(write_gguf(tmp_path / "h.gguf", "newhybrid", 4, n_head_kv=[0, 2, 0, 2], kv=ssm))
    assert h.memory_class == "hybrid"
    assert h.recurrent_layers == (0, 2)
    assert any("guessed" in note for note in h.notes)
    plain = load(write_gguf(tmp_path / "p.gguf", "newdense", 3, n_head=[4, 0, 4], n_head_kv=[2, 0, 2]))
    assert plain.memory_class == "kv"
    assert plain.attn_layers == (0, 1, 2)  # llama_kv_cache keeps all layers, even head-less ones
    assert plain.n_embd_k_gqa(1) == 0


def test_mla_mrope_ple_and_no_memory(tmp_path: Path) -> None:
    mla = load(
        write_gguf(
            tmp_path / "ds.gguf",
            "deepseek2",
            2,
            n_head=16,
            n_head_kv=1,
            kv={
                "{arch}.attention.key_length": 576,
                "{arch}.attention.value_length": 512,
                "{arch}.attention.key_length_mla": 192,
                "{arch}.attention.value_length_mla": 128,
            },
        )
    )
    assert mla.is_mla and not mla.has_v(0) and not mla.has_v(1)
    assert mla.n_embd_k_gqa(0) == 576
    assert any("MLA" in note for note in mla.notes)

    vl = load(write_gguf(tmp_path / "vl.gguf", "qwen3vl", 2))
    assert vl.n_pos_per_embd == 4 and vl.has_cell_ext()
    glm_sections = {"{arch}.rope.dimension_sections": [8, 12, 12, 0]}
    assert load(write_gguf(tmp_path / "glm.gguf", "glm4", 2, kv=glm_sections)).n_pos_per_embd == 4
    assert load(write_gguf(tmp_path / "glm2.gguf", "glm4", 2)).n_pos_per_embd == 1

    ple = load(write_gguf(tmp_path / "ple.gguf", "llama", 2, kv={"{arch}.ple.layers": [1]}))
    assert ple.has_ple and ple.has_cell_ext() and ple.n_pos_per_embd == 1

    bert = load(
        write_gguf(tmp_path / "bert.gguf", "bert", 2, tokens=["[CLS]", "hi", "##s"], tokenizer="bert")
    )
    assert bert.memory_class == "none"
    assert bert.expected_sections(False) == [] and bert.attn_layers == ()
    assert bert.detokenize([1, 2]) == "his"

    mla_kv = {"{arch}.attention.key_length": 576, "{arch}.attention.value_length": 512,
              "{arch}.attention.key_length_mla": 192, "{arch}.attention.value_length_mla": 128,
              "{arch}.attention.indexer.key_length": 128}
    dsa = load(write_gguf(tmp_path / "d32.gguf", "deepseek32", 2, n_head=1, n_head_kv=1, kv=mla_kv))
    assert dsa.memory_class == "dsa"
    mla_sec, lid = dsa.expected_sections(False)
    assert (mla_sec.role, mla_sec.layers, mla_sec.k_only, mla_sec.rotation) == ("kv_mla", (0, 1), True, "never")
    assert (lid.role, lid.k_elems, lid.k_only, lid.rotation) == ("kv_lid", (128, 128), True, "always")
    assert dsa.expected_sections(True) == dsa.expected_sections(False)  # DSA ignores PARTIAL_ONLY


def test_head_defaults(tmp_path: Path) -> None:
    p = load(write_gguf(tmp_path / "a.gguf", "llama", 3, n_embd=96, n_head=[6, 6, 6]))
    assert p.n_head == (6, 6, 6) and p.n_head_kv == (6, 6, 6)  # head_count_kv defaults to head_count
    assert p.head_dim_k == p.head_dim_v == 16
    q = load(write_gguf(tmp_path / "b.gguf", "llama", 2, n_embd=64, kv={"{arch}.attention.key_length": 24}))
    assert (q.head_dim_k, q.head_dim_v) == (24, 16)  # llama.cpp: V defaults to n_embd / n_head


def test_big_endian_gguf(tmp_path: Path) -> None:
    le = load(write_gguf(tmp_path / "le.gguf", "gemma2", 4, n_head_kv=[1, 2, 1, 2]))
    be = load(
        write_gguf(tmp_path / "be.gguf", "gemma2", 4, n_head_kv=[1, 2, 1, 2], endian=gguf.GGUFEndian.BIG)
    )
    assert dataclasses.replace(be, path=le.path) == le
    assert be.n_head_kv == (1, 2, 1, 2)


def test_large_vocabulary_is_fast(tmp_path: Path) -> None:
    """A guard against a per-token cost that grows with the vocabulary (a generous bound: a loaded machine
    must not fail it; a quadratic load of 150,000 tokens takes minutes)."""
    n = 150_000
    tokens = [f"Ġtok{i}" for i in range(n)]
    path = write_gguf(tmp_path / "big.gguf", "qwen2", 2, tokens=tokens, tokenizer="gpt2")
    t0 = time.perf_counter()
    p = load_model_profile(path)
    elapsed = time.perf_counter() - t0
    assert len(p.vocab) == p.n_vocab == n
    assert elapsed < 30.0, f"loading a {n}-token vocabulary took {elapsed:.2f}s"
    assert p.detokenize([0, 149_999]) == " tok0 tok149999"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def assert_clean_error(path: Path, backend: str = "fast") -> str:
    with pytest.raises(ModelProfileError) as info:
        load_model_profile(path, backend=backend)  # type: ignore[arg-type]
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("backend", ["fast", "gguf"])
def test_non_gguf_and_unreadable_files(tmp_path: Path, backend: str) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("this is not a model\n" * 10)
    msg = assert_clean_error(text, backend)
    assert "notes.txt" in msg
    if backend == "fast":
        assert "not a GGUF" in msg
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_clean_error(empty, backend)
    assert_clean_error(tmp_path / "missing.gguf", backend)
    assert_clean_error(tmp_path, backend)  # a directory
    state = DATA / "llama-f16-fa0-unified0-seq0.seqstate"
    assert_clean_error(state, backend)


def _metadata_end(path: Path) -> int:
    reader = gguf.GGUFReader(path)
    return max(f.offset + sum(int(p.nbytes) for p in f.parts) for f in reader.fields.values())


@pytest.mark.parametrize("backend", ["fast", "gguf"])
def test_truncated_gguf(tmp_path: Path, backend: str) -> None:
    src = model_path("lfm2")
    blob = src.read_bytes()
    end = _metadata_end(src)
    assert 24 < end < len(blob)
    cuts = sorted({4, 8, 16, 23, 24, 30, 40, 100, end // 3, end // 2, end - 1, *range(200, end, 173)})
    for cut in cuts:
        if cut >= end:
            continue
        part = tmp_path / f"cut{cut}.gguf"
        part.write_bytes(blob[:cut])
        assert_clean_error(part, backend)
    # cuts past the metadata: the fast scanner never reads tensors; GGUFReader may or may not mind
    for cut in (end + 1, (end + len(blob)) // 2, len(blob) - 1):
        part = tmp_path / f"late{cut}.gguf"
        part.write_bytes(blob[:cut])
        try:
            p = load_model_profile(part, backend=backend)  # type: ignore[arg-type]
        except ModelProfileError as e:
            assert backend == "gguf" and "\n" not in str(e)
        else:
            assert p.memory_class == "hybrid"


def raw_gguf(
    path: Path, kvs: Sequence[tuple[str, int, bytes]], *, version: int = 3, kv_count: int | None = None
) -> Path:
    """Hand-assembled GGUF header: (key, value type, encoded value) triples, no tensors."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, 0, len(kvs) if kv_count is None else kv_count)
    for key, vtype, payload in kvs:
        kb = key.encode()
        out += struct.pack("<Q", len(kb)) + kb + struct.pack("<I", vtype) + payload
    path.write_bytes(bytes(out))
    return path


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


T_STR = int(gguf.GGUFValueType.STRING)
T_U32 = int(gguf.GGUFValueType.UINT32)
T_ARR = int(gguf.GGUFValueType.ARRAY)


def test_header_errors(tmp_path: Path) -> None:
    arch = ("general.architecture", T_STR, s("llama"))
    layers = ("llama.block_count", T_U32, u32(2))
    embd = ("llama.embedding_length", T_U32, u32(64))

    ok = load_model_profile(raw_gguf(tmp_path / "ok.gguf", [arch, layers, embd]))
    assert ok.n_layer == 2 and ok.vocab == () and ok.n_vocab == 0 and ok.tokenizer_model == ""
    assert ok.head_dim_k == 0 and ok.attn_layers == (0, 1)

    msg = assert_clean_error(raw_gguf(tmp_path / "a.gguf", [layers, embd]))
    assert "general.architecture" in msg
    msg = assert_clean_error(raw_gguf(tmp_path / "b.gguf", [arch, embd]))
    assert "llama.block_count" in msg
    msg = assert_clean_error(raw_gguf(tmp_path / "c.gguf", [arch, layers]))
    assert "llama.embedding_length" in msg
    msg = assert_clean_error(
        raw_gguf(tmp_path / "d.gguf", [arch, ("llama.block_count", T_STR, s("two")), embd])
    )
    assert "expected an integer" in msg
    assert "version" in assert_clean_error(raw_gguf(tmp_path / "e.gguf", [arch, layers, embd], version=1))
    assert "version" in assert_clean_error(raw_gguf(tmp_path / "f.gguf", [arch, layers, embd], version=99))
    assert "duplicate" in assert_clean_error(raw_gguf(tmp_path / "g.gguf", [arch, layers, layers, embd]))
    assert_clean_error(raw_gguf(tmp_path / "h.gguf", [arch, layers, embd], kv_count=1 << 40))
    assert_clean_error(raw_gguf(tmp_path / "i.gguf", [arch, ("llama.block_count", 77, u32(2)), embd]))
    huge_string = ("general.name", T_STR, struct.pack("<Q", 1 << 50) + b"x")
    assert "truncated" in assert_clean_error(raw_gguf(tmp_path / "j.gguf", [arch, huge_string, layers, embd]))
    huge_array = ("tokenizer.ggml.tokens", T_ARR, u32(T_STR) + struct.pack("<Q", 1 << 40))
    assert "truncated" in assert_clean_error(raw_gguf(tmp_path / "k.gguf", [arch, layers, embd, huge_array]))
    wrong_len = ("llama.attention.head_count_kv", T_ARR, u32(T_U32) + struct.pack("<Q", 3) + u32(1) * 3)
    assert "entries" in assert_clean_error(raw_gguf(tmp_path / "l.gguf", [arch, layers, embd, wrong_len]))
    clip = ("general.architecture", T_STR, s("clip"))
    assert "projector" in assert_clean_error(raw_gguf(tmp_path / "m.gguf", [clip]))


def test_copy_of_model_loads_from_pathlike(tmp_path: Path) -> None:
    dst = tmp_path / "copy.gguf"
    shutil.copyfile(model_path("gemma2"), dst)
    p = load_model_profile(dst)
    assert p.path == str(dst)
    assert p.swa_layers == (0, 2)
