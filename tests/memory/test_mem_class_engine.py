"""The memory core against real llama.cpp (both pinned builds) for every memory class of the
generated models: the same rotation block sizes per cache, byte-identical round trips of every
state kind the build writes, and the same outcome of damaged restores (``contained`` policy).

One context per model and build (2 sequences, not unified, q8_0 K/V, flash attention) decodes two
prompts; the core is built from the model's profile and the same context parameters and given the
build's whole-context state. For each damage the build restores the damaged per-sequence state
through the buffer API and through a sequence file, and so does the core; the return value, the
message and every state the build writes afterwards (both sequences' blobs, the whole context) must
be the same. Payload garbage that llama.cpp accepts is not among the damage (its checks are on the
metadata).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import PARTIAL_ONLY, CtxParams, LlamaProcess
from kvscope.core.memory import ContextParams, MemoryContext
from kvscope.core.memory.infer import infer_context, load, write
from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.modelgen import load_recipe, write_model
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, ParseResult, Section

MODELS = ["deepseek32", "dots3note", "glm5-next", "qwen4exp", "minimax-m3", "deepseek4", "lfm2-swa", "gemma2"]
LAYOUT = {"0c1e5709": "2026-10", "b11434": "2026-10-v4"}
SEQ_MAGIC = 0x67677371
PROMPTS = ([1, 5, 9, 13, 17, 21, 3, 7, 11], [2, 4, 6, 8, 10])
Damage = Callable[[bytes, ParseResult], bytes]


def _sec(res: ParseResult, role: str) -> Section:
    return next(s for s in res.sections if s.role == role)


def _stream(sec: Section) -> KvStream:
    return next(st for st in sec.streams if st.data_offset is not None)


def _put(blob: bytes, off: int, fmt: str, value: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, off, value)
    return bytes(out)


def k_type(role: str, layer: int = -1) -> Damage:
    return lambda b, res: _put(b, _stream(_sec(res, role)).k_layers[layer].header_offset, "<i", 7)


def rotation(role: str) -> Damage:
    return lambda b, res: _put(b, (_stream(_sec(res, role)).data_offset or 0) + 8, "<I", 32)


def r_type(layer: int = 0) -> Damage:
    return lambda b, res: _put(b, _sec(res, "recurrent").r_layers[layer].header_offset, "<i", 7)


def cut(role: str) -> Damage:
    def damage(b: bytes, res: ParseResult) -> bytes:
        s = _sec(res, role)
        return b[: s.offset + s.size - 3]
    return damage


def field(role: str, name: str, value: int) -> Damage:
    def damage(b: bytes, res: ParseResult) -> bytes:
        node = _sec(res, role).node
        assert node is not None
        return _put(b, next(c for c in node.children if c.name == name).offset, "<I", value)
    return damage


def record(role: str, at: int, value: int) -> Damage:
    return lambda b, res: _put(b, _sec(res, role).records[0].header_offset + at, "<Q", value)


def idx_count(b: bytes, res: ParseResult) -> bytes:
    st = next(st for st in _sec(res, "kv_idx").streams if st.cell_count)
    return _put(b, st.offset, "<I", st.cell_count - 1)


# (damage name, damage, whether it touches a v4 rotation word)
CASES: dict[str, list[tuple[str, Damage, bool]]] = {
    "deepseek32": [("lid-type", k_type("kv_lid"), False), ("lid-rot", rotation("kv_lid"), True),
                   ("mla-type", k_type("kv_mla", 0), False), ("lid-cut", cut("kv_lid"), False)],
    "dots3note": [("lid-type", k_type("kv_lid"), False), ("swa-type", k_type("kv_swa"), False),
                  ("swa-rot", rotation("kv_swa"), True)],
    "glm5-next": [("idx-type", k_type("kv_idx"), False), ("recurrent-type", r_type(), False),
                  ("idx-count", idx_count, False), ("attn-type", k_type("kv_attn"), False)],
    "qwen4exp": [("idx-type", k_type("kv_idx"), False), ("recurrent-type", r_type(), False),
                 ("idx-rot", rotation("kv_idx"), True)],
    "minimax-m3": [("idx-type", k_type("kv_idx"), False), ("base-type", k_type("kv_base"), False)],
    "deepseek4": [("lid-layer-id", field("kcache_lid", "il0", 3), False),
                  ("hca-state-size", field("comp_hca", "state_size", 7), False),
                  ("csa-ne0", record("kcache_csa", 4, 65), False), ("comp-cut", cut("comp_lid"), False),
                  ("raw-rot", rotation("kv_raw_swa"), True)],
    "lfm2-swa": [("recurrent-type", r_type(), False), ("swa-type", k_type("kv_swa"), False)],
    "gemma2": [("swa-type", k_type("kv_swa"), False), ("base-rot", rotation("kv_base"), True)],
}


def _params(type_kv: str = "q8_0", env: tuple[tuple[str, str], ...] = ()) -> tuple[CtxParams, ContextParams]:
    eng = CtxParams(n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=2, kv_unified=False, flash_attn=True,
                    type_k=type_kv, type_v=type_kv, swa_full=False, env=env)
    core = ContextParams(n_ctx=256, n_seq_max=2, kv_unified=False, flash_attn=True, type_k=type_kv, type_v=type_kv,
                         swa_full=False, n_batch=64, n_ubatch=64, rot_disabled=bool(env))
    return eng, core


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, ModelProfile]]:
    d = tmp_path_factory.mktemp("models")
    out = {}
    for key in MODELS:
        path = d / f"{key}.gguf"
        write_model(load_recipe(key), path)
        out[key] = (path, load_model_profile(path))
    return out


def _engine(path: Path, build: str, cp: CtxParams) -> LlamaProcess:
    eng = LlamaProcess(path, cp, build=build, timeout_s=300)
    for seq, toks in enumerate(PROMPTS):
        out = eng.decode(seq, toks)
        assert out.ok and out.rc == 0, out.summary()
    return eng


def _states(eng: LlamaProcess, tmp: Path) -> Iterator[tuple[str, bytes]]:
    """Every state kind the build writes for this context."""
    yield "ctx", eng.state_get_data()
    for seq in (0, 1):
        yield f"seq{seq}", eng.state_seq_get_data(seq)
        yield f"seq{seq}-partial", eng.state_seq_get_data(seq, PARTIAL_ONLY)
    for name, call in (("seqfile", lambda p: eng.state_seq_save_file(p, 0, PROMPTS[0])),
                       ("session", lambda p: eng.state_save_file(p, PROMPTS[0] + PROMPTS[1]))):
        path = tmp / name
        assert call(path).ok
        yield name, path.read_bytes()


@pytest.mark.parametrize("build", sorted(LAYOUT))
@pytest.mark.parametrize("model", MODELS)
def test_rotation_and_round_trips(model: str, build: str, models: dict[str, tuple[Path, ModelProfile]],
                                  builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    path, prof = models[model]
    for type_kv, env in (("q8_0", ()), ("f16", ()), ("q4_0", (("LLAMA_ATTN_ROT_DISABLE", "1"),))):
        cp, mp = _params(type_kv, env)
        core = MemoryContext.create(prof, mp, LAYOUT[build])
        with _engine(path, build, cp) as eng:
            built = eng.info()["rotation"] or []
            mine = core.memory.kv_caches()
            # llama.cpp logs every llama_kv_cache it builds in order (DeepSeek-V4: its compressed caches after
            # the raw pair, which write no rotation words); 0c1e5709 logs the flags of the same rule
            for c, b in zip(mine, built, strict=False):
                if build == "b11434":
                    assert (c.n_rot_k, c.n_rot_v) == (b["n_rot_k"], b["n_rot_v"]), (model, type_kv, c.name)
                else:
                    assert (bool(c.n_rot_k), bool(c.n_rot_v)) == (bool(b["attn_rot_k"]), bool(b["attn_rot_v"]))
            assert len(built) >= len(mine)
            for name, data in _states(eng, tmp_path):
                res = read_state(data=data, profile=prof)
                assert res.n_errors == 0, (name, [f.message for f in res.findings if f.severity == "error"][:1])
                inf = infer_context(res, prof)
                if build == "b11434" and any(st.data_offset is not None for sec in res.sections if sec.kind == "kv"
                                             for st in sec.streams):  # the rotation words tell how the build ran
                    assert inf.ctx.memory.params.rot_disabled == bool(env), name
                loaded = load(inf, data)
                assert loaded.ok, (name, loaded)
                assert bytes(write(inf)) == data, (model, type_kv, name)


@pytest.mark.parametrize("build", sorted(LAYOUT))
@pytest.mark.parametrize("model", MODELS)
def test_damaged_restores_match_the_engine(model: str, build: str, models: dict[str, tuple[Path, ModelProfile]],
                                           builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    path, prof = models[model]
    cp, mp = _params()
    lay = LAYOUT[build]
    seq_file = tmp_path / "damaged.seqstate"
    with _engine(path, build, cp) as eng:
        ctx0 = eng.state_get_data()
        blob = eng.state_seq_get_data(0)
        res = read_state(data=blob, profile=prof)
        assert res.n_errors == 0
        for name, damage, rot in CASES[model]:
            if rot and build != "b11434":
                continue  # no rotation words before v4
            bad = damage(blob, res)
            core = MemoryContext.create(prof, mp, lay)
            assert core.set_data(ctx0).ok and bytes(core.get_data()) == ctx0
            assert eng.state_set_data(ctx0).rc == len(ctx0)
            out = eng.state_seq_set_data(bad, 0)
            mine = core.seq_set_data(bad, 0)
            assert (out.rc, mine.returned) == (0, 0), (name, out.rc, mine)
            assert any(_llama_message(mine.check) in line for line in out.log), (name, mine.check, out.log[-3:])
            assert _after(eng) == _after_core(core), (name, mine.actions)
            if "cut" in name:
                continue  # a truncated sequence file aborts llama.cpp (docs §2.2)
            version = 4 if build == "b11434" else 3
            seq_file.write_bytes(struct.pack("<III", SEQ_MAGIC, version, len(PROMPTS[0]))
                                 + struct.pack(f"<{len(PROMPTS[0])}i", *PROMPTS[0]) + bad[8:])
            assert eng.state_set_data(ctx0).rc == len(ctx0)
            assert core.set_data(ctx0).ok
            fout = eng.state_seq_load_file(seq_file, 0, 64)
            fmine = core.seq_load_file(seq_file, 0, 64)
            assert (fout.rc, fmine.returned) == (0, 0), (name, fout.rc, fmine)
            assert _after(eng) == _after_core(core), (name, "file", fmine.actions)


def _after(eng: LlamaProcess) -> tuple[bytes, bytes, bytes]:
    return eng.state_seq_get_data(0), eng.state_seq_get_data(1), eng.state_get_data()


def _after_core(core: MemoryContext) -> tuple[bytes, bytes, bytes]:
    return bytes(core.seq_get_data(0)), bytes(core.seq_get_data(1)), bytes(core.get_data())


_MESSAGES = {
    "k_type": "mismatched key type", "r_type": "mismatched r type", "n_rot_k": "incompatible key rotation",
    "truncated": "unexpectedly reached end of buffer", "mirror_count": "mirrored slot layout holds",
    "dsv4_layer_id": "DSV4 K-cache layer id mismatch", "dsv4_comp_meta": "DSV4 compressor state metadata mismatch",
    "dsv4_tensor_meta": "DSV4 state tensor metadata mismatch",
}


def _llama_message(check: str | None) -> str:
    """The text llama.cpp logs for the check the core failed."""
    assert check in _MESSAGES, check
    return _MESSAGES[check]


@pytest.mark.parametrize("type_kv", ["f16", "q8_0"])
@pytest.mark.parametrize(("source", "target"), [("0c1e5709", "b11434"), ("b11434", "0c1e5709")])
def test_converted_indexer_rows_load_in_the_other_build(source: str, target: str, type_kv: str,
                                                        models: dict[str, tuple[Path, ModelProfile]],
                                                        builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    """Qwen4exp's states converted through the core (indexer rows widened or narrowed) restore in the other
    build, and the next token's logits are those of a fresh prefill of the same tokens there."""
    from kvscope.core.convert.rewrite import rewrite_file

    path, prof = models["qwen4exp"]
    cp, _ = _params(type_kv)
    files: dict[str, Path] = {}
    with _engine(path, source, cp) as eng:
        for name, data in _states(eng, tmp_path):
            if name in ("seq0", "ctx", "seqfile", "session"):
                files[name] = tmp_path / f"{name}.src"
                files[name].write_bytes(data)
    with _engine(path, target, cp) as eng:
        eng.memory_clear()
        assert eng.decode(0, PROMPTS[0]).rc == 0
        fresh = eng.decode(0, [42]).value
        eng.memory_clear()
        cold = eng.decode(0, [42]).value
        assert fresh is not None and cold is not None and not np.allclose(fresh, cold)
        for name, src in files.items():
            out = tmp_path / f"{name}.out"
            done = rewrite_file(str(src), str(out), LAYOUT[target], prof)
            assert done.ok and done.method == "memory core", done.message
            data = out.read_bytes()
            eng.memory_clear()
            if name == "seq0":
                rc = eng.state_seq_set_data(data, 0).rc
            elif name == "ctx":
                rc = eng.state_set_data(data).rc
            elif name == "seqfile":
                rc = eng.state_seq_load_file(out, 0, 64).rc
            else:
                loaded = eng.state_load_file(out, 64)
                rc = len(data) if loaded.value is not None else 0
            assert rc == len(data), (name, rc)
            nxt = eng.decode(0, [42]).value
            assert nxt is not None and np.allclose(nxt, fresh, atol=1e-3), (name, float(np.max(np.abs(nxt - fresh))))


