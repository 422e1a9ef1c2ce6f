"""Whose state a per-sequence file's recurrent cell holds (no Qt: the Overview, the app's views and the report).

llama.cpp writes a recurrent memory's cells with their sequence ids only when it saves the whole
context (``llama_memory_recurrent::state_write_meta``: ``n_seq_id = seq_id == -1 ? ... : 0``). A
per-sequence file (a sequence state file or blob, a llama-server slot) therefore holds one cell with
``n_seq_id`` 0: not an empty cell, but the state of the file's sequence at its last position. This
module names that sequence: the blob header's ``seq_id`` when there is one, else the one sequence the
file's KV cells hold, else "the sequence of this file".
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.core.reader.records import CellTable, ParseResult, Section

PER_SEQUENCE_KINDS = ("seq_file", "seq_blob")
UNNAMED_SEQ = -1  # the column id of the file's sequence when no byte names it


@dataclass(frozen=True)
class SeqOwner:
    """The sequence a per-sequence file's id-less cells belong to: ``seq`` (None: not named in the file)."""

    seq: int | None
    why: str  # where the id comes from

    @property
    def column(self) -> int:
        """The id the cell map files the cells under (:data:`UNNAMED_SEQ` when unnamed)."""
        return self.seq if self.seq is not None else UNNAMED_SEQ

    @property
    def label(self) -> str:
        return f"seq {self.seq}" if self.seq is not None else "this file's seq"


def is_per_sequence(res: ParseResult | None) -> bool:
    return res is not None and res.kind in PER_SEQUENCE_KINDS


def file_sequence(res: ParseResult | None) -> SeqOwner | None:
    """The sequence a per-sequence file holds (None for a whole-context file)."""
    if not is_per_sequence(res):
        return None
    assert res is not None
    seq = res.header.get("seq_id")
    if isinstance(seq, int) and seq >= 0:
        return SeqOwner(seq, "the blob header's seq_id")
    kv = {int(s) for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.cells is not None
          for s in st.cells.seq_set()}
    if len(kv) == 1:
        (only,) = kv
        return SeqOwner(only, "the sequence of the file's KV cells")
    return SeqOwner(None, "the sequence this file was saved from (its bytes do not name it)")


def implied_owner(res: ParseResult | None, section: Section | None, table: CellTable | None) -> SeqOwner | None:
    """The owner of ``table``'s id-less cells: set for a recurrent table of a per-sequence file, else None
    (an id-less cell of a whole-context file, or of a KV cache, is an empty cell)."""
    if section is None or table is None or section.kind != "recurrent" or not is_per_sequence(res):
        return None
    if table.count == 0 or bool((table.n_seq > 0).any()):
        return None
    return file_sequence(res)
