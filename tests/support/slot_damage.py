"""Damaged copies of a real llama-server slot file (tests/data/gen-b11434, the generated llama model) whose
consumers answer apart: a token outside the vocabulary (libllama loads, llama-server refuses) and a cut
inside the last V record (both abort on GGML_ASSERT(nread <= state_size))."""

from __future__ import annotations

import struct
from pathlib import Path

from kvharness.fixtures import DATA
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state

SLOT = DATA / "gen-b11434" / "llama-f16-fa0-unified0-slot.seqstate"
LLAMA = DATA / "gen-models" / "llama.gguf"


def oov_slot(dst: Path) -> Path:
    """The slot with its second token moved past the end of the vocabulary (libllama copies token ids
    without looking; llama-server's validate() refuses them)."""
    prof = load_model_profile(LLAMA)
    base = SLOT.read_bytes()
    tokens = read_state(data=base, profile=prof).tokens
    at = base.index(struct.pack(f"<{len(tokens)}i", *tokens))
    dst.write_bytes(base[:at + 4] + struct.pack("<i", prof.n_vocab + 5) + base[at + 8:])
    return dst


def cut_slot(dst: Path) -> Path:
    """The slot without its last 3 bytes: cut inside the last V record, which the load reads past its end."""
    dst.write_bytes(SLOT.read_bytes()[:-3])
    return dst