@pytest.mark.parametrize("model", MODELS)
def test_migrated_states_load_in_b11434(model: str, models: dict[str, tuple[Path, ModelProfile]],
                                        builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    """0c1e5709's quantized states of every class, rewritten as 2026-10-v4 (framing or through the core, with
    rotation words from the model's rule for each sub-cache), restore in b11434."""
    from kvscope.core.convert.rewrite import rewrite_file

    path, prof = models[model]
    cp, _ = _params("q8_0")
    with _engine(path, "0c1e5709", cp) as eng:
        files = {name: data for name, data in _states(eng, tmp_path) if name in ("seq0", "ctx", "seq1-partial")}
    with _engine(path, "b11434", cp) as eng:
        for name, data in files.items():
            src, out = tmp_path / f"{name}.v3", tmp_path / f"{name}.v4"
            src.write_bytes(data)
            done = rewrite_file(str(src), str(out), "2026-10-v4", prof)
            assert done.ok, done.message
            migrated = out.read_bytes()
            eng.memory_clear()
            if name == "ctx":
                got = eng.state_set_data(migrated)
            else:
                got = eng.state_seq_set_data(migrated, 0, PARTIAL_ONLY if "partial" in name else 0)
            assert got.rc == len(migrated), (name, done.method, got.log[-2:])
