"""One escaping rule for text that comes from a file and ends up on a terminal or in Markdown.

State files and GGUF models are untrusted: an architecture name, a metadata key, a token's text
or a path inside them may hold a newline, an ANSI escape (``ESC [``) or a bidi control (U+202E
reverses what follows on screen). :func:`safe_text` escapes every character that is not
printable (``str.isprintable``: control, format, surrogate, private-use, unassigned and separator
characters other than the ASCII space) as ``\\n``, ``\\t``, ``\\r``, ``\\xNN``, ``\\uNNNN`` or
``\\UNNNNNNNN``, so such a string prints as one visible line that reads as it is stored.
JSON output needs no such step: ``json.dumps`` writes those characters as ``\\uNNNN`` escapes.

For the other media the same escaping comes first, then that medium's own: :func:`html_text`
(``& < > " '`` as entities), :func:`html_block` (the same, line by line, for ``<pre>``),
:func:`markdown_text` (a value inside Markdown: every character Markdown or inline HTML gives a
meaning to, backslash-escaped) and :func:`markdown_line` (a line that is Markdown already, such as
a rendered table, whose file-derived parts may hold ``<``: raw HTML and autolinks are escaped).
"""

from __future__ import annotations

import html

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


# what Markdown (CommonMark, GFM tables and strikethrough) or inline HTML reads inside a line; brackets so
# that no link forms, ``#`` for a value that starts a list item or heading
_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>&!|~#")
_MARKDOWN_HTML = frozenset("\\<>&")


def html_text(text: object) -> str:
    """``text`` for HTML: :func:`safe_text` (one visible line, bidi controls shown as escapes), then entities."""
    return html.escape(safe_text(text), quote=True)


def html_block(text: object) -> str:
    """A multi-line text for ``<pre>``: each line as :func:`html_text`, the newlines kept."""
    s = text if isinstance(text, str) else str(text)
    return "\n".join(html_text(line) for line in s.split("\n"))


def markdown_text(text: object) -> str:
    """``text`` as a literal Markdown value (a heading, a table cell, a list item): :func:`safe_text`, then a
    backslash before each character Markdown or inline HTML could read there (CommonMark lets any ASCII
    punctuation be escaped), so ``<img src=x onerror=...>``, ``**``, ``|`` or ``[x](y)`` show as written."""
    s = safe_text(text)
    if not any(c in _MARKDOWN_SPECIAL for c in s):
        return s
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in s)


def markdown_line(line: object) -> str:
    """A line of Markdown that may carry file-derived text: :func:`safe_text`, and ``\\ < > &`` backslash-escaped
    (no raw HTML, entity or autolink gets through; the line's own tables, headings and emphasis stay)."""
    s = safe_text(line)
    if not any(c in _MARKDOWN_HTML for c in s):
        return s
    return "".join("\\" + c if c in _MARKDOWN_HTML else c for c in s)
