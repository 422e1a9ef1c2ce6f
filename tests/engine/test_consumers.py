"""Compatibility per consumer (#18 item 4): for each pinned build, libllama (llama_state_seq_load_file)
and llama-server (/slots/N?action=restore) answered apart, loads / refuses (with the message) /
crashes (the assert), checked against the real builds on every damage family of the corruption
suite (core/lab/corruptions.py) applied to a real llama-server slot save of each memory class, and
on a token outside the vocabulary, which libllama loads and llama-server refuses."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.compat import compatibility
from kvscope.core.analysis.consumers import (
    LOAD_FAILED,
    SERVER_PREFIX,
    ConsumerAnswer,
    consumer_answers,
    cut_file_answer,
)
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.engine.server import ServerDied, ServerHTTPError, ServerProcess
from kvscope.core.lab.corruptions import CATALOG, CorruptionError
from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource

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
        self.last_log = ""

    def libllama(self, path: Path) -> tuple[str, str]:
        if self.lib is None or not self.lib.alive:
            self.lib = LlamaProcess(self.model, CTX, build=self.build)
        o = self.lib.state_seq_load_file(path, 0, 4096)
        self.last_log = "\n".join(o.log)
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
                # a cut file is often unknown by the rule (what it reads past the end is what the stack held)
                key = a.answer if corruption.kind != "truncate" or a.answer != "unknown" else "unknown cut"
                seen[key] = seen.get(key, 0) + 1
    finally:
        eng.close()
    assert seen.get("loads") and seen.get("refuses"), seen  # the suite covers both answers on every memory
    assert seen.get("unknown", 0) <= 4, seen  # nearly every other family gets a definite answer (both consumers)


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


# --- truncated sequence files: the crash, the refusals and what the bytes cannot tell ------------------------

# every memory class the fixture generator writes (tests/data/gen-models/models.json)
CLASSES = {"llama": "kv", "qwen3vl": "kv-mrope", "gemma2": "iswa", "mamba": "recurrent", "lfm2": "hybrid",
           "qwen35": "hybrid", "lfm2-swa": "hybrid_iswa", "qwen4exp": "hybrid_idx", "glm5-next": "hybrid_idx",
           "deepseek32": "dsa", "glm-dsa": "dsa", "dots3note": "dsa_iswa", "minimax-m3": "msa", "deepseek4": "dsv4"}
SERVER_MODELS = ("llama", "mamba", "qwen35", "deepseek4")  # llama-server too (a server start costs seconds)
PER_ANSWER = 2  # cut points per definite answer, class and build (each crash restarts the engine)


def _slot(build: str, model: str) -> bytes:
    return (DATA / f"gen-{build}" / f"{model}-f16-fa0-unified0-slot.seqstate").read_bytes()


def _cut_points(data: bytes, profile: ModelProfile) -> list[int]:
    """Cuts at every record of the memory state (its boundary, a few bytes into its header, the middle and
    the last byte of its payload): where the rule can give a definite answer."""
    res = read_state(data=data, profile=profile)
    pts: set[int] = set()
    for leaf in res.root.leaves():
        if leaf.kind == "layer_header":
            pts.update((leaf.offset, leaf.offset + 3, leaf.offset + 5))
        elif leaf.kind.endswith("_rows"):
            pts.update((leaf.offset + leaf.size // 2, leaf.end - 1))
    return sorted(p for p in pts if 12 < p < len(data))


def _answers(build: str, data: bytes, profile: ModelProfile) -> dict[str, ConsumerAnswer]:
    res = read_state(data=data, profile=profile)
    return {a.consumer: a for a in consumer_answers(res, profile, compatibility(res, profile, data=ByteSource(data)),
                                                    n_ctx=256, flash_attn=False) if a.build == build}


@functools.cache
def _sample(build: str, model: str) -> tuple[int, ...]:
    """Cut points with a definite libllama answer, spread over the file: PER_ANSWER crashes and
    PER_ANSWER refusals (only :func:`cut_file_answer`, which reads the file once, decides the sample)."""
    profile = load_model_profile(DATA / "gen-models" / f"{model}.gguf")
    data = _slot(build, model)
    by: dict[str, list[int]] = {}
    for p in _cut_points(data, profile):
        cut = cut_file_answer(read_state(data=data[:p], profile=profile), profile)
        if cut is not None and cut.answer != "unknown":
            by.setdefault(cut.answer, []).append(p)
    out: list[int] = []
    for pts in by.values():
        step = max(1, len(pts) // PER_ANSWER)
        out += pts[::step][:PER_ANSWER]
    return tuple(sorted(out))


TRUNCATIONS = [(b, m, p) for b in ("b11434", "0c1e5709") for m in CLASSES for p in _sample(b, m)]
_ENGINES: dict[tuple[str, str], Consumers] = {}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str], Consumers]]:
    """One libllama child and one llama-server per build and model, kept across the cut points."""
    folder = tmp_path_factory.mktemp("cuts")

    def get(build: str, model: str) -> Consumers:
        key = (build, model)
        if key not in _ENGINES:
            _ENGINES[key] = Consumers(build, DATA / "gen-models" / f"{model}.gguf", folder)
        return _ENGINES[key]

    try:
        yield get
    finally:
        for eng in _ENGINES.values():
            eng.close()
        _ENGINES.clear()


@pytest.mark.parametrize(("build", "model", "cut"), TRUNCATIONS,
                         ids=[f"{b}-{CLASSES[m]}-{m}-cut{p}" for b, m, p in TRUNCATIONS])
def test_a_truncated_file_per_consumer(build: str, model: str, cut: int, builds: dict[str, InstalledBuild],
                                       engines: Callable[[str, str], Consumers]) -> None:
    """A slot cut at ``cut``: the predicted crash (every read past the end keeps a value that passes) or
    refusal (a later record's header keeps the record before's, which does not fit) is what libllama
    does, and llama-server for the classes in SERVER_MODELS."""
    profile = load_model_profile(DATA / "gen-models" / f"{model}.gguf")
    data = _slot(build, model)[:cut]
    want = _answers(build, data, profile)
    assert want["libllama"].answer in ("crashes", "refuses"), want["libllama"].line()
    eng = engines(build, model)
    path = eng.folder / f"{build}-{model}-{cut}.seqstate"
    path.write_bytes(data)
    where = f"{CLASSES[model]} ({model}) {build}, cut at {cut} of {len(_slot(build, model))}"
    _check(eng.libllama(path), want["libllama"], f"{where}: libllama")
    if want["libllama"].answer == "refuses":
        assert got_log_has(eng, want["libllama"].message), (where, want["libllama"].line())
    if model in SERVER_MODELS:
        _check(eng.server(path), want["llama-server"], f"{where}: llama-server")


def got_log_has(eng: Consumers, message: str) -> bool:
    """libllama's last refusal logged the predicted check (its words before the parenthesis)."""
    return message.split(" (")[0] in eng.last_log


