"""Paths of the real fixtures the GUI tests open."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent.parent / "data"
STATE = DATA / "llamacpp-2026-10-01"
LAB = DATA / "lab" / "llamacpp-2026-10-01" / "llama"


def model(key: str) -> str:
    """The tiny GGUF model of a fixture family (llama, gemma2, lfm2, mamba, qwen2vl)."""
    return str(STATE / f"tiny-{key}.gguf")
