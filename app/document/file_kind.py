"""What a file is by its first bytes, for the file dialogs (no Qt): a state file's kind, or None.

llama-server names slot files as the user asks (``/slots/save {"filename": "chat1"}``), so a slot file
often has no extension. The reader's :func:`~kvscope.core.reader.parse.detect_kind` names the kind by
magic; its last resort (a header-less blob: any bytes at all) is no recognition here, so only files
whose first bytes say "llama.cpp state" are taken for one. Only the head of the file is read (read-only;
a FIFO or device is never opened).
"""

from __future__ import annotations

import os
import struct

from kvscope.core.fileio import FileIdentity, open_regular
from kvscope.core.reader.containers import MAX_ARCH_LEN
from kvscope.core.reader.layouts import BLOB_IO_MAGIC
from kvscope.core.reader.parse import detect_kind
from kvscope.core.reader.source import ByteSource

HEAD_BYTES = 4 + MAX_ARCH_LEN  # the magic, or a blob's architecture string after its length
KIND_TITLES = {
    "session_file": "llama.cpp session file",
    "seq_file": "llama.cpp sequence state (slot save)",
    "seq_blob": "llama.cpp state blob",
    "context_blob": "llama.cpp context state blob",
}


def head_kind(head: bytes) -> str | None:
    """The state kind ``head`` (a file's first bytes) starts like; None for anything else."""
    if len(head) < 4:
        return None
    kind = detect_kind(ByteSource(head, "<head>"))
    if kind == "seq_blob" and struct.unpack_from("<I", head)[0] != BLOB_IO_MAGIC:
        return None  # detect_kind's last resort: a header-less blob is not recognisable
    return None if kind == "gguf" else kind


def sniff_kind(path: str | os.PathLike[str]) -> str | None:
    """The state kind of the regular file ``path`` by its first bytes; None when not state or not readable."""
    try:
        fd, _ = open_regular(path)
    except (OSError, ValueError):
        return None
    try:
        return head_kind(os.pread(fd, HEAD_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


class KindCache:
    """:func:`sniff_kind` remembered per path while the file's identity (size, mtime, inode) stays."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._seen: dict[str, tuple[FileIdentity, str | None]] = {}

    def kind(self, path: str) -> str | None:
        ident = FileIdentity.of_path(path)
        if ident is None:
            return None
        hit = self._seen.get(path)
        if hit is not None and hit[0] == ident:
            return hit[1]
        kind = sniff_kind(path)
        if len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen[path] = (ident, kind)
        return kind
