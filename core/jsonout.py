"""JSON output that streams its big arrays: the text of ``json.dump``, written piece by piece.

A result's big arrays (16 million cells, 33 million tokens) are :class:`JsonArray` objects: they
hold a way to produce their items in pieces instead of the items. :func:`write_json` writes an
object holding them to a text stream and gives byte for byte what ``json.dump`` would give for
the same object with the arrays filled in (``indent`` None or a number), while at most one
piece of each array is in memory; each piece is encoded by ``json.dumps`` (C speed) and written
with one call. :func:`materialize` turns such an object into plain lists (for ``json.dumps``
callers and tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TextIO

PIECE = 1 << 16  # items per piece of the arrays built here


class JsonArray:
    """A JSON array produced in pieces: ``pieces()`` yields lists of JSON-able items, in order.

    ``encoded(indent)``, when given, yields the same pieces already encoded: each string is what
    ``json.dumps(piece, indent=indent)`` gives without its brackets and closing newline (items
    at relative depth 1, joined by ``", "`` or ``","``). Big arrays use it to skip building lists.
    Items hold no :class:`JsonArray`.
    """

    def __init__(self, pieces: Callable[[], Iterator[list[Any]]],
                 encoded: Callable[[int | None], Iterator[str]] | None = None) -> None:
        self.pieces = pieces
        self.encoded = encoded

    @classmethod
    def of_list(cls, items: list[Any], piece: int = PIECE) -> JsonArray:
        """A list already in memory, written in slices (no giant string is built)."""
        return cls(lambda: (items[i : i + piece] for i in range(0, len(items), piece)))

    @classmethod
    def of_ints(cls, items: list[int], piece: int = PIECE) -> JsonArray:
        """A list of ints in memory, encoded slice by slice with one ``%`` format (faster than
        ``json.dumps`` on ints)."""
        def text(indent: int | None) -> Iterator[str]:
            slot = item_template(HOLE, indent)
            sep = item_separator(indent)
            for i in range(0, len(items), piece):
                part = items[i : i + piece]
                yield sep.join([slot] * len(part)) % tuple(part)

        return cls(lambda: (items[i : i + piece] for i in range(0, len(items), piece)), text)

    def materialize(self) -> list[Any]:
        return [x for p in self.pieces() for x in p]


HOLE = -987654321  # an int in an item_template example that becomes a %d slot


def item_template(example: Any, indent: int | None) -> str:
    """``example`` as one encoded array item (see :attr:`JsonArray.encoded`), every int equal to
    :data:`HOLE` turned into ``%d``: join copies of it with :func:`item_separator` and fill with ``%``."""
    text = json.dumps([example], indent=indent)
    return text[1 : len(text) - (1 if indent is None else 2)].replace(str(HOLE), "%d")


def item_separator(indent: int | None) -> str:
    return ", " if indent is None else ","


def materialize(obj: Any) -> Any:
    """``obj`` with every :class:`JsonArray` replaced by a plain list (recursively)."""
    if isinstance(obj, JsonArray):
        return [materialize(x) for x in obj.materialize()]
    if isinstance(obj, dict):
        return {k: materialize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [materialize(x) for x in obj]
    return obj


def _lazy(obj: Any) -> bool:
    if isinstance(obj, JsonArray):
        return True
    if isinstance(obj, dict):
        return any(_lazy(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(isinstance(x, (JsonArray, dict, list, tuple)) and _lazy(x) for x in obj)
    return False


def write_json(obj: Any, fh: TextIO, indent: int | None = None) -> None:
    """Write ``obj`` to ``fh`` as ``json.dump(materialize(obj), fh, indent=indent)`` would."""
    _write(obj, fh.write, indent, 0)


def _dumps(obj: Any, indent: int | None, pad: str) -> str:
    text = json.dumps(obj, indent=indent)
    return text.replace("\n", "\n" + pad) if indent is not None and pad else text


def _write(obj: Any, w: Callable[[str], Any], indent: int | None, level: int) -> None:
    pad = " " * (indent * level) if indent is not None else ""
    if not _lazy(obj):
        w(_dumps(obj, indent, pad))
        return
    inner_pad = " " * (indent * (level + 1)) if indent is not None else ""
    sep = ", " if indent is None else ","
    nl = "" if indent is None else "\n" + inner_pad
    if isinstance(obj, dict):
        w("{")
        for i, (k, v) in enumerate(obj.items()):
            w(("" if i == 0 else sep) + nl + json.dumps(str(k)) + ": ")
            _write(v, w, indent, level + 1)
        w(("\n" + pad if indent is not None and obj else "") + "}")
        return
    if isinstance(obj, (list, tuple)):
        w("[")
        for i, v in enumerate(obj):
            w(("" if i == 0 else sep) + nl)
            _write(v, w, indent, level + 1)
        w(("\n" + pad if indent is not None and obj else "") + "]")
        return
    assert isinstance(obj, JsonArray)
    first = True
    if obj.encoded is not None:
        for text in obj.encoded(indent):
            if text:
                w(("[" if first else sep) + (text.replace("\n", "\n" + pad) if pad else text))
                first = False
    else:
        tail = len("\n" + pad + "]") if indent is not None else 1
        for piece in obj.pieces():
            if piece:
                text = _dumps(piece, indent, pad)
                w(("[" if first else sep) + text[1:-tail])
                first = False
    w("[]" if first else ("\n" + pad + "]" if indent is not None else "]"))
