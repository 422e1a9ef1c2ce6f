"""The report's Bookmarks section: the byte ranges the user bookmarked in the app, with their notes.

Only a report the app exports has them (``ReportOptions.bookmarks``, from the document); the JSON
lists each with the node its first byte is in, Markdown and HTML as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.core.report.model import ReportData
from kvscope.core.textsafe import html_text as escape


def bookmark_rows(data: ReportData) -> list[dict[str, Any]]:
    """Each bookmark as JSON, with ``node``: the path of the leaf holding its first byte (None outside)."""
    root = data.result.root
    out = []
    for b in data.options.bookmarks:
        leaf = root.deepest_at(b.start)  # the leaves tile the file: the leaf holding the byte, or root (none)
        leaf = leaf if leaf is not None and leaf is not root and not leaf.children else None
        out.append({**b.to_json(), "node": leaf.path if leaf is not None else None})
    return out


def bookmarks_markdown(data: ReportData, md: Callable[[str], str]) -> list[str]:
    """``## Bookmarks`` and its table; nothing when there are none."""
    rows = bookmark_rows(data)
    if not rows:
        return []
    lines = ["## Bookmarks", "", "| name | offset | bytes | node | note |", "|---|--:|--:|---|---|"]
    for r in rows:
        lines.append(f"| {md(r['name'])} | {r['start']:,} (0x{r['start']:x}) | {r['length']:,} | "
                     f"{md(r['node'] or '')} | {md(r['note'].replace(chr(10), ' '))} |")
    return [*lines, ""]


def bookmarks_html(data: ReportData) -> list[str]:
    """The ``Bookmarks`` heading and table; nothing when there are none."""
    rows = bookmark_rows(data)
    if not rows:
        return []
    right = '<td style="text-align:right">'
    body = "".join(f"<tr><td>{escape(r['name'])}</td>{right}{r['start']:,} (0x{r['start']:x})</td>"
                   f"{right}{r['length']:,}</td><td><code>{escape(r['node'] or '')}</code></td>"
                   f"<td>{escape(r['note'])}</td></tr>" for r in rows)
    return ['<h2 id="bookmarks">Bookmarks</h2>',
            f"<table><tr><th>name</th><th>offset</th><th>bytes</th><th>node</th><th>note</th></tr>{body}</table>"]
