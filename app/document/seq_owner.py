"""Whose state a per-sequence file's recurrent cell holds: the app's views (and the report) take it from
:mod:`kvscope.core.reader.seq_owner`, the one rule the Overview, verify and repair take too."""

from __future__ import annotations

from kvscope.core.reader.seq_owner import (
    UNNAMED_SEQ,
    SeqOwner,
    file_sequence,
    implied_owner,
    is_per_sequence,
)
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS

__all__ = ["PER_SEQUENCE_KINDS", "UNNAMED_SEQ", "SeqOwner", "file_sequence", "implied_owner", "is_per_sequence"]
