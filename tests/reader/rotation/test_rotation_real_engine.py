"""De-rotation checked against real llama.cpp: the same tokens saved with rotation on and with
``LLAMA_ATTN_ROT_DISABLE=1`` give de-rotated values equal within the quantization error, in the
v4 build (rotation words in the file) and in 0c1e5709 (rotation inferred from the model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvscope.core.analysis.record_values import record_rows
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.model.profile import load_model_profile
from kvscope.core.modelgen.recipes import load_recipe
from kvscope.core.modelgen.write import write_model
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource

TOKENS = [1, 17, 33, 58, 91, 2, 44, 70, 12, 5, 99, 101]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated llama (head size 64: quantized caches are rotated with blocks of 64)."""
    path = tmp_path_factory.mktemp("model") / "llama.gguf"
    write_model(load_recipe("llama"), path)
    return path


def _blob(model: Path, build: str, type_kv: str, rot_off: bool, tmp: Path) -> Path:
    env = (("LLAMA_ATTN_ROT_DISABLE", "1"),) if rot_off else ()
    ctx = CtxParams(n_ctx=256, n_seq_max=1, flash_attn=True, type_k=type_kv, type_v=type_kv, env=env)
    with LlamaProcess(str(model), ctx, build=build) as eng:
        assert eng.decode(0, TOKENS).ok
        data = eng.state_seq_get_data(0)
    out = tmp / f"{build}-{type_kv}-{'norot' if rot_off else 'rot'}.bin"
    out.write_bytes(data)
    return out


def _values(path: Path, prof: Any, derotate: bool = True) -> list[np.ndarray]:
    res = read_state(path, profile=prof)
    assert res.n_errors == 0, [f.message for f in res.findings]
    src = ByteSource.open(path)
    return [record_rows(src, rec, slice(None), derotate=derotate) for _, rec in res.layer_records()]


@pytest.mark.parametrize(("build", "layout"), [("b11434", "2026-10-v4"), ("0c1e5709", "2026-10")])
def test_derotated_rows_equal_unrotated_rows(model: Path, tmp_path: Path, build: str, layout: str,
                                             builds: dict[str, Any]) -> None:
    prof = load_model_profile(model)
    rot = _blob(model, build, "q8_0", False, tmp_path)
    norot = _blob(model, build, "q8_0", True, tmp_path)
    f16 = _blob(model, build, "f16", False, tmp_path)
    res = read_state(rot, profile=prof)
    assert res.layout.name == layout or layout in res.layout.features.get("byte_identical_layouts", [])
    for sec in res.sections:
        for st in sec.streams:
            if st.data_offset is None:
                continue
            assert (st.n_rot_k, st.n_rot_v) == (64, 64)  # head size 64: K and V blocks of 64
            assert st.n_rot_inferred == (layout == "2026-10")  # v3: nothing in the file says so
            assert all(r.rotated and r.rot_block == 64 for r in (*st.k_layers, *st.v_layers))
    plain = read_state(norot, profile=prof)
    for sec in plain.sections:
        for st in sec.streams:
            if st.data_offset is not None and layout == "2026-10-v4":
                assert (st.n_rot_k, st.n_rot_v) == (0, 0)  # written by the build that did not rotate
    a, b, ref = _values(rot, prof), _values(norot, prof, derotate=layout == "2026-10-v4"), _values(f16, prof)
    stored = _values(rot, prof, derotate=False)
    for x, y, z, s in zip(a, b, ref, stored, strict=True):
        scale = float(np.max(np.abs(z))) or 1.0
        err = float(np.max(np.abs(x - z))) / scale
        assert err < 0.03, err  # q8_0 quantization error of de-rotated rows against the f16 cache
        if layout == "2026-10-v4":  # rotation off and on, both read as they were written
            assert float(np.max(np.abs(x - y))) / scale < 0.03
        assert float(np.max(np.abs(s - z))) / scale > 0.1  # the stored rows really are rotated


def test_stats_say_derotated_and_keep_the_rms(model: Path, tmp_path: Path, builds: dict[str, Any]) -> None:
    prof = load_model_profile(model)
    rot = _blob(model, "b11434", "q8_0", False, tmp_path)
    f16 = _blob(model, "b11434", "f16", False, tmp_path)
    srot = scan_stats(read_state(rot, profile=prof))
    sref = scan_stats(read_state(f16, profile=prof))
    assert all(ls.derotated and ls.rot_block == 64 and not ls.rot_inferred for ls in srot.layers)
    assert "de-rotated (Hadamard, block 64)" in srot.to_text()
    for x, y in zip(srot.layers, sref.layers, strict=True):
        assert not y.derotated
        assert abs(x.rms - y.rms) <= 0.02 * y.rms
        assert abs(x.mean - y.mean) <= 0.05 * y.rms
        assert abs(x.max - y.max) <= 0.05 * (y.max - y.min) and abs(x.min - y.min) <= 0.05 * (y.max - y.min)
