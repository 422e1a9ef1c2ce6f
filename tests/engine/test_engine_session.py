"""The engine session (core/engine/session.py, #30 item 6): libllama in a child process and a llama-server
driven through the same calls (restore, logits, save, clear, prefill, close) on a real fixture of the build
that wrote it (0c1e5709) and its tiny model. Verify's engines, the lab's live context and repair's rebuild run
on these calls; tests/test_architecture.py fails when core/verify or core/lab drive llama.cpp another way."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from kvharness.fixtures import MODELS, load_manifest, model_path
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.session import CtxParams, EngineSession, LlamaSession, ServerSession, restored
from kvscope.core.model.profile import load_model_profile
from kvscope.core.verify.engines import partial_utf8_tokens

NAME = "llama-f16-fa0-unified0-seq1.seqstate"  # sequence 1 of 3, 12 tokens, written by 0c1e5709
ENTRY = next(e for e in load_manifest(MODELS / "manifest.json")["files"] if e["file"] == NAME)
TOKENS: list[int] = ENTRY["token_payload"]["tokens"]
CP = ENTRY["context_params"]
CTX = CtxParams(n_ctx=CP["n_ctx"], n_batch=CP["n_batch"], n_ubatch=CP["n_ubatch"], n_seq_max=CP["n_seq_max"],
                kv_unified=CP["kv_unified"], flash_attn=CP["flash_attn"], type_k=CP["type_k"], type_v=CP["type_v"])
SEQ = 1
NEXT = TOKENS[-1]
# tokens that are not whole UTF-8 on their own: the server withholds the probabilities of one it samples, so
# the request bans them from being sampled, as verify's does (which one is sampled depends on the machine)
BANNED = [[t, False] for t in partial_utf8_tokens(load_model_profile(str(model_path("llama"))))]


@pytest.fixture(params=["llama.cpp", "server"])
def session(request: pytest.FixtureRequest, builds: dict[str, InstalledBuild]) -> Iterator[EngineSession]:
    model = str(model_path("llama"))
    s: EngineSession = (LlamaSession(model, CTX, build="0c1e5709", timeout_s=120) if request.param == "llama.cpp"
                        else ServerSession(model, CTX, build="0c1e5709", timeout_s=120, prefix="kvscope-test-"))
    with s:
        yield s


def _scores(s: EngineSession, o: Any) -> bool:
    """The next token's scores are there: every logit (libllama), the server's completion in the sequence's slot
    (its probabilities are withheld for a token that ends inside a character: the request bans those)."""
    if isinstance(s, LlamaSession):
        return bool(o.rc == 0 and o.value is not None and len(o.value) == 379)
    return bool(o.ok and o.value.get("id_slot") == SEQ and "completion_probabilities" in o.value)


def _memory(seq_file: bytes) -> bytes:
    """A sequence file's memory state, after its token list (llama-server writes the slot's own tokens)."""
    return seq_file[12 + 4 * int.from_bytes(seq_file[8:12], "little"):]


def test_one_session_api_restores_predicts_saves_clears_and_prefills(session: EngineSession) -> None:
    s, path, size = session, str(MODELS / NAME), (MODELS / NAME).stat().st_size
    assert s.alive and s.kind in ("llama.cpp", "server") and isinstance(s.info(), dict)

    o = s.restore("seq_file", SEQ, path=path, n_token_capacity=len(TOKENS) + 8)
    assert restored("seq_file", o) and o.rc == size, o
    original = _memory((MODELS / NAME).read_bytes())
    assert _memory(s.save("seq_file", SEQ, tokens=TOKENS)) == original  # the writing build: bit for bit
    request: dict[str, Any] = {"n_probs": 5} if isinstance(s, LlamaSession) else {"n_probs": 5, "logit_bias": BANNED}
    assert _scores(s, s.logits(SEQ, NEXT, TOKENS, **request))

    assert s.clear(SEQ)
    done = s.prefill(SEQ, TOKENS)  # a fresh prefill of the file's tokens gives the file back
    assert done.ok and done.piece == (0, len(TOKENS))
    fresh = s.save("seq_file", SEQ, tokens=TOKENS)
    assert _memory(fresh) == original

    s.clear(SEQ)
    done = s.prefill(SEQ, TOKENS, [(0, 6), (6, 12)])  # in pieces: the second decodes only the rest
    assert done.ok and done.piece == (6, 12)
    assert len(_memory(s.save("seq_file", SEQ, tokens=TOKENS))) == len(original)

    o = s.restore("seq_file", SEQ, data=fresh, n_token_capacity=len(TOKENS))  # from bytes too
    assert restored("seq_file", o) and o.rc == len(fresh)


def test_the_blob_kinds_round_trip_through_libllama(builds: dict[str, InstalledBuild]) -> None:
    with LlamaSession(str(model_path("llama")), CTX, build="0c1e5709", timeout_s=120) as s:
        assert s.prefill(SEQ, TOKENS).ok
        blob, ctx_blob = s.save("seq_blob", SEQ), s.save("context_blob")
        assert s.positions(SEQ) == (0, len(TOKENS) - 1)
        s.clear()
        assert s.positions(SEQ) == (-1, -1)
        assert restored("seq_blob", s.restore("seq_blob", SEQ, data=blob)) and s.save("seq_blob", SEQ) == blob
        s.clear()
        assert restored("context_blob", s.restore("context_blob", 0, data=ctx_blob))
        assert s.save("context_blob") == ctx_blob
        session_file = s.save("session_file", tokens=TOKENS)
        assert restored("session_file", s.restore("session_file", 0, data=session_file,
                                                  n_token_capacity=len(TOKENS)))


def test_a_server_session_deletes_its_slot_files_on_close(builds: dict[str, InstalledBuild]) -> None:
    with ServerSession(str(model_path("llama")), CTX, build="0c1e5709", timeout_s=120, prefix="kvscope-test-") as s:
        s.restore("seq_file", SEQ, data=(MODELS / NAME).read_bytes())
        s.save("seq_file", SEQ)
        folder = s.slot_dir
        assert [n for n in os.listdir(folder) if n.startswith("kvscope-test-")]
    assert not [n for n in os.listdir(folder) if n.startswith("kvscope-test-")] if os.path.isdir(folder) else True
