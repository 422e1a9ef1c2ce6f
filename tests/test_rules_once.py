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


def test_the_pinned_builds_are_named_once() -> None:
    """The engine builds the table the analysis names builds from (compat had its own map)."""
    from kvscope.core import pinned_builds
    from kvscope.core.analysis import compat
    from kvscope.core.engine import builds
    from kvscope.core.reader.layouts import GENERATION_BY_NAME

    assert builds.BUILDS is pinned_builds.BUILDS
    assert not [n for n in vars(compat) if "BUILD" in n.upper() and n != "build_writing"]
    for b in pinned_builds.BUILDS:
        assert b.writes in GENERATION_BY_NAME
        assert pinned_builds.build_writing(b.writes) == b.name
