"""Every generated model loads and decodes in both pinned llama.cpp builds, and its state has the
layout of its memory class (the walker consumes every byte of a per-sequence blob and the whole
context state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixture_scenarios import MODELS, plan
from state_walker import walk

from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.modelgen import load_recipe, write_model

ROT_FIELDS = {"0c1e5709": False, "b11434": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for key in MODELS:
        write_model(load_recipe(key), d / f"{key}.gguf")
    return d


@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("build", sorted(ROT_FIELDS))
def test_loads_and_decodes(key: str, build: str, model_dir: Path, pinned_builds: dict[str, InstalledBuild]) -> None:
    rec = load_recipe(key)
    cp = CtxParams(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, kv_unified=False, flash_attn=True,
                   type_k="q8_0", type_v="q8_0")
    with LlamaProcess(model_dir / f"{key}.gguf", cp, build=build) as p:
        assert p.info()["architecture"] == rec.architecture
        for sid, toks in ((0, [1, 5, 9, 30, 77, 120, 200]), (1, [1, 300, 11])):
            out = p.decode(sid, toks)
            assert out.ok and out.rc == 0, out.summary()
            assert out.value is not None and out.value.shape == (379,) and np.isfinite(out.value).all()
        blob = p.state_seq_get_data(0)
        layout = walk(blob, "seq_blob", plan(rec, ROT_FIELDS[build], 0))
        assert layout["parts"][-1]["end"] == len(blob) == p.state_seq_get_size(0)
        ctx = p.state_get_data()
        assert walk(ctx, "ctx_blob", plan(rec, ROT_FIELDS[build], 0))["header"]["arch_string"] == rec.architecture
