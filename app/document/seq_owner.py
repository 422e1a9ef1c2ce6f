"""Whose state a per-sequence file's recurrent cell holds: the app's views (and the report) take it from
:mod:`kvscope.core.analysis.seq_owner`, where the Overview's sequence list takes it too."""

from __future__ import annotations

from kvscope.core.analysis.seq_owner import (
    PER_SEQUENCE_KINDS,
    UNNAMED_SEQ,
    SeqOwner,
    file_sequence,
    implied_owner,
    is_per_sequence,
)

__all__ = ["PER_SEQUENCE_KINDS", "UNNAMED_SEQ", "SeqOwner", "file_sequence", "implied_owner", "is_per_sequence"]
