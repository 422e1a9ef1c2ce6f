"""One escaping rule for text that comes from a file and ends up on a terminal or in Markdown.

State files and GGUF models are untrusted: an architecture name, a metadata key, a token's text
or a path inside them may hold a newline, an ANSI escape (``ESC [``) or a bidi control (U+202E
reverses what follows on screen). :func:`safe_text` escapes every character that is not
printable (``str.isprintable``: control, format, surrogate, private-use, unassigned and separator
characters other than the ASCII space) as ``\\n``, ``\\t``, ``\\r``, ``\\xNN``, ``\\uNNNN`` or
``\\UNNNNNNNN``, so such a string prints as one visible line that reads as it is stored.
JSON output needs no such step: ``json.dumps`` writes those characters as ``\\uNNNN`` escapes.
"""

from __future__ import annotations

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def safe_text(text: object, limit: int | None = None) -> str:
    """``str(text)`` with every non-printable character escaped (see the module docstring).

    ``limit`` cuts the result to that many characters, with ``...`` and the full length, for
    strings whose size the file decides.
    """
    s = text if isinstance(text, str) else str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else _escape(c) for c in s)
    if limit is not None and len(s) > limit:
        s = f"{s[: max(0, limit)]}... ({len(s)} characters)"
    return s
