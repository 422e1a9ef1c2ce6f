"""What one ``state_write`` / ``state_read`` call carries through the memory classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvscope.core.memory.io import StateReader, StateSink
from kvscope.core.memory.layout import Layout

if TYPE_CHECKING:
    from kvscope.core.memory.policy import FailurePolicy


@dataclass
class WriteCtx:
    """A write: the sink, the layout, and the model facts the bytes depend on."""

    sink: StateSink
    layout: Layout
    ext_bytes: int  # llama_kv_cell_ext bytes per KV cell record
    n_layer: int  # model layer count (recurrent n_layer; the 2025-05 KV n_layer)
    flags: int = 0


@dataclass
class ReadCtx:
    """A restore: the reader, the layout, the failure policy, and a log of cleanup actions."""

    io: StateReader
    layout: Layout
    policy: FailurePolicy
    ext_bytes: int
    n_layer: int
    n_pos_per_embd: int = 1
    flags: int = 0
    actions: list[str] = field(default_factory=list)
    alloc_bytes: int | None = None  # the ubatch allocation a legacy restore attempted

    def act(self, what: str) -> None:
        """Log one cleanup action."""
        self.actions.append(what)
