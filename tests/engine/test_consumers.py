"""Compatibility per consumer (#18 item 4): for each pinned build, libllama (llama_state_seq_load_file)
and llama-server (/slots/N?action=restore) answered apart, loads / refuses (with the message) /
crashes (the assert), checked against the real builds on every damage family of the corruption
suite (core/lab/corruptions.py) applied to a real llama-server slot save of each memory class, and
on a token outside the vocabulary, which libllama loads and llama-server refuses."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvscope.core.analysis.compat import compatibility
from kvscope.core.analysis.consumers import ConsumerAnswer, consumer_answers
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.engine.server import ServerDied, ServerHTTPError, ServerProcess
from kvscope.core.lab.corruptions import CATALOG, CorruptionError
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from tests.support.fixtures import DATA

# the generated slots' server settings (tests/data/gen-*/manifest.json)
CTX = CtxParams(n_ctx=256, n_batch=256, n_ubatch=256, kv_unified=True, flash_attn=False, swa_full=True)
ARGS = ["-fa", "off", "-ctk", "f16", "-ctv", "f16", "-b", "256", "-ub", "256", "--swa-full", "-kvu", "--no-warmup"]
MODELS = ("llama", "gemma2", "mamba", "lfm2-swa")  # kv, iSWA, recurrent, hybrid-iSWA


class Consumers:
    """One libllama child and one llama-server of a build, restarted after a crash."""

    def __init__(self, build: str, model: Path, folder: Path) -> None:
        self.build, self.model, self.folder = build, model, folder
        self.lib: LlamaProcess | None = None
        self.srv: ServerProcess | None = None

    def libllama(self, path: Path) -> tuple[str, str]:
        if self.lib is None or not self.lib.alive:
            self.lib = LlamaProcess(self.model, CTX, build=self.build)
        o = self.lib.state_seq_load_file(path, 0, 4096)
        if o.aborted:
            return "crashes", " ".join(o.log[-2:] + o.stderr[-2:])
        return ("loads", "") if o.ok and o.rc else ("refuses", " ".join(o.log[-2:]))

    def server(self, path: Path) -> tuple[str, str]:
        if self.srv is None or not self.srv.alive:
            self.srv = ServerProcess(self.model, build=self.build, n_ctx=256, slot_dir=self.folder, args=ARGS)
        try:
            self.srv.client().slot_restore(0, path.name)
            return "loads", ""
        except ServerDied as e:
            self.srv.close()
            self.srv = None
            return "crashes", str(e)
        except ServerHTTPError as e:
            return "refuses", e.message

    def close(self) -> None:
        for p in (self.lib, self.srv):
            if p is not None:
                p.close()


def _check(got: tuple[str, str], want: ConsumerAnswer, where: str) -> None:
    """A definite answer must be what the engine did; ``unknown`` (the bytes cannot tell, e.g. a model
    that no longer fits the file) claims nothing."""
    if want.answer == "unknown":
        return
    assert got[0] == want.answer, (where, want.line(), got)
    if want.answer == "refuses" and want.consumer == "llama-server":
        assert got[1] == want.message, (where, want.line(), got)
    if want.answer == "crashes":
        assert "GGML_ASSERT(nread <= state_size)" in got[1] and "nread <= state_size" in want.message, (where, got)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_every_damage_family_per_consumer(build: str, model: str, builds: dict[str, InstalledBuild],
                                          tmp_path: Path) -> None:
    gguf = DATA / "gen-models" / f"{model}.gguf"
    profile = load_model_profile(gguf)
    base = (DATA / f"gen-{build}" / f"{model}-f16-fa0-unified0-slot.seqstate").read_bytes()
    eng = Consumers(build, gguf, tmp_path)
    seen: dict[str, int] = {}
    try:
        for name, corruption in CATALOG.items():
            try:
                data = corruption.apply(base, profile).data
            except CorruptionError:
                continue  # the family has no target in this memory (a recurrent field in a KV cache)
            path = tmp_path / f"{name}.bin"
            path.write_bytes(data)
            res = read_state(data=data, profile=profile)
            answers = {a.consumer: a for a in consumer_answers(res, profile, compatibility(res, profile, data=data),
                                                               n_ctx=256, flash_attn=False) if a.build == build}
            _check(eng.libllama(path), answers["libllama"], f"{name} libllama")
            _check(eng.server(path), answers["llama-server"], f"{name} llama-server")
            for a in answers.values():
                seen[a.answer] = seen.get(a.answer, 0) + 1
    finally:
        eng.close()
    assert seen.get("loads") and seen.get("refuses"), seen  # the suite covers both answers on every memory
    assert seen.get("unknown", 0) <= 4, seen  # nearly every family gets a definite answer (both consumers count)


@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_a_token_outside_the_vocabulary_loads_in_libllama_and_not_in_the_server(
        build: str, tmp_path: Path, builds: dict[str, InstalledBuild]) -> None:
    gguf = DATA / "gen-models" / "llama.gguf"
    profile = load_model_profile(gguf)
    base = (DATA / f"gen-{build}" / "llama-f16-fa0-unified0-slot.seqstate").read_bytes()
    tokens = read_state(data=base, profile=profile).tokens
    at = base.index(struct.pack(f"<{len(tokens)}i", *tokens))
    data = base[:at + 4] + struct.pack("<i", profile.n_vocab + 5) + base[at + 8:]
    path = tmp_path / "oov.bin"
    path.write_bytes(data)
    res = read_state(data=data, profile=profile)
    answers = {(a.build, a.consumer): a for a in consumer_answers(res, profile, compatibility(res, profile, data=data))}
    lib, srv = answers[(build, "libllama")], answers[(build, "llama-server")]
    assert (lib.answer, srv.answer) == ("loads", "refuses")
    assert srv.message == "Unable to restore slot: Invalid tokens in slot save file"
    eng = Consumers(build, gguf, tmp_path)
    try:
        _check(eng.libllama(path), lib, "libllama")
        _check(eng.server(path), srv, "llama-server")
    finally:
        eng.close()
