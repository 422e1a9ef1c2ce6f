"""kvscope.core.modelgen: deterministic models, the committed recipes and files, the tokenizer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from kvharness.fixtures import DATA, MODELS
from kvscope.core.modelgen import load_recipe, model_keys, realistic_llama, write_model
from kvscope.core.modelgen.__main__ import main as modelgen_main
from kvscope.core.modelgen.tensor_data import tensor_values
from kvscope.core.modelgen.tokenizer import vocabulary

GEN_MODELS = DATA / "gen-models"
KEYS = model_keys()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_memory_class_has_a_model() -> None:
    classes = {load_recipe(k).memory for k in KEYS}
    assert classes == {
        "llama_kv_cache", "llama_kv_cache_iswa", "llama_memory_recurrent", "llama_memory_hybrid",
        "llama_memory_hybrid_iswa", "llama_kv_cache_dsa", "llama_kv_cache_dsa_iswa", "llama_memory_hybrid_idx",
        "llama_kv_cache_msa", "llama_kv_cache_dsv4",
    }


@pytest.mark.parametrize("key", KEYS)
def test_same_bytes_twice_and_as_committed(key: str, tmp_path: Path) -> None:
    rec = load_recipe(key)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert write_model(rec, a) == write_model(rec, b) == _sha(a) == _sha(b)
    committed = json.loads((GEN_MODELS / "models.json").read_text())["models"][key]
    assert committed["sha256"] == _sha(a), f"tests/data/gen-models/{key}.gguf is not what modelgen writes"
    assert (GEN_MODELS / committed["file"]).read_bytes() == a.read_bytes()
    assert a.stat().st_size <= 2 << 20  # 2 MiB: small enough for the repository


@pytest.mark.parametrize("key", KEYS)
def test_model_file_is_the_recipe(key: str, tmp_path: Path) -> None:
    rec = load_recipe(key)
    path = tmp_path / "m.gguf"
    write_model(rec, path)
    r = gguf.GGUFReader(path)
    assert r.fields["general.architecture"].contents() == rec.architecture
    for name, _t, value in rec.metadata:
        got = r.fields[name].contents()
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, name
    assert [(t.name, [int(x) for x in t.shape]) for t in r.tensors] == [(n, list(s)) for n, s in rec.tensors]
    for t in r.tensors:
        assert t.tensor_type.name == rec.dtype(t.name)


def test_weights_depend_on_name_and_seed_only() -> None:
    a = tensor_values("blk.0.attn_q.weight", (4, 8), seed=1)
    assert np.array_equal(a, tensor_values("blk.0.attn_q.weight", (4, 8), seed=1))
    assert not np.array_equal(a, tensor_values("blk.0.attn_q.weight", (4, 8), seed=2))
    assert not np.array_equal(a, tensor_values("blk.1.attn_q.weight", (4, 8), seed=1))
    assert (tensor_values("blk.0.ssm_a", (16,), seed=1) < 0).all()
    assert abs(float(tensor_values("blk.0.attn_norm.weight", (64,), seed=1).mean()) - 1.0) < 0.1


def test_tokenizer_is_the_old_fixture_models() -> None:
    r = gguf.GGUFReader(MODELS / "tiny-llama.gguf")
    tokens, scores, types = vocabulary()
    assert tokens == r.fields["tokenizer.ggml.tokens"].contents()
    assert scores == r.fields["tokenizer.ggml.scores"].contents()
    assert types == r.fields["tokenizer.ggml.token_type"].contents()


def test_realistic_llama_scales_the_llama_recipe() -> None:
    assert realistic_llama(n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_ctx_train=256) == load_recipe(
        "llama")
    big = realistic_llama()
    assert big.meta_value("{a}.block_count") == 12 and big.meta_value("{a}.embedding_length") == 1024
    assert dict(big.tensors)["blk.11.attn_k.weight"] == (1024, 512)
    with pytest.raises(ValueError):
        realistic_llama(n_embd=1000, n_head=16)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert modelgen_main(["--out", str(tmp_path), "--only", "mamba"]) == 0
    assert (tmp_path / "mamba.gguf").read_bytes() == (GEN_MODELS / "mamba.gguf").read_bytes()
    assert modelgen_main(["--out", str(tmp_path), "--only", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modelgen: no recipe for model 'nosuch'") and err.count("\n") == 1
