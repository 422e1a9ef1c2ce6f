"""The structure tree: every byte of a state file belongs to exactly one leaf.

Containers (file, header, memory section, stream, layer) span their children; leaves are fields,
token arrays, cell tables, tensor payloads, and the ``unparsed``/``trailing`` ranges a tolerant
parse leaves behind. The byte map, the GUI tree and JSON ``coverage`` all come from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["parsed", "untrusted", "unparsed", "trailing"]

# Leaf kinds; the byte map colours by these.
LEAF_KINDS = (
    "field",  # a scalar header or meta field
    "tokens",
    "arch",
    "outputs",  # n_outputs / output ids / logits / embeddings
    "cell_meta",
    "layer_header",
    "k_rows",
    "v_rows",
    "r_rows",
    "s_rows",
    "p_rows",
    "unparsed",
    "trailing",
)


@dataclass
class Node:
    """A named byte range; ``value`` is the decoded field (leaves) or None (containers)."""

    name: str
    kind: str
    offset: int
    size: int
    value: Any = None
    status: Status = "parsed"
    children: list[Node] = field(default_factory=list)
    parent: Node | None = field(default=None, repr=False, compare=False)
    note: str = ""

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def path(self) -> str:
        parts: list[str] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return "/" + "/".join(reversed(parts))

    def add(self, child: Node) -> Node:
        child.parent = self
        self.children.append(child)
        return child

    def leaves(self) -> Iterator[Node]:
        """The leaves under this node, in order (iteratively: no generator per level)."""
        stack = [self]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(reversed(node.children))
            else:
                yield node

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, path: str) -> Node | None:
        """The node at ``path`` (as produced by :attr:`path`), or None."""
        if path in ("", "/"):
            return self
        node: Node | None = self
        for part in path.strip("/").split("/"):
            if node is None:
                return None
            node = next((c for c in node.children if c.name == part), None)
        return node

    def deepest_at(self, offset: int) -> Node | None:
        """The leaf holding byte ``offset`` (children are sorted by offset)."""
        if not (self.offset <= offset < self.end):
            return None
        for c in self.children:
            if c.offset <= offset < c.end:
                return c.deepest_at(offset)
        return self

    def mark_untrusted(self) -> None:
        for n in self.walk():
            if n.status == "parsed":
                n.status = "untrusted"

    def fit_to_children(self) -> None:
        """Make a container span exactly from its first child's start to its last child's end."""
        if self.children:
            self.offset = self.children[0].offset
            self.size = self.children[-1].end - self.offset

    def to_json(self, max_depth: int = 64) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "offset": self.offset,
            "size": self.size,
            "status": self.status,
        }
        if isinstance(self.value, (bool, int, float, str)):
            out["value"] = self.value
        if self.note:
            out["note"] = self.note
        if self.children and max_depth > 0:
            out["children"] = [c.to_json(max_depth - 1) for c in self.children]
        return out


def coverage(root: Node) -> dict[str, int]:
    """Bytes per leaf status; the leaves of a finished tree tile ``[0, root.size)``."""
    cov = {"size": root.size, "parsed_bytes": 0, "untrusted_bytes": 0, "unparsed_bytes": 0, "trailing_bytes": 0}
    for leaf in root.leaves():
        if leaf is root:
            continue
        cov[f"{leaf.status}_bytes"] += leaf.size
    return cov


def check_tiling(root: Node) -> list[str]:
    """Problems with the tiling invariant (empty when every byte is in exactly one leaf)."""
    problems: list[str] = []
    pos = root.offset
    for leaf in root.leaves():
        if leaf is root:
            break
        if leaf.offset != pos:
            problems.append(f"{leaf.path}: starts at {leaf.offset}, expected {pos}")
        pos = leaf.end
    if root.children and pos != root.end:
        problems.append(f"leaves end at {pos}, file ends at {root.end}")
    return problems
