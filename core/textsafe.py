"""One escaping rule per medium for text that comes from a file (or a file name, a spec, a prompt) and ends up
on a terminal, in Markdown or in HTML. Every writer uses these; none has a copy of its own.

State files and GGUF models are untrusted: an architecture name, a metadata key, a token's text
or a path inside them may hold a newline, an ANSI escape (``ESC [``) or a bidi control (U+202E
reverses what follows on screen). The three media:

* **a terminal line** (stdout text, every ``kvscope: ...`` line on stderr, the app's plain text):
  :func:`safe_text` escapes every character that is not printable (``str.isprintable``: control, format,
  surrogate, private-use, unassigned and separator characters other than the ASCII space) as ``\\n``,
  ``\\t``, ``\\r``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``, so such a string prints as one visible line
  that reads as it is stored;
* **Markdown** (``inspect --markdown``, ``kvscope lab``'s table, ``report.md``): :func:`markdown_text` for a
  value (:func:`safe_text`, then a backslash before every character Markdown or inline HTML gives a meaning
  to: no image, link, autolink, raw HTML, entity, emphasis or table cell break gets through), with
  :func:`markdown_code` for a value shown as code (a code span when that is safe, else the escaped text) and
  :func:`markdown_fence` for a block of text in a code fence;
* **HTML**: :func:`html_text` (:func:`safe_text`, then ``& < > " '`` as entities) and :func:`html_block`
  (the same, line by line, for ``<pre>``).

JSON output needs no such step: ``json.dumps`` writes those characters as ``\\uNNNN`` escapes.
:func:`file_kind` is the words every message uses for what a path is (a folder, a FIFO, a device...);
:func:`plural` the number form every count in a message takes (``1 record``, ``2 records``: never ``record(s)``).
:func:`markdown_line` is for a line that is Markdown already and carries file-derived text the writer could
not escape as a value: it stops raw HTML, entities and autolinks only (links stay live), so a writer that
builds Markdown escapes its values with :func:`markdown_text` instead.
"""

from __future__ import annotations

import html
import re
import stat

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


# what Markdown (CommonMark, GFM tables and strikethrough) or inline HTML reads inside a line, ``#`` for a value
# that starts a heading; ``_`` between two letters or digits opens and closes no emphasis (CommonMark's
# flanking rule), and a ``]`` escaped wherever a ``(``, ``[`` or ``:`` follows it ends no link, image or
# reference definition: those stay as they are, so identifiers (``kv_swa``) and ranges (``[0,6]``) read plainly
_MARKDOWN_SPECIAL = frozenset("\\`*_<>&|~#")
_MARKDOWN_INLINE = re.compile(r"[\\`*<>&|~#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|\](?=[(\[:])")
_MARKDOWN_HTML = frozenset("\\<>&")
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])://|\bwww\.")  # the character to escape is the match's last
_BLOCK_START = re.compile(r"[-+=]|(\d{1,9})([.)])")  # a list item, a setext underline, an ordered list item


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
    punctuation be escaped), so ``<img src=x onerror=...>``, ``**``, ``|``, ``[x](y)`` or ``![x](y)`` show as
    written (``]`` is escaped where it could close a link's text, ``_`` where it could open or close
    emphasis); a bare ``http://`` or ``www.`` (GFM's extended autolinks) and a list, quote or heading marker
    at the start are escaped too."""
    s = safe_text(text)
    if any(c in _MARKDOWN_SPECIAL for c in s) or "]" in s:
        s = _MARKDOWN_INLINE.sub(lambda m: "\\" + m.group(0), s)
    if "://" in s or "www." in s.lower():
        s = _AUTOLINK.sub(lambda m: m.group(0)[:-1] + "\\" + m.group(0)[-1], s)
    lead = len(s) - len(s.lstrip(" "))
    if m := _BLOCK_START.match(s, lead):
        i = m.end() - 1  # the marker's punctuation
        s = s[:i] + "\\" + s[i:]
    return s


def markdown_code(text: object) -> str:
    """``text`` shown as code: a code span (backticks around it) when its escaped form holds no backtick and no ``|``
    (which would end the span or a table cell), else :func:`markdown_text` (the same characters, not as code)."""
    s = safe_text(text)
    if not s.strip() or "`" in s or "|" in s:
        return markdown_text(s)
    return f"`{s}`"


def markdown_fence(text: object, info: str = "text") -> list[str]:
    """``text`` as a fenced code block, line by line (each :func:`safe_text`: one visible line), in a fence of
    more backticks than any run of them inside, so no line of the text can close it."""
    lines = [safe_text(line) for line in str(text).rstrip("\n").split("\n")]
    run = max((len(r) for line in lines for r in re.findall("`+", line)), default=0)
    fence = "`" * max(3, run + 1)
    return [fence + safe_text(info).replace("`", ""), *lines, fence]


def markdown_line(line: object) -> str:
    """A line of Markdown that may carry file-derived text: :func:`safe_text`, and ``\\ < > &`` backslash-escaped
    (no raw HTML, entity or autolink gets through; the line's own tables, headings and emphasis stay)."""
    s = safe_text(line)
    if not any(c in _MARKDOWN_HTML for c in s):
        return s
    return "".join("\\" + c if c in _MARKDOWN_HTML else c for c in s)


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What ``st_mode`` says a path is, in words for a message: ``a regular file``, ``a folder``, ``a FIFO
    (named pipe)``, ``a character device``... (the one table the error and output-path messages share)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _FILE_KINDS if test(mode)), "a special file")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 cell``, ``2 cells``, ``0 findings``, ``1,024 bytes`` (``many`` for irregular plurals)."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"
