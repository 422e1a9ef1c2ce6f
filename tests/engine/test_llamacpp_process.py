"""LlamaProcess against the real pinned llama.cpp builds: what the context is, decode, every state
API, byte-identical reproduction of the 0c1e5709 fixtures, crashes and hangs as outcomes, the
library and ABI checks, and the call overhead."""

from __future__ import annotations

import json
import os
import signal
import statistics
import struct
import time
import warnings
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from kvharness.fixtures import MODELS, model_path
from kvscope.core.engine.abi import BINDING_VERSION, REQUIRED_SYMBOLS
from kvscope.core.engine.builds import InstalledBuild, check_files
from kvscope.core.engine.choose import build_for_layout
from kvscope.core.engine.llamacpp import (
    PARTIAL_ONLY,
    ABIWarning,
    CtxParams,
    EngineDied,
    EngineSetupError,
    LlamaProcess,
)
from tests.support.build_copies import build_copy
from tests.support.gguf_variants import llama_head64

BUILD_NAMES = ("0c1e5709", "b11434")
SEQ_VERSION = {"0c1e5709": 3, "b11434": 4}
SESSION_VERSION = {"0c1e5709": 10, "b11434": 11}
TOKENS = [1, 298, 303, 308, 311, 316, 320, 298, 324, 327]
MANIFEST = json.loads((MODELS / "manifest.json").read_text())


def ctx_of(entry: dict[str, Any]) -> CtxParams:
    cp = entry["context_params"]
    return CtxParams(n_ctx=cp["n_ctx"], n_batch=cp["n_batch"], n_ubatch=cp["n_ubatch"], n_seq_max=cp["n_seq_max"],
                     kv_unified=cp["kv_unified"], flash_attn=cp["flash_attn"], type_k=cp["type_k"],
                     type_v=cp["type_v"], swa_full=cp["swa_full"], n_threads=cp["n_threads"])


