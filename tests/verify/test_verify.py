"""kvscope verify against the real pinned builds and a real llama-server: healthy files of every kind are
``ok`` in both builds, a PR #21576 file names its missing layer, stale K/V are ``stale``, a v4 file on
0c1e5709 is ``incompatible`` with the build that loads it named, an aborting file is an outcome."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, MODELS, load_manifest, model_path
from kvharness.states import (
    OTHER,
    PROMPT,
    drop_records,
    kv_records,
    model_with_permuted_embeddings,
    with_media_payload,
    write_states,
)
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.llamacpp import CtxParams
from kvscope.core.engine.server import ServerProcess
from kvscope.core.verify.result import VerifyResult
from kvscope.core.verify.run import Verifier, VerifyError, verify

FIXTURE_TOKENS = {
    e["file"]: e["seqs"] for e in load_manifest(MODELS / "manifest.json")["files"] if e.get("seqs")}


def _ok(r: VerifyResult) -> None:
    assert r.verdict == "ok", (r.reasons, r.restore)
    assert r.restore is not None and r.restore.ok
    assert r.comparison is not None and r.comparison.records
    assert all(c.status == "match" for c in r.comparison.records)
    nt = r.next_token
    assert nt is not None and nt.same_argmax is True and nt.max_abs_logit_diff is not None
    assert nt.max_abs_logit_diff < 1e-3 and nt.kl is not None and nt.kl < 1e-6


# --- healthy files --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "llama-f16-fa0-unified0-seq1.seqstate", "llama-f16-fa1-unified1-ctx.session",
    "gemma2-f16-fa0-unified1-swafull0-seq0.seqstate", "lfm2-f16-fa0-unified0-seq0.seqstate",
    "mamba-f32state-n3-ctx.session", "llama-q8_0-fa1-unified0-seq2.seqstate"])
def test_0c1e5709_fixtures_are_ok(name: str, builds: dict[str, InstalledBuild]) -> None:
    key = name.split("-")[0]
    r = verify(MODELS / name, model_path(key))
    assert r.engine["kind"] == "llama.cpp" and r.engine["build"] == "0c1e5709"
    assert "writes layout 2026-10" in r.engine["reason"]
    _ok(r)
    assert r.comparison is not None and all(c.exact for c in r.comparison.records)  # the writing build: bit for bit


def test_a_blob_is_ok_with_its_tokens(builds: dict[str, InstalledBuild]) -> None:
    name = "llama-f16-fa0-unified0-seq1.seqdata.bin"
    r = verify(MODELS / name, model_path("llama"), tokens=FIXTURE_TOKENS[name]["1"]["token_ids"])
    _ok(r)
    bare = verify(MODELS / name, model_path("llama"))  # no tokens: only the restore is checked, and it says so
    assert bare.verdict == "ok" and bare.comparison is None and bare.restore is not None and bare.restore.ok
    assert "--tokens" in str(bare.prefill["reason"])


@pytest.mark.parametrize("kind", ["seq_file", "seq_blob", "session", "ctx_blob"])
def test_b11434_states_are_ok_in_b11434(kind: str, builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    paths = write_states("b11434", tmp_path)
    tokens = PROMPT if kind in ("seq_blob", "ctx_blob") else None
    r = verify(paths[kind], model_path("llama"), tokens=tokens)
    assert r.layout == "2026-10-v4" and r.engine["build"] == "b11434"
    _ok(r)


def test_a_rotated_q8_cache_is_derotated_and_ok(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    from tests.support.gguf_variants import llama_head64  # head size 64: llama.cpp rotates a q8_0 cache

    model = llama_head64(model_path("llama"), tmp_path / "llama-head64.gguf")
    paths = write_states("b11434", tmp_path, ctx=CtxParams(type_k="q8_0", type_v="q8_0", flash_attn=True),
                         model=model)
    r = verify(paths["seq_file"], model)
    _ok(r)
    assert r.engine["rotation"] == [{"n_rot_k": 64, "n_rot_v": 64}]


def test_a_slot_file_through_a_real_llama_server(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    with ServerProcess(model_path("llama"), build="b11434", n_ctx=512) as srv:
        c = srv.client()
        c.complete(PROMPT, n_predict=0)
        c.slot_save(0, "slot0.bin")
        slot = Path(srv.slot_dir) / "slot0.bin"
        own = verify(slot, model_path("llama"), engine="server", server_url=srv.url, slot_dir=srv.slot_dir)
        copy = shutil.copy(slot, tmp_path / "slot0.bin")
    assert own.engine["kind"] == "server" and own.engine["started_by_kvscope"] is False
    _ok(own)
    assert own.next_token is not None and "llama-server" in own.next_token.basis
    started = verify(copy, model_path("llama"), engine="server")  # kvscope starts the chosen build's server
    assert started.engine["started_by_kvscope"] is True and started.engine["build"] == "b11434"
    _ok(started)
    lib = verify(copy, model_path("llama"))  # the same slot file in libllama
    _ok(lib)


def test_multimodal_slot_compares_the_text_before_the_media(builds: dict[str, InstalledBuild],
                                                            tmp_path: Path) -> None:
    with ServerProcess(model_path("llama"), build="b11434", n_ctx=512) as srv:
        c = srv.client()
        c.complete(PROMPT, n_predict=0)
        c.slot_save(0, "slot0.bin")
        slot = shutil.copy(Path(srv.slot_dir) / "slot0.bin", tmp_path / "slot0.bin")
    mm = with_media_payload(Path(slot), tmp_path / "mm.bin", media_at=5, media_len=4)
    r = verify(mm, model_path("llama"))
    assert r.restore is not None and r.restore.ok
    assert r.prefill["n_media"] == 1 and r.prefill["limit_pos"] == 5 and r.prefill["seqs"] == {"0": 5}
    assert any("media chunk" in n and "cannot be re-prefilled" in n for n in r.notes)
    assert r.comparison is not None
    assert all(c.status == "match" and c.n_cells == 5 for c in r.comparison.records)
    assert sum(c.not_compared for c in r.comparison.cells) == len(PROMPT) - 5
    assert r.next_token is not None and r.next_token.skipped
    assert r.verdict == "ok"


# --- damaged, stale, incompatible ------------------------------------------------------------------
@pytest.mark.parametrize("build", ["0c1e5709", "b11434"])
@pytest.mark.parametrize("roles", ["k", "kv"])
def test_a_record_dropped_among_alike_layers_is_named(build: str, roles: str, builds: dict[str, InstalledBuild],
                                                      tmp_path: Path) -> None:
    paths = write_states(build, tmp_path)
    k, v = kv_records(paths["seq_file"])
    assert len(k) == 4 and len({(r.type_id, r.row_bytes) for r in k}) == 1  # alike layers
    drop = [k[2]] + ([v[2]] if roles == "kv" else [])
    bad = drop_records(paths["seq_file"], tmp_path / "dropped.seqstate", drop)
    r = verify(bad, model_path("llama"))
    assert r.verdict == "damaged"
    assert r.comparison is not None
    missing = [(c.role, c.il) for c in r.comparison.records if c.status == "missing"]
    assert missing == ([("k", 2)] if roles == "k" else [("k", 2), ("v", 2)])
    others = [c for c in r.comparison.records if c.status != "missing"]
    assert len(others) == 8 - len(drop) and all(c.status == "match" for c in others)
    shifted = [c for c in others if c.file_il is not None]  # the reader calls K3 "layer 2": verify says whose it is
    assert [(c.role, c.il, c.file_il) for c in shifted if c.role == "k"] == [("k", 3, 2)]
    assert any("layer 2 K" in x and "missing" in x for x in r.reasons), r.reasons
    j = r.to_json()
    assert {"section", "stream", "role", "il", "status", "max_abs"} <= set(j["records"][0])


def test_k_v_of_another_prefix_are_stale(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    paths = write_states("0c1e5709", tmp_path, tokens=OTHER, saved_tokens=PROMPT)
    r = verify(paths["seq_file"], model_path("llama"))
    assert r.restore is not None and r.restore.ok
    assert r.verdict == "stale", r.reasons
    assert r.comparison is not None
    first = [c.first_cell for c in r.comparison.records]
    assert all(c.status == "differs" for c in r.comparison.records)
    assert all(f is not None and f["pos"] == 1 for f in first[1:])  # the prefixes share token 0


def test_k_v_of_another_model_are_stale(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    other = model_with_permuted_embeddings(model_path("llama"), tmp_path / "other.gguf")
    paths = write_states("b11434", tmp_path, model=other)
    r = verify(paths["session"], model_path("llama"))
    assert r.verdict == "stale", r.reasons
    assert r.next_token is not None and r.next_token.max_abs_logit_diff is not None
    assert r.next_token.max_abs_logit_diff > 0.01


def test_a_nan_row_layer_is_damaged_with_its_cells(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    from kvharness.fixtures import profile
    from kvscope.core.lab.corruptions import parse_spec

    paths = write_states("0c1e5709", tmp_path)
    m = parse_spec("fill:value=nan,role=v,index=1,cells=3-5").apply(paths["seq_file"].read_bytes(), profile("llama"))
    bad = tmp_path / "nan.seqstate"
    bad.write_bytes(m.data)
    r = verify(bad, model_path("llama"))
    assert r.verdict == "damaged"
    assert r.comparison is not None
    wrong = [c for c in r.comparison.records if c.status != "match"]
    assert [(c.role, c.il, c.status, c.n_bad_cells) for c in wrong] == [("v", 1, "nonfinite", 3)]
    assert wrong[0].first_cell == {"index": 3, "pos": 3}
    assert r.next_token is not None and r.next_token.same_argmax is not None


def test_a_v4_file_on_0c1e5709_is_incompatible(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    paths = write_states("b11434", tmp_path)
    for kind in ("seq_file", "seq_blob"):
        r = verify(paths[kind], model_path("llama"), build="0c1e5709", tokens=PROMPT)
        assert r.verdict == "incompatible", (kind, r.reasons)
        assert r.engine["build"] == "0c1e5709" and not r.restore.ok  # type: ignore[union-attr]
        assert any("b11434" in x for x in r.reasons), r.reasons
        assert r.comparison is not None and all(c.status == "match" for c in r.comparison.records)
        want = "unknown (magic, version)" if kind == "seq_file" else "mismatched key type"
        assert want in r.restore.message  # type: ignore[union-attr]


def test_an_aborting_file_is_an_outcome(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    """A seq file cut 100 bytes short makes llama.cpp read past its end and abort (spec 2.2)."""
    paths = write_states("b11434", tmp_path)
    cut = tmp_path / "cut.seqstate"
    cut.write_bytes(paths["seq_file"].read_bytes()[:-100])
    r = verify(cut, model_path("llama"))
    assert r.restore is not None and r.restore.aborted == "SIGABRT" and not r.restore.ok
    assert r.restore.message.startswith("engine aborted: SIGABRT")
    assert r.verdict == "damaged"
    assert r.comparison is not None  # the prefill ran in a new child
    assert [(c.role, c.il) for c in r.comparison.records if c.status != "match"] == [("v", 3)]
    assert r.comparison.records[-1].status == "missing"  # the reader holds no record the file ends inside
    assert any(f["code"] == "truncated" for f in r.findings)


def test_setup_errors(builds: dict[str, InstalledBuild], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"
    with pytest.raises(VerifyError, match=r"no such file \(--model names the GGUF model file\)"):
        verify(f, tmp_path / "none.gguf")
    with pytest.raises(VerifyError, match="not a llama.cpp state file"):
        verify(model_path("llama"), model_path("llama"))
    with pytest.raises(VerifyError, match="unknown llama.cpp build"):
        verify(f, model_path("llama"), build="b1")
    with pytest.raises(VerifyError, match="restores slot files"):
        verify(MODELS / "llama-f16-fa0-unified0-ctx.session", model_path("llama"), engine="server")
    with pytest.raises(VerifyError, match="n_seq_max"):
        verify(f, model_path("llama"), overrides={"n_seq_max": "1"})
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(tmp_path / "empty"))
    with pytest.raises(VerifyError, match=r"kvscope llama-build --build 0c1e5709"):
        verify(f, model_path("llama"))


def test_progress_and_cancel(builds: dict[str, InstalledBuild]) -> None:
    seen: list[tuple[int, int, str]] = []
    v = Verifier(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", model_path("llama"),
                 progress=lambda d, t, s: seen.append((d, t, s)))
    _ok(v.run())
    assert seen[-1][0] == seen[-1][1] and [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    assert any("comparing" in s or "kv" in s for _, _, s in seen)

    def stop(d: int, t: int, s: str) -> None:
        if "restoring" in s:
            w.cancel()

    w = Verifier(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", model_path("llama"), progress=stop)
    r = w.run()
    assert r.cancelled and r.comparison is None


def test_torch_engine_restores_only(tmp_path: Path) -> None:
    r = verify(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", model_path("llama"), engine="torch")
    assert r.engine["kind"] == "torch" and r.restore is not None and r.restore.ok
    assert r.verdict == "ok" and r.comparison is None
    assert any("restores only" in n for n in r.notes)
    bad = verify(MODELS.parent / "lab/llamacpp-2026-10-01/llama/drop_k_layer_1.seqdata.bin", model_path("llama"),
                 engine="torch")
    assert bad.verdict == "damaged" and bad.restore is not None and not bad.restore.ok


def test_own_library_and_the_migration_hint(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    lib = tmp_path / "mylib"
    lib.mkdir()
    for f in builds["b11434"].lib_dir.iterdir():
        (lib / f.name).symlink_to(f.resolve())
    r = verify(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", model_path("llama"), lib_path=str(lib))
    assert r.engine["build"] is None and r.engine["abi"]["verified"] is False
    assert any("cannot be verified" in n for n in r.notes)
    assert r.verdict == "incompatible"  # the message names the version llama.cpp refused
    assert any("layouts that load it: 2026-10 (llama.cpp 0c1e5709)" in x for x in r.reasons)
    pinned = verify(MODELS / "llama-f16-fa0-unified0-seq1.seqstate", model_path("llama"), build="b11434")
    assert any("kvscope rewrite --layout 2026-10-v4" in x for x in pinned.reasons)


def test_rotated_rows_compare_with_unrotated_ones_after_derotation(builds: dict[str, InstalledBuild],
                                                                    tmp_path: Path) -> None:
    """A rotated q8_0 file against a prefill with rotation disabled: only de-rotated values can match."""
    from tests.support.gguf_variants import llama_head64

    model = llama_head64(model_path("llama"), tmp_path / "llama-head64.gguf")
    q8 = CtxParams(type_k="q8_0", type_v="q8_0", flash_attn=True)
    rotated = write_states("b11434", tmp_path / "rot", ctx=q8, model=model)["seq_file"]
    plain = write_states("b11434", tmp_path / "plain", ctx=CtxParams(type_k="q8_0", type_v="q8_0", flash_attn=True,
                                                                     env=(("LLAMA_ATTN_ROT_DISABLE", "1"),)),
                         model=model)["seq_file"]
    own = verify(plain, model)  # the file says n_rot 0: verify runs the child with rotation off, as it was saved
    _ok(own)
    assert own.context["ctx"]["env"] == {"LLAMA_ATTN_ROT_DISABLE": "1"}
    cross = verify(rotated, model, overrides={"env.LLAMA_ATTN_ROT_DISABLE": "1"})
    assert cross.restore is not None and not cross.restore.ok and "rotation" in cross.restore.message
    assert cross.comparison is not None
    recs = cross.comparison.records
    assert all(c.status == "match" for c in recs), [(c.role, c.il, c.status, c.rms_rel) for c in recs]
    assert not any(c.exact for c in recs)  # q8_0 blocks of rotated and plain rows are not the same bytes


ROT_MODELS = ("llama", "gemma2", "deepseek4", "qwen35")


def _generated_cases() -> list[tuple[str, str, str]]:
    """(build, file, model) from tests/data/gen-*: every model's llama-server slot save, and for a few models
    a quantized seq file with rotation on and one saved with LLAMA_ATTN_ROT_DISABLE=1."""
    out = []
    for build in ("0c1e5709", "b11434"):
        folder = DATA / f"gen-{build}"
        for f in load_manifest(folder / "manifest.json")["files"]:
            name = str(f["file"])
            quant = f["model_key"] in ROT_MODELS and "q8_0" in name and name.endswith("seq0.seqstate")
            if f["kind"] == "seq_file" and ("slot" in name or quant):
                out.append((build, name, str(f["model_file"])))
    return out


@pytest.mark.parametrize(("build", "name", "model"), _generated_cases(), ids=lambda x: str(x).split("/")[-1])
def test_generated_fixtures_of_every_memory_class_are_ok(build: str, name: str, model: str,
                                                         builds: dict[str, InstalledBuild]) -> None:
    folder = DATA / f"gen-{build}"
    r = verify(folder / name, (folder / model).resolve())
    _ok(r)
    assert r.engine["build"] == build
    if "norot" in name and build == "0c1e5709":  # v3 does not record the rotation: found by the second try
        assert any("does not record the rotation" in n and "rotation off" in n for n in r.notes), r.notes
        assert r.context["ctx"]["env"] == {"LLAMA_ATTN_ROT_DISABLE": "1"}
    if name.startswith("deepseek4") and "slot" in name:  # DeepSeek-V4's compressed blocks pair row by row
        blocks = [c for c in r.comparison.records if c.section.startswith(("kcache", "comp"))]  # type: ignore[union-attr]
        assert blocks and all(c.stream is None and c.n_cells > 0 for c in blocks)


def test_a_server_binary_given_by_path(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    paths = write_states("b11434", tmp_path)
    r = verify(paths["seq_file"], model_path("llama"), engine="server", server_bin=str(builds["b11434"].server))
    _ok(r)
    assert r.engine["binary"] == str(builds["b11434"].server.resolve()) and r.engine["started_by_kvscope"] is True
    assert "--server-bin" in r.engine["reason"]


def test_a_few_damaged_records_of_an_unrecorded_rotation_are_not_verified_twice(
        builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    """A 2026-10 file does not record its rotation: verify tries the other setting only where every record
    of a rotated role differs (a file saved with LLAMA_ATTN_ROT_DISABLE=1), not for a file with one damaged
    record, whose second verification cost as much as the first and found nothing."""
    from kvscope.core.lab.corruptions import parse_spec
    from kvscope.core.model.profile import load_model_profile

    folder = DATA / "gen-0c1e5709"
    model = DATA / "gen-models" / "llama.gguf"
    src = folder / "llama-q8_0-fa1-unified0-seq0.seqstate"
    data = parse_spec("fill:value=0,role=k,il=1,cells=0-3").apply(src.read_bytes(), load_model_profile(model)).data
    bad = tmp_path / "one-k-record-zeroed.seqstate"
    bad.write_bytes(data)
    r = verify(bad, model)
    assert r.verdict == "damaged", r.reasons
    assert not any("does not record the rotation" in n for n in r.notes), r.notes
    assert "LLAMA_ATTN_ROT_DISABLE" not in r.context["ctx"]["env"]
