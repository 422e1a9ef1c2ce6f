"""Paths of the fixtures the report tests use (a module of its own: every test folder has a conftest)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent.parent / "data"
STATE = DATA / "llamacpp-2026-10-01"
LAB = DATA / "lab" / "llamacpp-2026-10-01" / "llama"
EXAMPLES = Path(__file__).parent.parent.parent / "resources" / "examples"
MODEL = STATE / "tiny-llama.gguf"
NAN_FILE = LAB / "fa0-unified1" / "nan_rows_late_fail.seqdata.bin"  # 8 error findings, a V record unparsed