def entry(name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(e for e in MANIFEST["files"] if e["file"] == name)
    return found


@pytest.fixture(scope="module", params=BUILD_NAMES)
def llama2(request: pytest.FixtureRequest, builds: dict[str, InstalledBuild]) -> LlamaProcess:
    """tiny-llama with two sequences, in each build (shared by the tests that reset what they use)."""
    p = LlamaProcess(model_path("llama"), CtxParams(n_ctx=512, n_seq_max=2, kv_unified=True), build=request.param)
    request.addfinalizer(p.close)
    return p


def fresh(p: LlamaProcess) -> None:
    p.memory_clear()
    assert p.seq_pos_max(0) == p.seq_pos_max(1) == -1


# --- what llama.cpp built ----------------------------------------------------------------------
@pytest.mark.parametrize("build", BUILD_NAMES)
def test_info_reports_the_context_llama_cpp_built(build: str, builds: dict[str, InstalledBuild]) -> None:
    ctx = CtxParams(n_ctx=768, n_batch=128, n_ubatch=64, n_seq_max=3, kv_unified=False, flash_attn=False)
    with LlamaProcess(model_path("llama"), ctx, build=build) as p:
        info = p.info()
    assert info["build"] == build and info["writes"] == builds[build].build.writes
    recorded = check_files(builds[build].path, builds[build].info).ok  # False for a cache made before the record
    assert info["abi"]["verified"] is recorded and (info["abi"]["warning"] is None) is recorded
    assert info["binding_version"] == BINDING_VERSION
    lib_dir = str(builds[build].lib_dir)
    assert info["libllama"].startswith(lib_dir)
    assert info["loaded_libraries"] and all(p.startswith(lib_dir) for p in info["loaded_libraries"])
    vocab = gguf.GGUFReader(model_path("llama")).fields["tokenizer.ggml.tokens"]
    assert info["n_vocab"] == len(vocab.data) and info["n_layer"] == 4 and info["architecture"] == "llama"
    assert (info["n_ctx"], info["n_ctx_seq"], info["n_batch"], info["n_ubatch"], info["n_seq_max"]) == (
        768, 256, 128, 64, 3)
    assert info["kv_caches"] == [{"cells": 256, "layers": 4, "n_seq_max": 3, "n_stream": 3, "type_k": "f16",
                                  "type_v": "f16", "size_mib": 0.75, "k_mib": 0.38, "v_mib": 0.38}]
    assert info["flash_attn"] == "disabled"
    assert any("n_ctx_seq             = 256" in ln for ln in info["context_log"])
    assert info["rotation"] == ([{"n_rot_k": 0, "n_rot_v": 0}] if build == "b11434"
                                else [{"attn_rot_k": 0, "attn_rot_v": 0}])
    assert any("loaded meta data" in ln or "model type" in ln for ln in info["load_log"])


@pytest.mark.parametrize("build", BUILD_NAMES)
def test_env_reaches_the_library_before_it_loads(build: str, builds: dict[str, InstalledBuild],
                                                 tmp_path: Path) -> None:
    """Head size 64 with q8_0 K/V is rotated; LLAMA_ATTN_ROT_DISABLE=1 in CtxParams.env turns it off."""
    model = llama_head64(model_path("llama"), tmp_path / "llama-head64.gguf")
    seen = []
    for env in ((), (("LLAMA_ATTN_ROT_DISABLE", "1"),)):
        with LlamaProcess(model, CtxParams(type_k="q8_0", type_v="q8_0", env=env), build=build) as p:
            info = p.info()
            assert p.decode(0, TOKENS).rc == 0
        assert info["kv_caches"][0]["type_k"] == "q8_0" and info["flash_attn"] == "enabled"
        assert info["env"].get("LLAMA_ATTN_ROT_DISABLE") == (env[0][1] if env else None)
        seen.append(info["rotation"])
    if build == "b11434":
        assert seen == [[{"n_rot_k": 64, "n_rot_v": 64}], [{"n_rot_k": 0, "n_rot_v": 0}]]
    else:
        assert seen == [[{"attn_rot_k": 1, "attn_rot_v": 1}], [{"attn_rot_k": 0, "attn_rot_v": 0}]]


def test_inherited_llama_settings_do_not_leak_into_the_child(builds: dict[str, InstalledBuild],
                                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLAMA_ATTN_ROT_DISABLE", "1")
    model = llama_head64(model_path("llama"), tmp_path / "llama-head64.gguf")
    with LlamaProcess(model, CtxParams(type_k="q8_0", type_v="q8_0"), build="b11434") as p:
        assert p.info()["rotation"] == [{"n_rot_k": 64, "n_rot_v": 64}]
        assert "LLAMA_ATTN_ROT_DISABLE" not in p.info()["env"]


# --- decode ------------------------------------------------------------------------------------
def test_decode_gives_the_last_logits_and_positions(llama2: LlamaProcess) -> None:
    fresh(llama2)
    a = llama2.decode(0, TOKENS)
    assert a.ok and a.rc == 0 and a.aborted is None
    assert isinstance(a.value, np.ndarray) and a.value.dtype == np.float32 and a.value.shape == (379,)
    assert np.isfinite(a.value).all() and a.value.std() > 0
    assert (llama2.seq_pos_min(0), llama2.seq_pos_max(0)) == (0, len(TOKENS) - 1)
    b = llama2.decode(1, TOKENS)
    np.testing.assert_allclose(a.value, b.value, rtol=0, atol=1e-5)  # same tokens, other sequence
    clash = llama2.decode(1, TOKENS[:5], pos0=0)  # positions seq 1 already holds: llama.cpp refuses
    assert clash.ok and clash.rc == -1 and clash.value is None
    assert any("inconsistent sequence positions" in ln for ln in clash.log), clash.log
    assert llama2.seq_rm(1)
    assert llama2.seq_pos_max(1) == -1
    assert llama2.decode(1, TOKENS[:6]).rc == 0
    tail = llama2.decode(1, TOKENS[6:])  # continues after pos_max
    assert llama2.seq_pos_max(1) == len(TOKENS) - 1
    np.testing.assert_allclose(tail.value, a.value, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="outside 0..1"):
        llama2.decode(2, TOKENS)
    with pytest.raises(ValueError, match="at least one token"):
        llama2.decode(0, [])


def test_decode_longer_than_n_batch_goes_in_chunks(builds: dict[str, InstalledBuild]) -> None:
    toks = [int(t) for t in np.random.default_rng(1).integers(3, 379, 150)]
    out = []
    for n_batch in (32, 256):
        with LlamaProcess(model_path("llama"), CtxParams(n_batch=n_batch, n_ubatch=32), build="b11434") as p:
            o = p.decode(0, toks)
            assert o.rc == 0 and p.seq_pos_max(0) == 149
            out.append(o.value)
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-4)


def test_decode_failure_is_a_return_code(llama2: LlamaProcess) -> None:
    fresh(llama2)
    o = llama2.decode(0, [3, 4, 100_000])  # not a token of this vocabulary
    assert o.ok and o.rc == -1 and o.value is None and o.aborted is None
    assert any("invalid token" in ln for ln in o.log), o.log
    assert llama2.decode(0, [3, 4]).rc == 0  # the process is fine


# --- state APIs ----------------------------------------------------------------------------------
def test_context_state_round_trip(llama2: LlamaProcess) -> None:
    fresh(llama2)
    llama2.decode(0, TOKENS)
    llama2.decode(1, TOKENS[:4])
    size = llama2.state_get_size()
    blob = llama2.state_get_data()
    assert isinstance(blob, bytes) and len(blob) == size
    want = llama2.decode(0, [5]).value
    llama2.memory_clear()
    assert llama2.seq_pos_max(0) == -1
    o = llama2.state_set_data(blob)
    assert o.ok and o.value == len(blob) == o.rc and o.log == []
    assert (llama2.seq_pos_max(0), llama2.seq_pos_max(1)) == (len(TOKENS) - 1, 3)
    np.testing.assert_array_equal(llama2.decode(0, [5]).value, want)


def test_failed_set_data_returns_zero_with_the_log(llama2: LlamaProcess) -> None:
    o = llama2.state_set_data(struct.pack("<I", 5) + b"gemma")
    assert o.ok and o.value == 0 and o.aborted is None
    assert any("wrong model arch" in ln for ln in o.log), o.log


def test_seq_state_round_trip_into_another_sequence(llama2: LlamaProcess) -> None:
    fresh(llama2)
    llama2.decode(0, TOKENS)
    size = llama2.state_seq_get_size(0)
    blob = llama2.state_seq_get_data(0)
    assert len(blob) == size and blob[:8] == struct.pack("<Ii", 0xAF143CD8, 0)
    want = llama2.decode(0, [5]).value  # the next token, decoded where the cells came from
    o = llama2.state_seq_set_data(blob, 1)
    assert o.ok and o.value == len(blob)
    assert (llama2.seq_pos_min(1), llama2.seq_pos_max(1)) == (0, len(TOKENS) - 1)
    np.testing.assert_allclose(llama2.decode(1, [5]).value, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("build", BUILD_NAMES)
def test_partial_only_flag_keeps_only_the_swa_part(build: str, builds: dict[str, InstalledBuild]) -> None:
    ctx = CtxParams(n_ctx=256, n_seq_max=1, swa_full=False)
    with LlamaProcess(model_path("gemma2"), ctx, build=build) as p:
        p.decode(0, list(range(3, 40)))
        full, part = p.state_seq_get_size(0), p.state_seq_get_size(0, PARTIAL_ONLY)
        assert 0 < part < full
        blob = p.state_seq_get_data(0, PARTIAL_ONLY)
        assert len(blob) == part
        assert p.state_seq_set_data(blob, 0, PARTIAL_ONLY).value == part


# Fixtures written by the 0c1e5709 generator: the same tokens, decoded per sequence in the same
# context, give the same bytes through this engine.
REPRODUCED = [
    ("llama-f16-fa0-unified0-seq1.seqdata.bin", "seq_blob"),
    ("llama-f16-fa0-unified0-ctx.state.bin", "ctx_blob"),
    ("gemma2-f16-fa0-unified0-swafull1-seq0-partial.seqdata.bin", "seq_blob"),
    ("lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin", "seq_blob"),
    ("mamba-f32state-n3-seq2.seqdata.bin", "seq_blob"),
]


@pytest.mark.parametrize(("name", "kind"), REPRODUCED)
def test_engine_reproduces_the_0c1e5709_fixtures_byte_for_byte(name: str, kind: str,
                                                               builds: dict[str, InstalledBuild]) -> None:
    e = entry(name)
    assert e["kind"] == kind
    seqs: dict[int, list[int]] = {}
    for f in MANIFEST["files"]:
        if f["model_key"] == e["model_key"] and f["scenario"] == e["scenario"]:
            for k, v in (f.get("seqs") or {}).items():
                seqs[int(k)] = v["token_ids"]
    with LlamaProcess(MODELS / str(e["model_file"]), ctx_of(e), build="0c1e5709") as p:
        for s in sorted(seqs):
            assert p.decode(s, seqs[s]).rc == 0
        got = p.state_get_data() if kind == "ctx_blob" else p.state_seq_get_data(int(e["seq_id"]),
                                                                                 int(e.get("flags") or 0))
    assert got == (MODELS / name).read_bytes()


@pytest.mark.parametrize("build", BUILD_NAMES)
def test_session_and_seq_files(build: str, builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    with LlamaProcess(model_path("llama"), CtxParams(n_seq_max=2), build=build) as p:
        p.decode(0, TOKENS)
        want = p.decode(0, [7]).value
        p.seq_rm(0, len(TOKENS))  # back to TOKENS only
        session, seq = tmp_path / "s.session", tmp_path / "s.seqstate"
        assert p.state_save_file(session, TOKENS).value is True
        o = p.state_seq_save_file(seq, 0, TOKENS)
        assert o.value == seq.stat().st_size > 0
        assert session.read_bytes()[:12] == struct.pack("<4sII", b"nsgg", SESSION_VERSION[build], len(TOKENS))
        assert seq.read_bytes()[:12] == struct.pack("<4sII", b"qsgg", SEQ_VERSION[build], len(TOKENS))

        p.memory_clear()
        o = p.state_load_file(session, 64)
        assert o.ok and o.rc is True and o.value == TOKENS
        np.testing.assert_array_equal(p.decode(0, [7]).value, want)

        p.memory_clear()
        o = p.state_seq_load_file(seq, 1, 64)
        assert o.value == TOKENS and o.rc == seq.stat().st_size
        assert (p.seq_pos_max(0), p.seq_pos_max(1)) == (-1, len(TOKENS) - 1)
        np.testing.assert_array_equal(p.decode(1, [7]).value, want)

        small = p.state_seq_load_file(seq, 0, len(TOKENS) - 1)  # capacity below the token count
        assert small.ok and small.value is None and small.rc == 0
        missing = p.state_load_file(tmp_path / "none.session", 64)
        assert missing.ok and missing.value is None and missing.log


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:"))


def test_a_load_capacity_cannot_size_the_token_buffer_beyond_the_file(builds: dict[str, InstalledBuild],
                                                                      tmp_path: Path) -> None:
    """A capacity taken from a header (2**28 tokens = 1 GiB) is cut to the tokens the file can hold."""
    with LlamaProcess(model_path("llama"), CtxParams(), build="0c1e5709") as p:
        p.decode(0, TOKENS)
        seq, session = tmp_path / "s.seqstate", tmp_path / "s.session"
        assert p.state_seq_save_file(seq, 0, TOKENS).value and p.state_save_file(session, TOKENS).value
        before = _peak_rss_kib(p.pid)
        for path, load in ((seq, lambda f, n: p.state_seq_load_file(f, 0, n)), (session, p.state_load_file)):
            data = bytearray(path.read_bytes())
            data[8:12] = struct.pack("<I", 1 << 28)
            (tmp_path / "big").write_bytes(bytes(data))
            o = load(tmp_path / "big", 1 << 28)
            assert o.ok and o.value is None and any("exceeded capacity" in ln for ln in o.log), o.log
            assert load(path, 1 << 28).value == TOKENS  # an honest file still loads with a large capacity
        assert _peak_rss_kib(p.pid) - before < 256 * 1024  # not the 1 GiB buffer


def test_the_chosen_build_loads_a_fixture_and_the_other_refuses_it(builds: dict[str, InstalledBuild]) -> None:
    from kvscope.core.reader.parse import read_state

    name = "llama-f16-fa0-unified0-seq1.seqstate"
    res = read_state(MODELS / name)
    choice = build_for_layout(res.layout.name)
    assert choice.build.name == "0c1e5709" and choice.loads
    e = entry(name)
    want = e["seqs"]["1"]["token_ids"]
    for build, loads in (("0c1e5709", True), ("b11434", False)):
        with LlamaProcess(model_path("llama"), ctx_of(e), build=build) as p:
            o = p.state_seq_load_file(MODELS / name, 1, 256)
            assert o.ok and o.aborted is None
            if loads:
                assert o.value == want and p.seq_pos_max(1) == len(want) - 1
            else:
                assert o.value is None and o.rc == 0 and p.seq_pos_max(1) == -1
                assert any("version" in ln for ln in o.log), o.log


def test_build_for_layout_reasons() -> None:
    assert build_for_layout("2026-10-v4").build.name == "b11434"
    assert build_for_layout("v4").build.name == "b11434"
    assert build_for_layout("2026-10").build.name == "0c1e5709"
    old = build_for_layout("2025-05")
    assert old.build.name == "0c1e5709" and not old.loads
    assert "session v9" in old.reason and "refuse" in old.reason
    assert not build_for_layout(None).loads and "not known" in build_for_layout(None).reason
    assert "not a layout generation" in build_for_layout("1999-01").reason


# --- crashes and hangs --------------------------------------------------------------------------
@pytest.mark.parametrize("build", BUILD_NAMES)
def test_assert_abort_in_llama_cpp_is_an_outcome(build: str, builds: dict[str, InstalledBuild],
                                                 tmp_path: Path) -> None:
    """A seq file cut 100 bytes short: llama.cpp reads past EOF without noticing, then
    GGML_ASSERT(nread <= state_size) aborts the process (spec 2.2)."""
    with LlamaProcess(model_path("llama"), CtxParams(n_seq_max=2), build=build) as p:
        p.decode(0, TOKENS * 3)
        seq = tmp_path / "s.seqstate"
        p.state_seq_save_file(seq, 0, TOKENS * 3)
        cut = tmp_path / "cut.seqstate"
        cut.write_bytes(seq.read_bytes()[:-100])
        o = p.state_seq_load_file(cut, 1, 64)
        assert not o.ok and o.aborted == "SIGABRT" and o.value is None
        assert any("GGML_ASSERT(nread <= state_size) failed" in ln for ln in o.log), o.log
        assert o.summary().startswith("engine aborted: SIGABRT: llama-context.cpp:")
        assert o.summary().endswith(": GGML_ASSERT(nread <= state_size) failed")
        assert any("Aborted" in ln for ln in o.stderr)
        assert not p.alive
        with pytest.raises(EngineDied, match="SIGABRT"):
            p.seq_pos_max(0)
        with pytest.raises(EngineDied, match="SIGABRT"):  # an Outcome call on a dead process raises too
            p.state_set_data(b"")


def test_a_dead_process_raises_on_outcome_calls_too(builds: dict[str, InstalledBuild]) -> None:
    p = LlamaProcess(model_path("mamba"), build="b11434")
    os.kill(p.pid, signal.SIGSEGV)
    o = p.state_set_data(b"\0" * 8)  # the call finds the child gone: that is this call's outcome
    assert not o.ok and o.aborted == "SIGSEGV"
    assert any("Segmentation fault" in ln for ln in o.stderr), o.stderr
    with pytest.raises(EngineDied) as died:
        p.state_set_data(b"\0" * 8)
    assert died.value.aborted == "SIGSEGV" and not died.value.now
    p.close()


def test_a_hung_child_is_killed_at_the_timeout(builds: dict[str, InstalledBuild]) -> None:
    p = LlamaProcess(model_path("llama"), build="b11434", timeout_s=30)
    p.timeout_s = 0.5
    os.kill(p.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    o = p.decode(0, TOKENS)
    took = time.monotonic() - t0
    assert not o.ok and o.aborted == "timeout" and 0.5 <= took < 5
    with pytest.raises(ProcessLookupError):
        os.kill(p.pid, 0)  # killed and reaped
    with pytest.raises(EngineDied, match="timeout"):
        p.state_get_size()
    p.close()


def test_close_ends_the_child_and_removes_its_files(builds: dict[str, InstalledBuild]) -> None:
    p = LlamaProcess(model_path("llama"), build="0c1e5709")
    pid, scratch = p.pid, list(p._scratch)
    assert all(os.path.isdir(d) for d in scratch)
    p.close()
    p.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not any(os.path.exists(d) for d in scratch)
    with pytest.raises(EngineDied, match="closed"):
        p.seq_pos_max(0)


# --- choosing and checking the library ------------------------------------------------------------
def _link_lib(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f.resolve() if not f.is_symlink() else f.readlink())
    return dst


def test_own_library_folder_runs_with_an_unverified_abi_warning(builds: dict[str, InstalledBuild],
                                                                tmp_path: Path) -> None:
    lib = _link_lib(builds["b11434"].lib_dir, tmp_path / "mylib")
    with pytest.warns(ABIWarning, match=r"cannot be verified .*exports the \d+ functions"):
        p = LlamaProcess(model_path("llama"), lib_path=lib)
    with p:
        info = p.info()
        assert info["build"] is None and info["abi"]["verified"] is False
        assert str(len(REQUIRED_SYMBOLS)) in info["abi"]["warning"]
        assert p.decode(0, TOKENS).rc == 0
    ours = build_copy(builds["0c1e5709"], tmp_path / "cache")  # as a build made now: its files recorded
    with warnings.catch_warnings():  # a folder holding our BUILD.json is verified: no warning
        warnings.simplefilter("error")
        with LlamaProcess(model_path("llama"), lib_path=ours) as q:
            assert q.info()["build"] == "0c1e5709" and q.info()["abi"]["verified"] is True


def test_a_library_that_is_not_libllama_is_refused(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    lib = tmp_path / "wrong"
    lib.mkdir()
    (lib / "libllama.so").symlink_to((builds["b11434"].lib_dir / "libggml-base.so").resolve())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ABIWarning)
        with pytest.raises(EngineSetupError, match=r"lacks \d+ function\(s\) kvscope calls \(llama_backend_init") as e:
            LlamaProcess(model_path("llama"), lib_path=lib)
    assert "llama-cpp-python 0.3.36 (llama.cpp 0c1e5709 ABI)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_build_from_another_header_is_refused(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    root = tmp_path / "other"
    root.mkdir()
    _link_lib(builds["b11434"].lib_dir, root / "lib")
    info = dict(builds["b11434"].info, llama_h_sha256="ab" * 32)
    (root / "BUILD.json").write_text(json.dumps(info))
    with pytest.raises(EngineSetupError, match=r"llama.h \(sha256 abababababababab...\) that is not the llama.cpp "
                                               r"0c1e5709 header"):
        LlamaProcess(model_path("llama"), lib_path=root)


def test_setup_errors_are_one_line(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    cases = [
        (dict(build="b9999"), "unknown llama.cpp build 'b9999'"),
        (dict(lib_path=tmp_path), "no libllama.so in"),
        (dict(build="b11434", lib_path=tmp_path), "either a build name or a library folder"),
    ]
    for kw, msg in cases:
        with pytest.raises(EngineSetupError, match=msg) as e:
            LlamaProcess(model_path("llama"), **kw)  # type: ignore[arg-type]
        assert "\n" not in str(e.value)
    with pytest.raises(EngineSetupError, match="no such model file"):
        LlamaProcess(tmp_path / "none.gguf", build="b11434")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(EngineSetupError, match="llama.cpp cannot load the model"):
        LlamaProcess(junk, build="b11434")
    with pytest.raises(EngineSetupError, match="type_k 'q9_9' is not a ggml type name"):
        LlamaProcess(model_path("llama"), CtxParams(type_k="q9_9"), build="b11434")
    with pytest.raises(EngineSetupError, match="cannot create the context: .*quantized V cache requires flash_attn"):
        LlamaProcess(model_path("llama"), CtxParams(type_v="q8_0", flash_attn=False), build="b11434")
    with pytest.raises(ValueError, match="n_ubatch"):
        CtxParams(n_batch=64, n_ubatch=128)
    with pytest.raises(ValueError, match="n_seq_max"):
        CtxParams(n_seq_max=0)


def test_a_missing_build_says_how_to_build_it(builds: dict[str, InstalledBuild], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(EngineSetupError, match=r"not built: run `kvscope llama-build --build b11434`"):
        LlamaProcess(model_path("llama"), build="b11434")


# --- speed ------------------------------------------------------------------------------------------
def test_call_overhead_and_large_payloads(llama2: LlamaProcess) -> None:
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        llama2.seq_pos_max(0)
        times.append(time.perf_counter() - t0)
    # a generous bound (a loaded machine must pass it): a round trip is well under a millisecond, a process
    # or a model load per call would be hundreds; bench/bench_engine.py measures it
    assert statistics.median(times) < 0.05, f"median round trip {statistics.median(times) * 1e3:.2f} ms"
    rng = np.random.default_rng(2)
    for n in (0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 48 << 20):  # inline, at the limit, through a file
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert llama2.echo(data) == data
    scratch = llama2._scratch
    assert not any(os.listdir(d) for d in scratch)  # payload files are gone once read


def test_the_binding_is_never_imported_in_kvscope(builds: dict[str, InstalledBuild]) -> None:
    import sys

    with LlamaProcess(model_path("mamba"), build="b11434") as p:
        p.decode(0, TOKENS)
        p.state_get_data()
    assert "llama_cpp" not in sys.modules


def test_kill_from_another_thread_cancels_the_call_in_flight(builds: dict[str, InstalledBuild]) -> None:
    import threading

    p = LlamaProcess(model_path("llama"), build="0c1e5709")
    os.kill(p.pid, signal.SIGSTOP)  # the call below waits on a child that does nothing
    threading.Timer(0.3, p.kill).start()
    o = p.decode(0, TOKENS)
    assert not o.ok and o.aborted == "SIGKILL"
    with pytest.raises(EngineDied, match="SIGKILL"):
        p.seq_pos_max(0)
    p.close()