def test_every_memory_class_has_definite_truncations() -> None:
    """The sample is not empty where the rule can tell: a crash for every class whose last record loop
    holds two records or a payload (the cut inside the last payload reads nothing checked)."""
    for b in ("b11434", "0c1e5709"):
        for m in ("llama", "gemma2", "mamba", "qwen35", "qwen4exp", "deepseek32", "dots3note", "minimax-m3",
                  "deepseek4"):
            assert _sample(b, m), (b, m)


@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_the_server_refuses_a_file_cut_in_its_tokens(build: str, builds: dict[str, InstalledBuild],
                                                     engines: Callable[[str, str], Consumers]) -> None:
    """llama-server asks for the token count first (tokens_out NULL): a file that ends inside its token
    array is refused before the memory is read; libllama, which reads the tokens short and the memory
    past the end, depends on what the stack held."""
    profile = load_model_profile(DATA / "gen-models" / "llama.gguf")
    data = _slot(build, "llama")[:40]
    want = _answers(build, data, profile)
    assert want["libllama"].answer == "unknown"
    assert want["llama-server"].line().endswith("refuses: " + SERVER_PREFIX + LOAD_FAILED)
    eng = engines(build, "llama")
    path = eng.folder / f"{build}-tokens-cut.seqstate"
    path.write_bytes(data)
    _check(eng.server(path), want["llama-server"], "llama-server")


