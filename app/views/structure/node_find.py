"""Finding a node by its text: name, kind, path or value (pure Python, no Qt).

The structure view's find box and the hex view's find bar (in node mode) share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvscope.core.reader.tree import Node


def node_text(node: Node, label: str = "") -> str:
    """What a node search looks at, lower case (``label``: a record's label, ``kv_swa K layer 6``)."""
    value = "" if node.value is None else str(node.value)
    return f"{node.name} {label} {node.kind} {node.path} {value}".lower()


def find_node(order: Sequence[Node], text: str, current: Node | None, backward: bool = False,
              labels: Mapping[int, str] | None = None) -> Node | None:
    """The next (``backward``: previous) node of ``order`` after ``current`` whose text holds ``text``, wrapping;
    ``labels`` (``id(node) -> label``) are searched too."""
    needle = text.strip().lower()
    n = len(order)
    if not needle or n == 0:
        return None
    at = next((i for i, x in enumerate(order) if x is current), -1 if not backward else n)
    for k in range(1, n + 1):
        node = order[(at - k if backward else at + k) % n]
        if needle in node_text(node, labels.get(id(node), "") if labels else ""):
            return node
    return None
