"""Shared state of one parse attempt: the bytes, the layout being tried, findings and nodes.

Parsers record what they find here and stop by raising :class:`Stop` after recording the
reason; callers turn the rest of the range into an ``unparsed`` leaf. A :meth:`ParseCtx.fork`
lets a parser try an interpretation without committing its findings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvscope.core.findings import Finding, Severity
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.layouts import Generation
from kvscope.core.reader.source import ByteSource
from kvscope.core.reader.tree import Node, Status


class Stop(Exception):
    """Parsing cannot continue at ``offset`` (the reason is already a finding)."""

    def __init__(self, offset: int, section: Any = None) -> None:
        super().__init__(offset)
        self.offset = offset
        self.section = section  # the partly parsed memory section, when a section gave up


class HeaderStop(Stop):
    """A record header was rejected; the layer node holding it ends at ``offset``."""


def mark_bad(node: Node) -> None:
    """Turn a field leaf that failed validation into an ``unparsed`` leaf."""
    node.status = "unparsed"
    node.kind = "unparsed"


@dataclass
class ParseCtx:
    src: ByteSource
    gen: Generation
    ext_bytes: int
    per_seq: bool
    profile: ModelProfile | None
    findings: list[Finding] = field(default_factory=list)
    untrusted: bool = False  # set after a resync: what follows is marked untrusted
    seq_hint: int | None = None  # the sequence a per-seq state belongs to, when known
    k_only_seen: bool = False  # a K-only (MLA-shaped) cache was read in this state
    seq_blob: bool = False  # a buffer-API blob: it may be PARTIAL_ONLY
    # parses a section of a kind ("kv", "recurrent") with no plan at an offset, for probes of what
    # follows; given by the memory walker (reader.memory_state), which knows every section parser
    bare_section: Callable[[str, ParseCtx, Node, int, int], object] | None = None

    def resolve_paths(self) -> None:
        """Fill each finding's ``path`` from its node (nodes may move between trees while parsing)."""
        for f in self.findings:
            if f.node is not None:
                f.path = f.node.path

    @contextmanager
    def cell_ext(self, ext_bytes: int) -> Iterator[None]:
        """Parse with another cell-extension size (recurrent cells never carry one)."""
        saved, self.ext_bytes = self.ext_bytes, ext_bytes
        try:
            yield
        finally:
            self.ext_bytes = saved

    def fork(self) -> ParseCtx:
        return ParseCtx(self.src, self.gen, self.ext_bytes, self.per_seq, self.profile, [], self.untrusted,
                        self.seq_hint, self.k_only_seen, self.seq_blob, self.bare_section)

    def parse_bare(self, kind: str, parent: Node, off: int, limit: int) -> None:
        """Parse a ``kind`` section without a plan at ``off`` (raises :class:`Stop` where it cannot)."""
        if self.bare_section is None:
            raise RuntimeError("no section parser given to this parse")
        self.bare_section(kind, self, parent, off, limit)

    @property
    def n_errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    def find(
        self,
        severity: Severity,
        code: str,
        offset: int,
        length: int,
        message: str,
        node: Node | None = None,
        layer: int | None = None,
        **extra: Any,
    ) -> Finding:
        f = Finding(severity, code, offset, max(0, length), message, "", layer, dict(extra), node)
        self.findings.append(f)
        return f

    # -- leaves --------------------------------------------------------------------------
    def status(self) -> Status:
        return "untrusted" if self.untrusted else "parsed"

    def leaf(self, parent: Node, name: str, kind: str, off: int, size: int, value: Any = None, note: str = "") -> Node:
        return parent.add(Node(name, kind, off, size, value, self.status(), note=note))

    def unparsed(self, parent: Node, off: int, end: int, note: str = "") -> Node | None:
        if end <= off:
            return None
        return parent.add(Node("unparsed", "unparsed", off, end - off, None, "unparsed", note=note))

    def truncated(self, parent: Node, what: str, off: int, need: int, layer: int | None = None) -> Stop:
        have = self.src.remaining(off)
        node = self.unparsed(parent, off, off + have, note=f"truncated {what}")
        self.find("error", "truncated", off, have,
                  f"file ends inside {what}: {need} bytes needed at offset {off}, {have} present",
                  node or parent, layer, needed=need, file_end=self.src.size)
        return Stop(off + have)

    def u32(self, parent: Node, name: str, off: int, kind: str = "field") -> int:
        v = self.src.u32(off)
        if v is None:
            raise self.truncated(parent, name, off, 4)
        self.leaf(parent, name, kind, off, 4, v)
        return v

    def i32(self, parent: Node, name: str, off: int, kind: str = "field") -> int:
        v = self.src.i32(off)
        if v is None:
            raise self.truncated(parent, name, off, 4)
        self.leaf(parent, name, kind, off, 4, v)
        return v

    def u64(self, parent: Node, name: str, off: int, kind: str = "field") -> int:
        v = self.src.u64(off)
        if v is None:
            raise self.truncated(parent, name, off, 8)
        self.leaf(parent, name, kind, off, 8, v)
        return v
