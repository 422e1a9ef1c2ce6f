"""Every real fixture, read into the memory core and written back, is byte-identical.

With the model (layer mapping, sliding window and partial blobs from the GGUF) and without it
(structure only), for every manifest under tests/data/llamacpp-*/ and tests/data/gen-*/ (every memory class of
both pinned builds; M-RoPE and the slot-emulated file included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import entry_profile, manifest_entries, profile
from kvscope.core.memory.infer import infer_context, load, write
from kvscope.core.reader.parse import read_state

pytestmark = pytest.mark.slow  # the memory core round trip over every real fixture

ENTRIES = manifest_entries()


def _roundtrip(path: Path, prof: Any) -> tuple[bytes, bytes]:
    data = path.read_bytes()
    inf = infer_context(read_state(path, profile=prof), prof)
    res = load(inf, data)
    assert res.ok, f"{path.name}: {res}"
    return bytes(write(inf)), data


def test_every_manifest_file_is_covered() -> None:
    folders = {p.parent.name for p, _ in ENTRIES}
    assert {"llamacpp-2025-05-08", "llamacpp-2026-10-01", "gen-0c1e5709", "gen-b11434"} <= folders
    assert len(ENTRIES) >= 1800
    assert any(p.name.endswith("slot-emulated.seqstate") for p, _ in ENTRIES)
    assert any(e["model_key"] == "qwen2vl" for _, e in ENTRIES)


@pytest.mark.parametrize("with_model", [True, False], ids=["model", "structure"])
def test_roundtrip_all_fixtures(with_model: bool) -> None:
    bad = []
    for path, entry in ENTRIES:
        out, data = _roundtrip(path, entry_profile(path, entry) if with_model else None)
        if out != data:
            bad.append(f"{path.parent.name}/{path.name}: {len(out)} vs {len(data)} bytes")
    assert not bad, bad


def test_roundtrip_keeps_token_payload_and_outputs() -> None:
    slot = next(p for p, _ in ENTRIES if p.name.endswith("slot-emulated.seqstate"))
    prof = profile("llama")
    inf = infer_context(read_state(slot, profile=prof), prof)
    assert load(inf, slot.read_bytes()).tokens is not None
    assert inf.tokens is not None and inf.tokens[0] == -1  # the packed llama-server payload, verbatim
    old = next(p for p, e in ENTRIES if p.parent.name == "llamacpp-2025-05-08" and e["kind"] == "session")
    inf = infer_context(read_state(old, profile=prof), prof)
    load(inf, old.read_bytes())
    assert inf.ctx.outputs is not None and inf.ctx.outputs.n_outputs >= 1
