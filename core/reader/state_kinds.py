"""The four kinds of state llama.cpp writes, and the groups the rest of kvscope asks about (one home).

``ParseResult.kind`` is one of :class:`StateKind`'s values (a ``str``: ``res.kind == StateKind.SEQ_FILE`` and
``res.kind in PER_SEQUENCE_KINDS`` both hold for ``"seq_file"``), or ``"unknown"`` for bytes that are no state.
"""

from __future__ import annotations

from enum import StrEnum


class StateKind(StrEnum):
    """What wrote the bytes: a file (with a magic and tokens) or a blob (``llama_state_*_get_data``)."""

    SEQ_FILE = "seq_file"  # llama_state_seq_save_file, and a llama-server slot save
    SESSION_FILE = "session_file"  # llama_state_save_file: the whole context
    SEQ_BLOB = "seq_blob"  # llama_state_seq_get_data: one sequence, no header, no tokens
    CONTEXT_BLOB = "context_blob"  # llama_state_get_data: the whole context, no header, no tokens


ALL_KINDS: tuple[StateKind, ...] = tuple(StateKind)
PER_SEQUENCE_KINDS: tuple[StateKind, ...] = (StateKind.SEQ_FILE, StateKind.SEQ_BLOB)  # one sequence's state
WHOLE_CONTEXT_KINDS: tuple[StateKind, ...] = (StateKind.SESSION_FILE, StateKind.CONTEXT_BLOB)
BLOB_KINDS: tuple[StateKind, ...] = (StateKind.SEQ_BLOB, StateKind.CONTEXT_BLOB)  # no tokens of their own
FILE_KINDS: tuple[StateKind, ...] = (StateKind.SEQ_FILE, StateKind.SESSION_FILE)  # a magic, a version, tokens
