"""The build cache is checked before it is trusted: every file a build made has its sha256 in BUILD.json, a
library or a llama-server changed since then is refused before it is loaded or run (a libllama copied from
the other build, a garbage library, a script in place of the server), ``llama-build --list`` says which
file, and a cache made before the record existed runs unverified with one line saying how to rebuild it.
Every test works on copies of the real build folders in a temporary cache, never on the real cache."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from kvharness.fixtures import MODELS, model_path
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import BUILDS, InstalledBuild, check_files, installed, require_built
from kvscope.core.engine.llamacpp import ABIWarning, EngineSetupError, LlamaProcess
from kvscope.core.engine.server import ServerProcess, ServerSetupError
from kvscope.core.verify.run import VerifyError, verify
from tests.support.build_copies import build_copy

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"


@pytest.fixture
def cache(builds: dict[str, InstalledBuild], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Both builds copied into a temporary cache (``KVSCOPE_LLAMA_CACHE``) as builds made now."""
    root = tmp_path / "cache"
    root.mkdir()
    out = {name: build_copy(have, root) for name, have in builds.items()}
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(root))
    return out


def _libllama(folder: Path) -> Path:
    return folder / "lib" / os.readlink(folder / "lib" / os.readlink(folder / "lib" / "libllama.so"))


def _list(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert main(["llama-build", "--list"]) == 0
    return {ln.split("\t")[0]: ln.split("\t")[-1] for ln in capsys.readouterr().out.splitlines()}


def test_a_recorded_build_is_verified(cache: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for b in BUILDS:
        have = installed(b)
        assert have is not None and have.path == cache[b.name] and check_files(have.path, have.info).ok
    with warnings.catch_warnings():
        warnings.simplefilter("error", ABIWarning)
        with LlamaProcess(model_path("llama"), build="0c1e5709") as p:
            abi = p.info()["abi"]
    assert abi["verified"] is True and abi["warning"] is None and abi["lib_dir"].startswith(str(cache["0c1e5709"]))
    assert all(state.endswith("; files verified") for state in _list(capsys).values())


def test_a_libllama_copied_from_the_other_build_is_refused(cache: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    target = _libllama(cache["0c1e5709"])
    target.write_bytes(_libllama(cache["b11434"]).read_bytes())
    with pytest.raises(EngineSetupError, match=r"was changed after it was built: lib/libllama\.so\.\S+ no longer "
                                               r"has the sha256 recorded when it was built; .*--rebuild") as e:
        LlamaProcess(model_path("llama"), build="0c1e5709")
    assert "\n" not in str(e.value)
    with pytest.raises(VerifyError, match="was changed after it was built"):  # not a 'damaged' verdict
        verify(SEQ, model_path("llama"))
    with pytest.raises(EngineSetupError, match="was changed after it was built"):  # the folder given as --lib too
        LlamaProcess(model_path("llama"), lib_path=cache["0c1e5709"])
    states = _list(capsys)
    assert "CHANGED since it was built: lib/libllama" in states["0c1e5709"]
    assert states["b11434"].endswith("; files verified")


def test_a_garbage_library_is_listed_as_changed_and_refused(cache: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    (cache["b11434"] / "lib" / "libggml-cpu.so").unlink()
    (cache["b11434"] / "lib" / "libggml-cpu.so").write_bytes(b"\x7fELF garbage")
    (cache["b11434"] / "lib" / "libextra.so").write_bytes(b"picked up by the loader")
    state = _list(capsys)["b11434"]
    assert "CHANGED since it was built: lib/libggml-cpu.so is not the link to libggml-cpu.so.0 the build made " \
           "(and 1 more)" in state, state
    have = installed(BUILDS[1])
    assert have is not None
    assert "lib/libextra.so was not made by the build" in check_files(have.path, have.info).problems
    with pytest.raises(EngineSetupError, match="was changed after it was built"):
        LlamaProcess(model_path("llama"), build="b11434")


def test_a_llama_server_replaced_by_a_script_is_not_run(cache: dict[str, Path], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    server = cache["0c1e5709"] / "bin" / "llama-server"
    server.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    with pytest.raises(ServerSetupError, match=r"bin/llama-server no longer has the sha256"):
        ServerProcess(model_path("llama"), build="0c1e5709")
    assert not marker.exists()
    with pytest.raises(VerifyError, match="bin/llama-server no longer has the sha256"):
        verify(SEQ, model_path("llama"), engine="server")
    assert not marker.exists()


def test_a_cache_made_before_the_record_runs_unverified_with_one_line(builds: dict[str, InstalledBuild],
                                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    old = build_copy(builds["0c1e5709"], root, recorded=False)
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(root))
    assert require_built("0c1e5709").path == old  # usable: no 6-minute rebuild forced
    with pytest.warns(ABIWarning, match=r"cached before kvscope recorded the sha256 of its files, so they cannot "
                                        r"be checked: `kvscope llama-build --build 0c1e5709 --rebuild`") as seen:
        p = LlamaProcess(model_path("llama"), build="0c1e5709")
    with p:
        info = p.info()
        assert info["build"] == "0c1e5709" and info["abi"]["verified"] is False
    assert all("\n" not in str(w.message) for w in seen)
    r = verify(SEQ, model_path("llama"))
    assert r.verdict == "ok" and any("cannot be checked" in n for n in r.notes)
    states = _list(capsys)
    assert "files not verified: cached before kvscope recorded their sha256" in states["0c1e5709"]
    assert states["b11434"] == "not built"
