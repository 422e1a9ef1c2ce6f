"""Conversions through the memory core where the two builds create different memories: Qwen4exp's
k-pool indexer rows are ``2 x key_length`` in b11434 and ``key_length`` in 0c1e5709 (docs §10).

A state of the model's 0c1e5709 memory written as 2026-10-v4 gets b11434's rows (raw half kept,
pooled half zero) and rotation words; converted back it is the original, byte for byte. Without
the model the conversion is refused, naming what is missing; the framing-only path hands such files
to the core. The real b11434 build's answer to the converted files is in test_mem_class_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvscope.core.convert.rewrite import rewrite_file
from kvscope.core.memory import ContextParams, MemoryContext, Ubatch
from kvscope.core.memory.convert import conversion_problems
from kvscope.core.memory.infer import infer_context, load, write
from kvscope.core.memory.layout import Layout
from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.modelgen import load_recipe, write_model
from kvscope.core.reader.parse import read_state

V3, V4 = Layout.named("2026-10"), Layout.named("2026-10-v4")


@pytest.fixture(scope="module")
def qwen4exp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelProfile]:
    path = tmp_path_factory.mktemp("model") / "qwen4exp.gguf"
    write_model(load_recipe("qwen4exp"), path)
    return path, load_model_profile(path)


def _state(prof: ModelProfile, layout: Layout, type_kv: str) -> MemoryContext:
    params = ContextParams(n_ctx=256, n_seq_max=2, kv_unified=False, type_k=type_kv, type_v=type_kv)
    ctx = MemoryContext.create(prof, params, layout)
    for seq, n in ((0, 7), (1, 3)):
        ctx.memory.apply(Ubatch(list(range(n)), [[seq]] * n))
    gen = torch.Generator().manual_seed(11)
    for p in ctx.memory.parts:
        for t in p.mem.tensors():
            t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=gen))
    return ctx


@pytest.mark.parametrize("type_kv", ["f16", "q8_0"])
def test_indexer_rows_widen_and_narrow_exactly(type_kv: str, qwen4exp: tuple[Path, ModelProfile]) -> None:
    _, prof = qwen4exp
    ctx = _state(prof, V3, type_kv)
    idx3 = ctx.memory.kv("kv_idx")
    for kind, blob in (("seq_blob", bytes(ctx.seq_get_data(0))), ("context_blob", bytes(ctx.get_data()))):
        res = read_state(data=blob, profile=prof)
        assert res.kind == kind and res.layout.name == V3.name and res.n_errors == 0
        inf = infer_context(res, prof)
        assert load(inf, blob).ok
        assert conversion_problems(inf, res, V4) == []
        v4 = bytes(write(inf, V4))
        res4 = read_state(data=v4, profile=prof)
        assert res4.layout.name == V4.name and res4.n_errors == 0
        inf4 = infer_context(res4, prof)
        assert load(inf4, v4).ok
        idx4 = inf4.ctx.memory.kv("kv_idx")
        assert idx4.layers[0].n_embd_k == 2 * idx3.layers[0].n_embd_k
        assert (idx4.n_rot_k, idx4.n_rot_v) == ((128, 0) if type_kv == "q8_0" else (0, 0))  # the widened head's rule
        cells = np.flatnonzero(idx4.cells[0].pos >= 0).tolist()
        half = idx3.k_row(idx3.layers[0])
        rows4 = idx4.layers[0].k[0][cells]
        assert bool((rows4[:, half:] == 0).all())  # the pooled half: zeros, recomputed by b11434 before use
        assert torch.equal(rows4[:, :half], idx3.layers[0].k[0][cells])
        assert bytes(write(inf4, V3)) == blob  # and back: the raw half is the 0c1e5709 row


def test_without_the_model_the_conversion_is_refused(qwen4exp: tuple[Path, ModelProfile], tmp_path: Path) -> None:
    _, prof = qwen4exp
    src = tmp_path / "q.seqstate"
    ctx = _state(prof, V3, "q8_0")
    src.write_bytes(bytes(ctx.seq_file_bytes(0, list(range(7)))))
    out = rewrite_file(str(src), str(tmp_path / "out"), "2026-10-v4", None)
    assert out.code == 1 and out.method == "memory core"
    assert any("indexer rows change width" in m for m in out.missing)
    assert any("rotation block sizes" in m for m in out.missing)
    assert not (tmp_path / "out").exists()
    out = rewrite_file(str(src), str(tmp_path / "out"), "2026-10-v4", prof)
    assert out.ok and out.method == "memory core", out.message
    res = read_state(tmp_path / "out", profile=prof)
    assert res.layout.name == V4.name and res.n_errors == 0
