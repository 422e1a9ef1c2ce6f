"""Rules kept once: where two layers need the same fact, one takes it from the other, and these tests fail
when a second copy appears beside it and drifts (the rotation rule's own test is in tests/reader/rotation)."""

from __future__ import annotations


def test_the_memory_core_takes_every_layout_rule_from_the_reader_table() -> None:
    """A rule the memory layout states on its own beside the reader's generation table drifts from it
    (the SWA masking once did): every property the two share must be the table's."""
    from dataclasses import fields

    from kvscope.core.memory.layout import Layout
    from kvscope.core.reader.layouts import GENERATIONS

    shared = [f.name for f in fields(GENERATIONS[0]) if isinstance(getattr(Layout, f.name, None), property)]
    assert "swa_perseq_masked" in shared
    for gen in GENERATIONS:
        lay = Layout.named(gen.name)
        assert {n: getattr(lay, n) for n in shared} == {n: getattr(gen, n) for n in shared}, gen.name
