"""A hybrid model with an MTP block (issue #27, item 6), written by the real pinned builds.

From b9544 llama.cpp's recurrent section counts the trunk only (``hparams.n_layer()`` =
``n_layer_all - n_layer_nextn``), while the KV cache of a Qwen3.5 hybrid holds the trunk's attention
layers. kvscope compared the word with the whole block count, so every such file was "another model".
Here a tiny Qwen3.5 with one MTP block (block_count 3, nextn 1) writes real files in both pinned builds:
kvscope reads them as healthy, the memory core writes them byte for byte, and a copy whose word says 3
is refused by llama.cpp itself and flagged by kvscope.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.memory.context import MemoryContext
from kvscope.core.memory.params import ContextParams
from kvscope.core.model.profile import ModelProfile, load_model_profile
from tests.support.gguf_variants import qwen35_mtp

LAYOUT = {"0c1e5709": "2026-10", "b11434": "2026-10-v4"}
TOKENS = list(range(5, 25))


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen35_mtp(tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf")


@pytest.fixture(scope="module", params=sorted(LAYOUT))
def written(request: pytest.FixtureRequest, mtp_model: Path, builds: dict[str, InstalledBuild],
            tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, bytes]:
    """(build, its sequence file, its context blob) of 20 tokens."""
    build = request.param
    out = tmp_path_factory.mktemp(f"mtp-{build}")
    with LlamaProcess(mtp_model, CtxParams(n_ctx=256, n_batch=64, n_ubatch=64), build=build) as p:
        assert p.decode(0, TOKENS).rc == 0
        assert p.state_seq_save_file(out / "seq0.seqstate", 0, TOKENS).ok
        blob = p.state_get_data()
    return build, out / "seq0.seqstate", blob


def _n_layer_word(path: Path, profile: ModelProfile) -> int:
    res = inspect_file(path, profile, compat=False).result
    rec = next(s for s in res.sections if s.kind == "recurrent")
    return rec.offset + 4 + 8 * (rec.cell_count or 0) + 4  # cell_count, the cells' (pos, n_seq_id), s_trans


def test_the_profile_knows_the_mtp_block(mtp_model: Path) -> None:
    p = load_model_profile(mtp_model)
    assert (p.n_layer, p.n_layer_nextn, p.recurrent_layers, p.attn_layers) == (3, 1, (0,), (1,))


def test_a_real_file_of_an_mtp_hybrid_is_healthy(written: tuple[str, Path, bytes], mtp_model: Path) -> None:
    build, path, _ = written
    profile = load_model_profile(mtp_model)
    ins = inspect_file(path, profile)
    assert [f.message for f in ins.result.findings if f.severity in ("error", "warning")] == []
    rec = next(s for s in ins.result.sections if s.kind == "recurrent")
    assert rec.n_layer_written == 2  # the trunk: 3 blocks less 1 MTP
    assert ins.result.layout.name == LAYOUT[build]


def test_the_memory_core_writes_the_real_bytes(written: tuple[str, Path, bytes], mtp_model: Path) -> None:
    build, path, blob = written
    profile = load_model_profile(mtp_model)
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64)
    ctx = MemoryContext.create(profile, params, LAYOUT[build])
    assert ctx.seq_load_file(path, 0).ok
    assert bytes(ctx.seq_file_bytes(0, TOKENS)) == path.read_bytes()
    whole = MemoryContext.create(profile, params, LAYOUT[build])
    assert whole.set_data(blob).ok
    assert bytes(whole.get_data()) == blob


def test_a_word_counting_the_mtp_block_is_refused_by_llama_cpp_and_flagged(
        written: tuple[str, Path, bytes], mtp_model: Path, tmp_path: Path) -> None:
    build, path, _ = written
    profile = load_model_profile(mtp_model)
    data = bytearray(path.read_bytes())
    at = _n_layer_word(path, profile)
    assert struct.unpack_from("<I", data, at)[0] == 2
    struct.pack_into("<I", data, at, 3)
    bad = tmp_path / "n_layer3.seqstate"
    bad.write_bytes(bytes(data))
    # kvscope: the file does not fit the model (the word is the one a model of another layer count writes)
    found = [f for f in inspect_file(bad, profile, compat=False).result.findings if f.severity == "error"]
    assert [f.code for f in found] == ["model_mismatch"] and "layer_count_mismatch" in found[0].message, found
    with LlamaProcess(mtp_model, CtxParams(n_ctx=256, n_batch=64, n_ubatch=64), build=build) as p:
        out = p.state_seq_load_file(bad, 0, 64)
        assert out.rc == 0 and any("mismatched layer count (3 instead of 2)" in line for line in out.log), out.log
    core = MemoryContext.create(profile, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64), LAYOUT[build])
    res = core.seq_load_file(bad, 0)
    assert not res.ok and "3 instead of 2" in res.message


def test_the_release_answers_split_epoch_j_at_b9544(written: tuple[str, Path, bytes], mtp_model: Path,
                                                    tmp_path: Path) -> None:
    """The real file rewritten by the memory core as the 2026-08 layout (the trunk count, as b9544 on
    write it): written by and loading in b9544-b10635; b9479-b9543 (the whole block count) unknown; a 2026-04
    build refuses it."""
    import json
    import subprocess
    import sys

    build, path, _ = written
    profile = load_model_profile(mtp_model)
    ctx = MemoryContext.create(profile, ContextParams(n_ctx=256, n_batch=64, n_ubatch=64), LAYOUT[build])
    assert ctx.seq_load_file(path, 0).ok
    old = tmp_path / "2026-08.seqstate"
    old.write_bytes(bytes(ctx.seq_file_bytes(0, TOKENS, layout="2026-08")))

    def target(release: str) -> dict[str, object]:
        argv = ["inspect", str(old), "--model", str(mtp_model), "--target", release, "--json"]
        p = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", *argv], capture_output=True, text=True,
                           timeout=120)
        out: dict[str, object] = json.loads(p.stdout)["target"]
        return out

    assert target("b9544")["answer"] == "loads" and target("b10635")["answer"] == "loads"
    early = target("b9500")
    assert early["answer"] == "unknown" and "b9544" in str(early["message"]), early
    assert target("b9400")["answer"] == "refuses"
