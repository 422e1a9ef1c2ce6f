"""Which sequence a per-sequence file holds: the one rule the Overview, the app's views, the report, verify,
repair and the memory core's inference all take (no Qt).

llama.cpp writes a recurrent memory's cells with their sequence ids only when it saves the whole
context (``llama_memory_recurrent::state_write_meta``: ``n_seq_id = seq_id == -1 ? ... : 0``), and no
KV cell carried its sequence ids before the 2025-08 layouts. A per-sequence file (a sequence state file
or blob, a llama-server slot) may therefore hold cells with no sequence id: not empty cells, but the
state of the file's sequence. :func:`file_sequence` names that sequence, in this order: the blob
header's ``seq_id``; the sequence its cells name (the lowest, should they name several); the stream that
holds cells in a multi-stream cache (one stream per sequence, every stream written); else no byte names
it, and a restore puts it in sequence :data:`ASSUMED_SEQ` (0): :attr:`SeqOwner.dest` is where verify,
repair and the memory core restore it, and the Overview says it was assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.core.reader.records import CellTable, ParseResult, Section
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS

UNNAMED_SEQ = -1  # the column id of the file's sequence when no byte names it
ASSUMED_SEQ = 0  # where a restore puts a per-sequence file whose bytes name no sequence


@dataclass(frozen=True)
class SeqOwner:
    """The sequence a per-sequence file's id-less cells belong to: ``seq`` (None: not named in the file)."""

    seq: int | None
    why: str  # where the id comes from

    @property
    def dest(self) -> int:
        """The sequence a restore puts the file in: :attr:`seq`, else :data:`ASSUMED_SEQ`."""
        return self.seq if self.seq is not None else ASSUMED_SEQ

    @property
    def column(self) -> int:
        """The id the cell map files the cells under (:data:`UNNAMED_SEQ` when unnamed)."""
        return self.seq if self.seq is not None else UNNAMED_SEQ

    @property
    def label(self) -> str:
        return f"seq {self.seq}" if self.seq is not None else f"seq {ASSUMED_SEQ} (assumed)"


def is_per_sequence(res: ParseResult | None) -> bool:
    return res is not None and res.kind in PER_SEQUENCE_KINDS


def file_sequence(res: ParseResult | None) -> SeqOwner | None:
    """The sequence a per-sequence file holds (None for a whole-context file); see the module's rule."""
    if not is_per_sequence(res):
        return None
    assert res is not None
    seq = res.header.get("seq_id")
    if res.kind == "seq_blob" and isinstance(seq, int) and seq >= 0:
        return SeqOwner(seq, "the blob header's seq_id")
    ids = res.sequence_ids()
    if len(ids) == 1:
        return SeqOwner(min(ids), "the sequence the file's cells name")
    if ids:
        return SeqOwner(min(ids), f"the lowest of the {len(ids)} sequences the file's cells name")
    for sec in res.sections:
        if sec.kind == "kv" and (sec.n_stream or 1) > 1:
            for st in sec.streams:
                if st.cell_count:
                    return SeqOwner(st.index, "the stream that holds the cells (one stream per sequence)")
    return SeqOwner(None, f"its bytes do not name the sequence it was saved from: restored as seq {ASSUMED_SEQ}")


def restore_seq(res: ParseResult) -> int:
    """The ``seq_id`` a restore of ``res`` passes llama.cpp: the file's sequence (:attr:`SeqOwner.dest`) for a
    per-sequence file, -1 (the whole context) for the others."""
    owner = file_sequence(res)
    return owner.dest if owner is not None else -1


def implied_owner(res: ParseResult | None, section: Section | None, table: CellTable | None) -> SeqOwner | None:
    """The owner of ``table``'s id-less cells: set for a recurrent table of a per-sequence file, else None
    (an id-less cell of a whole-context file, or of a KV cache, is an empty cell)."""
    if section is None or table is None or section.kind != "recurrent" or not is_per_sequence(res):
        return None
    if table.count == 0 or bool((table.n_seq > 0).any()):
        return None
    return file_sequence(res)
