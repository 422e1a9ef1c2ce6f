"""A file that fits its own structure but not the model given is a ``model_mismatch`` (suspicious), never
damaged: the verdict, the overview's model row, the compatibility answers and ``kvscope inspect``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from kvharness.fixtures import MODELS, profile
from kvscope.core.analysis.compat import compatibility
from kvscope.core.analysis.overview import build_overview
from kvscope.core.analysis.verdict import model_mismatch_reason, verdict
from kvscope.core.cli.main import main
from kvscope.core.reader.parse import read_state
from tests.support.bigstate import write_seq_state

SEQ = MODELS / "llama-f16-fa0-unified0-seq0.seqstate"  # magic, version, n_token_count, tokens, ...


def _with_tokens(tmp_path: Path, ids: list[int]) -> Path:
    """The llama seq file with its first token ids replaced by ``ids``."""
    data = bytearray(SEQ.read_bytes())
    n = struct.unpack_from("<I", data, 8)[0]
    assert len(ids) <= n
    struct.pack_into(f"<{len(ids)}i", data, 12, *ids)
    out = tmp_path / f"tokens-{len(ids)}.seqstate"
    out.write_bytes(bytes(data))
    return out


def test_a_larger_vocabulary_is_a_model_mismatch_not_damage(tmp_path: Path) -> None:
    n = struct.unpack_from("<I", SEQ.read_bytes(), 8)[0]
    prof = profile("llama")
    path = _with_tokens(tmp_path, [prof.n_vocab + 10 * i for i in range(n)])  # every id above the vocabulary
    res = read_state(path, profile=prof)
    assert {f.code for f in res.findings if f.severity == "error"} == {"token_out_of_vocab"}
    v = verdict(res, prof)
    assert (v.level, v.state, v.title) == ("suspicious", "model_mismatch", "model mismatch")
    assert v.line().startswith("model mismatch: ") and "larger vocabulary" in v.reason
    assert v.to_json()["state"] == "model_mismatch" and v.to_json()["level"] == "suspicious"
    ov = build_overview(res, prof, compatibility(res, prof))
    assert ov.model_fits is False and "vocabulary" in ov.model_note
    own = next(c for c in ov.compat or [] if c.generation == res.layout.name)
    assert own.loads is None and "damaged" not in own.answer and "model" in own.answer


def test_one_bad_token_is_still_damage(tmp_path: Path) -> None:
    prof = profile("llama")
    for ids in ([5000], [3, 99999], [3, 4, -7]):
        res = read_state(_with_tokens(tmp_path, ids), profile=prof)
        v = verdict(res, prof)
        assert v.state == "damaged" and model_mismatch_reason(res, prof) is None, ids
        ov = build_overview(res, prof)
        # the model fits the file: its token ids outside the vocabulary are the damage
        assert ov.model_fits is True and "does not fit" not in ov.model_note, ids


def test_random_ids_are_damage_not_a_larger_vocabulary(tmp_path: Path) -> None:
    n = struct.unpack_from("<I", SEQ.read_bytes(), 8)[0]
    rng = np.random.default_rng(3)
    ids = [int(x) for x in rng.integers(1 << 24, 1 << 31, n)]  # random bytes over the tokens
    prof = profile("llama")
    res = read_state(_with_tokens(tmp_path, ids), profile=prof)
    assert verdict(res, prof).state == "damaged"


def test_another_models_big_file_says_model_mismatch_in_the_cli(tmp_path: Path, capsys: object) -> None:
    """The issue's file: cells and token ids 0..N-1 of another model, read with the tiny llama."""
    path = tmp_path / "big.seqstate"
    write_seq_state(path, 4096, 2, 64)
    prof = profile("llama")
    res = read_state(path, profile=prof)
    v = verdict(res, prof)
    assert v.state == "model_mismatch" and v.level == "suspicious", v.line()
    assert "token 379" not in v.reason  # not the first of 3,717 token findings
    model = str(MODELS / "tiny-llama.gguf")
    rc = main(["inspect", str(path), "--model", model])
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    verdict_line = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert verdict_line.startswith("verdict: model mismatch: "), verdict_line
    assert "damaged" not in verdict_line
    assert rc != 0  # the findings are errors: the documented EXIT_FINDINGS
    own = next(line for line in out.splitlines() if line.startswith("  2026-10 "))  # the file's own layout
    assert "not with the model given" in own and "damaged" not in own, own
