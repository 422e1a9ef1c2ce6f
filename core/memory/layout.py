"""Write and read rules of one layout generation, derived from the reader's :class:`Generation`.

The reader's generations list what changes the bytes; the memory core also needs what changes
behaviour around them (spec §7.3, §8): the 2025-05 cache writes a data header even for an empty
section and counts every model layer, per-sequence restores needed contiguous cells until
PR #17982 (after 2025-08). (The 2025-05 whole-context restore only rejected negative sequence
ids; here ids >= ``n_seq_max`` are rejected in every layout, as the cells cannot hold them.)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.core.errors import UsageError
from kvscope.core.memory.spec import NEW_CLASSES, MemorySpec
from kvscope.core.reader.layouts import GENERATION_BY_NAME, GENERATIONS, Generation, generation_named

CURRENT = GENERATIONS[-1].name

# llama_state_seq_flags (include/llama.h)
FLAG_PARTIAL_ONLY = 1
FLAG_ON_DEVICE = 2


class LayoutError(UsageError, ValueError):
    """A memory state cannot be expressed in (or read from) a layout (one-line message)."""


@dataclass(frozen=True)
class Layout:
    """Rules of one generation, with the reader's :class:`Generation` underneath."""

    gen: Generation

    @classmethod
    def named(cls, name: str | None) -> Layout:
        """The layout of a generation name (``None``: the current one)."""
        gen = generation_named(name or CURRENT)
        if gen is None:
            raise LayoutError(f"unknown layout {name!r}; known: {', '.join(GENERATION_BY_NAME)}")
        return cls(gen)

    @property
    def name(self) -> str:
        """The generation name (e.g. ``2026-10``)."""
        return self.gen.name

    # -- bytes --------------------------------------------------------------------------------
    @property
    def n_stream(self) -> bool:
        """The KV section starts with ``u32 n_stream`` and has one part per stream."""
        return self.gen.n_stream

    @property
    def perseq_kv_nseq(self) -> int:
        """``n_seq_id`` of a per-sequence KV cell record: 1 (plus the id), or 0 before n_stream."""
        return 1 if self.gen.n_stream else 0

    @property
    def kv_n_layer_all(self) -> bool:
        """A KV section counts every model layer (the 2025-05 unified cache), not its own layers."""
        return not self.gen.n_stream

    @property
    def empty_section_data(self) -> bool:
        """An empty KV section still writes ``v_trans``, ``n_layer`` and every record header."""
        return not self.gen.n_stream

    @property
    def kv_rot(self) -> bool:
        """A KV data header carries ``u32 n_rot_k, u32 n_rot_v`` (v11/v4)."""
        return self.gen.kv_rot

    @property
    def blob_header(self) -> bool:
        """The buffer-API blob starts with ``0xaf143cd8`` and the seq id."""
        return self.gen.blob_header

    @property
    def ctx_outputs(self) -> bool:
        """The context state carries the outputs sections."""
        return self.gen.ctx_outputs

    @property
    def swa_perseq_masked(self) -> bool:
        """A per-sequence write skips cells outside the sliding window of the sequence (from 2026-08:
        the 2026-04 fixtures, llama.cpp f5357743, write every cell of the sequence to the SWA cache)."""
        return self.gen.swa_perseq_masked

    @property
    def session_version(self) -> int:
        """Version field of a session file."""
        return self.gen.session_version

    @property
    def seq_version(self) -> int:
        """Version field of a sequence file."""
        return self.gen.seq_version

    def ext_bytes(self, spec: MemorySpec) -> int:
        """Bytes of ``llama_kv_cell_ext`` per KV cell record for this model (0: none)."""
        if self.gen.cell_ext >= 12:
            return 12 if spec.has_cell_ext() else 0
        if self.gen.cell_ext == 8:
            return 8 if spec.n_pos_per_embd > 1 else 0
        return 0

    def partial(self, memory_class: str, flags: int) -> bool:
        """Does ``PARTIAL_ONLY`` drop a part of this memory class in this generation."""
        return bool(flags & FLAG_PARTIAL_ONLY) and memory_class in self.gen.partial_kinds

    # -- read behaviour -----------------------------------------------------------------------
    @property
    def contiguous_restore(self) -> bool:
        """A per-sequence KV restore needs contiguous free cells (``find_slot(ubatch, true)``)."""
        return self.gen.name in ("2025-05", "2025-08")

    def check_spec(self, spec: MemorySpec, n_stream: int) -> None:
        """Raise :class:`LayoutError` when a memory of ``spec`` cannot be written in this layout."""
        if spec.memory_class in NEW_CLASSES and self.gen.cell_ext < 12:
            raise LayoutError(f"layout {self.name} has no verified {spec.memory_class} memory (kvscope knows its bytes "
                              "from the 2026-10 builds on)")
        if spec.ple_layers and spec.n_embd_p and self.gen.cell_ext < 12:
            raise LayoutError(f"layout {self.name} has no PLE rows in its recurrent sections (2026-10 and later)")
        if not self.gen.n_stream:
            if spec.memory_class not in ("kv", "recurrent"):
                raise LayoutError(f"layout {self.name} has no {spec.memory_class} memory "
                                  "(one unified KV cache or a recurrent cache only)")
            if n_stream != 1:
                raise LayoutError(f"layout {self.name} has no n_stream field: it holds one stream, not {n_stream}")
            if spec.memory_class == "kv" and len(spec.attn) != spec.n_layer:
                raise LayoutError(f"layout {self.name} counts every model layer in the KV cache, but only "
                                  f"{len(spec.attn)} of {spec.n_layer} layers have one")
