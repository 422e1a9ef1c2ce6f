"""Outcome of a restore: :class:`ReadResult`, and :class:`RestoreFailure`, the internal signal of
a failed check (never escapes ``state_read``).

Check names are stable strings (tests and the lab key on them): ``truncated``, ``magic``,
``version``, ``token_count``, ``io_magic``, ``arch``, ``output_id``,
``logits_size``, ``embd_size``, ``n_stream``, ``cell_count_bound``, ``alloc``, ``n_seq_id``,
``seq_id_range``, ``duplicate_tail``, ``find_slot``, ``n_layer``, ``cell_bound``, ``v_trans``,
``s_trans``, ``k_type``, ``k_row_size``, ``v_type``, ``v_row_size``, ``v_el_size``, ``v_n_embd``,
``r_type``, ``r_row_size``, ``s_type``, ``s_row_size``, ``n_rot_k``, ``n_rot_v``, ``p_row_size``
(the PLE rows), the checks of a cache that adopts another one's slot layout (``mirror_streams``,
``mirror_cells``, ``mirror_count``, ``mirror_busy``), DeepSeek-V4's (``dsv4_magic``, ``dsv4_version``,
``dsv4_mode``, ``dsv4_flags``, ``dsv4_kcache_version``, ``dsv4_kcache_size``, ``dsv4_stream_count``,
``dsv4_seq_stream``, ``dsv4_layer_count``, ``dsv4_layer_id``, ``dsv4_tensor_meta``, ``dsv4_tensor_rows``,
``dsv4_comp_version``, ``dsv4_comp_meta``), and ``trailing`` (a session file not read to its end:
llama.cpp returns false *after* restoring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.core.errors import InputError

CHECKS: frozenset[str] = frozenset({
    "truncated", "magic", "version", "token_count", "io_magic", "arch", "output_id",
    "logits_size", "embd_size", "n_stream", "cell_count_bound", "alloc", "n_seq_id", "seq_id_range",
    "duplicate_tail", "find_slot", "n_layer", "cell_bound", "v_trans", "s_trans", "k_type",
    "k_row_size", "v_type", "v_row_size", "v_el_size", "v_n_embd", "r_type", "r_row_size", "s_type",
    "s_row_size", "trailing", "n_rot_k", "n_rot_v", "p_row_size",
    "mirror_streams", "mirror_cells", "mirror_count", "mirror_busy",
    "dsv4_magic", "dsv4_version", "dsv4_mode", "dsv4_flags", "dsv4_kcache_version", "dsv4_kcache_size",
    "dsv4_stream_count", "dsv4_seq_stream", "dsv4_layer_count", "dsv4_layer_id", "dsv4_tensor_meta",
    "dsv4_tensor_rows", "dsv4_comp_version", "dsv4_comp_meta",
})


class RestoreFailure(InputError):
    """A check failed at ``offset`` (absolute, in the bytes given to the restore).

    ``offset`` is that of the field for scalar checks, of the cell record for cell checks
    (``n_seq_id``, ``seq_id_range``, ``duplicate_tail``), of the record header for tensor record
    checks (type, row size, element size, width), of the cell table for ``find_slot``, and of the
    read that ran out for ``truncated``.

    ``thrown`` tells how llama.cpp signals it: True for an exception (a short read, ``bad_alloc``),
    which skips the cleanup of ``state_read_meta``; False for a check that returns ``false``.
    """

    def __init__(self, check: str, offset: int, message: str, *, thrown: bool = False,
                 section: str | None = None, stream: int | None = None, layer: int | None = None,
                 alloc_bytes: int | None = None) -> None:
        assert check in CHECKS, check
        super().__init__(message)
        self.check = check
        self.offset = offset
        self.message = message
        self.thrown = thrown
        self.section = section
        self.stream = stream
        self.layer = layer
        self.alloc_bytes = alloc_bytes


@dataclass
class ReadResult:
    """What a restore did. ``returned`` is llama.cpp's API return value for the same call."""

    ok: bool
    returned: int | bool
    n_read: int  # bytes consumed (up to the failure)
    check: str | None = None
    offset: int | None = None
    message: str = ""
    section: str | None = None
    stream: int | None = None
    layer: int | None = None
    alloc_bytes: int | None = None  # legacy policy: the allocation llama.cpp would have attempted
    policy: str = "contained"
    reader: str = "buffer"
    actions: list[str] = field(default_factory=list)  # cleanup steps taken, in order
    tokens: list[int] | None = None  # the token words of a session / sequence file

    @classmethod
    def failure(cls, f: RestoreFailure, n_read: int, returned: int | bool, policy: str, reader: str,
                actions: list[str]) -> ReadResult:
        """The result of a restore that failed with ``f``."""
        return cls(False, returned, n_read, f.check, f.offset, f.message, f.section, f.stream, f.layer,
                   f.alloc_bytes, policy, reader, actions)

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict."""
        return {k: v for k, v in self.__dict__.items()}

    def __str__(self) -> str:
        if self.ok and self.check is None:
            return f"ok ({self.n_read} bytes)"
        where = f" at offset {self.offset}" if self.offset is not None else ""
        return f"{self.check}{where}: {self.message}"