@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_a_truncated_blob_is_refused(build: str, builds: dict[str, InstalledBuild]) -> None:
    """``llama_state_seq_set_data`` reads a buffer that throws at its end ("unexpectedly reached end of
    buffer"): a cut blob is refused, never read past its end, wherever it is cut."""
    for model in ("llama", "mamba", "qwen35", "deepseek4"):
        profile = load_model_profile(DATA / "gen-models" / f"{model}.gguf")
        blob = (DATA / f"gen-{build}" / f"{model}-f16-fa0-unified0-seq0.seqdata.bin").read_bytes()
        with LlamaProcess(DATA / "gen-models" / f"{model}.gguf", CTX, build=build) as lib:
            for cut in sorted({20, len(blob) // 3, len(blob) // 2, len(blob) - 13, len(blob) - 1}):
                data = blob[:cut]
                res = read_state(data=data, profile=profile)
                lib_want = next(a for a in consumer_answers(res, profile, compatibility(res, profile,
                                data=ByteSource(data))) if a.build == build and a.consumer == "libllama")
                o = lib.state_seq_set_data(data, 0)
                got = "crashes" if o.aborted else "loads" if o.ok and o.value else "refuses"
                where = (model, build, cut, lib_want.line(), o.log[-2:])
                assert (lib_want.answer, got) == ("refuses", "refuses"), where


def test_the_issues_truncated_hybrid(builds: dict[str, InstalledBuild],
                                     engines: Callable[[str, str], Consumers]) -> None:
    """The issue's case: a truncated hybrid (attention, then a recurrent state, as jamba) that b11434
    aborts on where kvscope said "refuses". glm5-next's slot cut 11 bytes into the first K header of its
    last cache (the indexer): the row size's last byte is read past the end into a variable no record
    set before, so the abort is what the stack held, not the bytes: unknown, not refuses. One byte later
    (the header whole, the cut in the payload) every read past the end is payload: crashes, predicted.
    And qwen35 (attention, then the recurrent state last) cut inside its s payload: crashes in both
    consumers."""
    for model, cut, want in (("glm5-next", 8799, "unknown"), ("glm5-next", 8800, "crashes"),
                             ("qwen35", 13000, "crashes")):
        profile = load_model_profile(DATA / "gen-models" / f"{model}.gguf")
        data = _slot("b11434", model)[:cut]
        answers = _answers("b11434", data, profile)
        assert answers["libllama"].answer == want, answers["libllama"].line()
        eng = engines("b11434", model)
        path = eng.folder / f"issue-{model}-{cut}.seqstate"
        path.write_bytes(data)
        got = eng.libllama(path)
        assert got[0] == "crashes" and "GGML_ASSERT(nread <= state_size)" in got[1], (model, cut, got)
        if want == "unknown":
            assert "read past the end" in answers["libllama"].message
        else:
            _check(eng.server(path), answers["llama-server"], f"{model} cut at {cut}: llama-server")


@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_nan_values_found_by_the_statistics_load_in_both_consumers(
        build: str, tmp_path: Path, builds: dict[str, InstalledBuild]) -> None:
    """llama.cpp copies the rows into its cache without looking at them: a slot whose only error is
    NaN values (``nonfinite_values``, found by ``--stats``) loads in libllama and llama-server, and the
    answers say so (they said "refuses: the file is damaged" once the statistics had run)."""
    from kvscope.core.analysis.stats import scan_stats
    from kvscope.core.lab.corruptions import parse_spec

    gguf = DATA / "gen-models" / "llama.gguf"
    profile = load_model_profile(gguf)
    base = (DATA / f"gen-{build}" / "llama-f16-fa0-unified0-slot.seqstate").read_bytes()
    data = parse_spec("fill:value=nan,role=v,il=1,cells=1-2").apply(base, profile).data
    path = tmp_path / "nan.bin"
    path.write_bytes(data)
    res = read_state(data=data, profile=profile)
    scan_stats(res, data=data)
    assert any(f.code == "nonfinite_values" and f.severity == "error" for f in res.findings)
    answers = {a.consumer: a for a in consumer_answers(res, profile, compatibility(res, profile, data=data),
                                                       n_ctx=256, flash_attn=False) if a.build == build}
    assert (answers["libllama"].answer, answers["llama-server"].answer) == ("loads", "loads"), answers
    eng = Consumers(build, gguf, tmp_path)
    try:
        _check(eng.libllama(path), answers["libllama"], "libllama")
        _check(eng.server(path), answers["llama-server"], "llama-server")
    finally:
        eng.close()
