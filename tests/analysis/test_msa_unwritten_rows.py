"""MiniMax-M3's MSA indexer cache (``kv_idx``) holds rows llama.cpp never writes: its V always, and its K when the
context ran dense attention (flash attention off, or a unified cache over several sequences). Every real b11434
file of the model was called ``suspicious`` for those zero rows; they are notes that say why, while a K record
that llama.cpp does write and that a damaged copy zeroes is still a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.model.profile import load_model_profile

MODEL = DATA / "gen-models/minimax-m3.gguf"
FILES = sorted(p for p in (DATA / "gen-b11434").glob("minimax-m3-*") if not p.name.endswith("partial.seqdata.bin"))


def _zero_rows(path: Path) -> tuple[str, list[tuple[str, str]]]:
    found = inspect_file(path, load_model_profile(MODEL), stats=True)
    return found.verdict.level, [(f.severity, f.message) for f in found.result.findings if f.code == "zero_rows"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_real_msa_file_is_healthy_and_says_why_rows_are_zero(path: Path) -> None:
    level, zero = _zero_rows(path)
    assert level == "healthy", zero
    assert all(sev == "info" and "never writes" in msg for sev, msg in zero), zero
    if "-fa0-" in path.name:  # dense attention: the indexer's K is not written either
        assert any("K layer" in msg and "flash attention" in msg for _, msg in zero), zero


def test_zeroed_indexer_k_that_llama_cpp_writes_is_still_a_warning(tmp_path: Path) -> None:
    """With flash attention and one stream per sequence MSA runs sparse and writes the indexer's K."""
    src = DATA / "gen-b11434/minimax-m3-q8_0-fa1-unified0-seq0.seqstate"
    level, zero = _zero_rows(src)
    assert level == "healthy" and [sev for sev, _ in zero] == ["info"]  # the indexer's V only
    out = tmp_path / "zeroed.seqstate"
    corrupt_file(src, out, ["fill:value=zeros,section=kv_idx,stream=0,role=k,index=0"], model=str(MODEL))
    level, zero = _zero_rows(out)
    assert level == "suspicious" and tuple(sev for sev, m in zero if "K layer" in m) == ("warning", ), zero
