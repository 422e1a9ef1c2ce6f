"""A slot's token list against its cells (issue #28 A): damaged copies of real slot files are flagged with
their byte ranges and predicted as llama-server answers them; no real fixture is flagged falsely.

Measured on b11434's llama-server (Gemma 3 270M, a 103-token f16 slot, 2026-12-07): a copy with one token
appended restores (HTTP 200, 104 tokens) and the next request that continues it fails with HTTP 500
"Invalid input batch." under ``--swa-full`` ("last position stored ... X = 102 ... starting position of
Y = 104"); without ``--swa-full`` it is re-processed in full. A copy with every position moved by one
restores and is continued without an error (``cache_n`` 103). The rule predicts exactly these."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.inspection import inspect_source
from kvscope.core.analysis.reuse import INVALID_BATCH, predict_reuse
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource
from kvscope.core.reader.token_cells import CODE, agreement
from tests.support.token_cells import append_token, shift_positions

GEN = DATA / "gen-b11434"
SLOT = GEN / "llama-f16-fa0-unified0-slot.seqstate"  # a real llama-server save (packed token payload)
ISWA_SLOT = GEN / "gemma2-f16-fa0-unified0-slot.seqstate"
RECURRENT_SLOT = GEN / "mamba-f16-fa0-unified0-slot.seqstate"
FRAG = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified1-frag-seq0.seqstate"
MODEL = {"llama": GEN.parent / "gen-models" / "llama.gguf", "gemma2": GEN.parent / "gen-models" / "gemma2.gguf",
         "mamba": GEN.parent / "gen-models" / "mamba.gguf"}


def _inspect(data: bytes, model: Path | None = None):  # type: ignore[no-untyped-def]
    prof = load_model_profile(model) if model is not None else None
    return inspect_source(ByteSource(data), prof)


def _flag(ins):  # type: ignore[no-untyped-def]
    found = [f for f in ins.result.findings if f.code == CODE]
    assert len(found) == 1, [f.message for f in ins.result.findings]
    return found[0]


def test_appended_token_is_an_error_and_the_server_fails_the_next_request() -> None:
    base = SLOT.read_bytes()
    res0 = read_state(data=base)
    assert res0.token_payload and res0.token_payload["format"] == "server_tokens"
    n = len(res0.tokens)
    ins = _inspect(append_token(base, res0.tokens[-1]), MODEL["llama"])
    f = _flag(ins)
    assert f.severity == "error" and ins.verdict.level == "damaged"
    cells = next(st.cells for st in ins.result.sections[0].streams if st.cells is not None and st.cells.count)
    assert (f.offset, f.length) == (cells.offset, cells.size)  # the cell records of the sequence, absolute
    assert f"{n} cells at positions 0..{n - 1} for {n + 1} tokens" in f.message
    assert f.extra["memory_pos_max"] == n - 1
    assert "Invalid input batch." in f.message
    # libllama restores it as it is; the slot restores; the next request fails
    v4 = next(c for c in ins.compatibility if c.generation == "2026-10-v4")
    assert v4.loads is True and "does not compare the token list" in v4.notes[0]
    server = [a for a in ins.consumers() if a.build == "b11434" and a.consumer == "llama-server"]
    assert server[0].answer == "loads"
    for e in (e for e in ins.reuse_prediction() if e.build == "b11434"):
        assert e.restores is True and e.reused_tokens == 0 and e.fails
        assert INVALID_BATCH in e.reason and f"ends at {n - 1}" in e.reason
        assert "next request fails" in e.line()


def test_shifted_positions_are_an_error_and_the_server_continues_a_misplaced_cache() -> None:
    base = SLOT.read_bytes()
    n = len(read_state(data=base).tokens)
    ins = _inspect(shift_positions(base), MODEL["llama"])
    f = _flag(ins)
    assert f.severity == "error" and f"{n} cells at positions 1..{n} for {n} tokens" in f.message
    assert "without an error" in f.message
    for e in (e for e in ins.reuse_prediction() if e.build == "b11434"):
        assert e.restores is True and not e.fails and e.reused_tokens == n
        assert "misplaced cache" in e.reason and "kvscope repair" in (e.fix or "")


def test_iswa_slot_fails_only_with_swa_full() -> None:
    """The measured case: an iSWA slot with one more token is re-processed in full by a default server (its
    SWA cache starts inside the window) and fails with --swa-full, which keeps it."""
    base = ISWA_SLOT.read_bytes()
    res0 = read_state(data=base)
    ins = _inspect(append_token(base, res0.tokens[-1]), MODEL["gemma2"])
    assert _flag(ins).severity == "error"
    got = {e.swa_full: e for e in ins.reuse_prediction() if e.build == "b11434"}
    assert got[True].fails and INVALID_BATCH in got[True].reason
    assert not got[False].fails and got[False].reused_tokens == 0 and "re-processing" in got[False].reason
    assert "--swa-full" not in (got[False].fix or "")  # --swa-full would make it fail: the advice is to re-save


def test_recurrent_state_is_checked_at_the_last_token() -> None:
    base = RECURRENT_SLOT.read_bytes()
    res0 = read_state(data=base)
    assert agreement(res0) is not None and agreement(res0).agrees  # type: ignore[union-attr]
    ins = _inspect(append_token(base, res0.tokens[-1]), MODEL["mamba"])
    f = _flag(ins)
    assert "recurrent state holds 1 cell" in f.message and f.severity == "error"


def test_plain_token_list_count_is_a_warning_and_fragmented_positions_an_info() -> None:
    """A plain token list may be a libllama application's: the frag fixture was written after
    llama_memory_seq_rm(seq 0, 5, 9) and one more token (positions 0-4, 9-13 for its 10 tokens): an info,
    not damage. The same file with a token appended: a warning."""
    base = FRAG.read_bytes()
    res0 = read_state(data=base)
    assert not res0.token_payload or res0.token_payload.get("format") != "server_tokens"
    ins = _inspect(base)
    f = _flag(ins)
    assert f.severity == "info" and "0..13 with 1 break" in f.message and "(s)" not in f.message
    assert ins.verdict.level == "healthy"
    more = _inspect(append_token(base, res0.tokens[-1]))
    assert _flag(more).severity == "warning" and more.verdict.level == "suspicious"


def _seq_files() -> list[Path]:
    return sorted(p for p in DATA.rglob("*.seqstate") if p.is_file())


@pytest.mark.slow  # every real fixture
def test_no_real_fixture_is_flagged_but_the_fragmented_ones() -> None:
    """Every real sequence file in tests/data (five builds, both generated sets and their variants: 687 with
    tokens) agrees, but the four written after a seq_rm, which are an info."""
    checked, flagged = 0, []
    for p in _seq_files():
        with ByteSource.open(p) as src:
            res = read_state(src)
        if res.kind != "seq_file" or not res.tokens:
            continue
        checked += 1
        for f in res.findings:
            if f.code == CODE:
                flagged.append((p.relative_to(DATA).as_posix(), f.severity))
    assert checked > 600
    assert sorted(flagged) == sorted((f"{d}/llama-f16-{fa}-unified1-frag-seq0.seqstate", "info") for d, fa in (
        ("llamacpp-2025-08-14", "fa0"), ("llamacpp-2026-08-16", "fa0"), ("llamacpp-2026-10-01", "fa0"),
        ("llamacpp-2026-10-01", "fa1")))


@pytest.mark.parametrize("folder", ["gen-b11434", "gen-0c1e5709"])
def test_real_slots_with_their_model_agree_and_are_reused(folder: str) -> None:
    """The real llama-server saves of both builds, read with their models: no finding, and no prediction says
    the next request fails."""
    slots = sorted((DATA / folder).glob("*-slot.seqstate"))
    assert len(slots) >= 14
    for p in slots:
        model = DATA / "gen-models" / (p.name.split("-f16-")[0].split("-q")[0] + ".gguf")
        prof = load_model_profile(model) if model.exists() else None
        ins = inspect_source(ByteSource(p.read_bytes()), prof)
        assert not [f for f in ins.result.findings if f.code == CODE], p.name
        assert not any(e.fails for e in predict_reuse(ins.result, prof, ins.compatibility)), p.name


def test_append_token_helper_keeps_the_packed_payload_readable() -> None:
    base = SLOT.read_bytes()
    res0 = read_state(data=base)
    res = read_state(data=append_token(base, 7))
    assert res.tokens == [*res0.tokens, 7] and [f.code for f in res.findings if f.severity == "error"] == [CODE]
    assert struct.unpack_from("<I", append_token(base, 7), 8)[0] == res0.header["n_token_count"] + 1
