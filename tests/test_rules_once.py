"""Rules kept once: where two layers need the same fact, one takes it from the other, and these tests fail
when a second copy appears beside it and drifts (the rotation rule's own test is in tests/reader/rotation).

- **Which sequence a per-sequence file holds** (:mod:`kvscope.core.reader.seq_owner`, issue #30 item 2): verify
  and repair restore into :func:`restore_seq`, the memory core infers :attr:`SeqOwner.seq`, the Overview lists
  it, all from :func:`file_sequence`. Verify's copy and the Overview's disagreed on 65 of the 1,867 per-sequence
  fixtures (the Overview said the sequence was unknown where verify restored into 0); now the Overview says
  "seq 0 (assumed)" and why.
- **The state-kind groups** (:mod:`kvscope.core.reader.state_kinds`): no module spells a group of kinds as a tuple
  literal of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.overview import sequences
from kvscope.core.memory.infer import InferError, infer_context
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.seq_owner import ASSUMED_SEQ, file_sequence, restore_seq
from kvscope.core.reader.state_kinds import ALL_KINDS, PER_SEQUENCE_KINDS


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


ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".seqstate", ".bin", ".slot", ".blob")


def _per_sequence_fixtures() -> list[Path]:
    out = []
    for p in sorted(DATA.rglob("*")):
        if p.is_file() and p.suffix in SUFFIXES and p.stat().st_size < (8 << 20):
            out.append(p)
    return out


@pytest.mark.slow  # every per-sequence fixture
def test_one_sequence_owner_rule_over_every_per_sequence_fixture() -> None:
    checked = unnamed = inferred = 0
    for path in _per_sequence_fixtures():
        res = read_state(str(path))
        if res.kind not in PER_SEQUENCE_KINDS:
            continue
        owner = file_sequence(res)
        assert owner is not None
        checked += 1
        assert restore_seq(res) == owner.dest == (owner.seq if owner.seq is not None else ASSUMED_SEQ), path
        if owner.seq is None:
            unnamed += 1
            assert owner.label == f"seq {ASSUMED_SEQ} (assumed)" and "restored as seq 0" in owner.why
        try:
            inf = infer_context(res)
        except InferError:
            continue
        inferred += 1
        assert (inf.seq_id, inf.seq_id_known) == (owner.dest, owner.seq is not None), path
    assert checked > 1500 and unnamed > 50 and inferred > 1000, (checked, unnamed, inferred)


@pytest.mark.parametrize("name", ["llamacpp-2025-05-08/llama-f16-fa0-seq1.seqstate",
                                  "llamacpp-2026-10-01/mamba-f32state-n3-seq1.seqstate"])
def test_the_overview_names_the_assumed_sequence(name: str) -> None:
    """Files whose bytes name no sequence: the Overview says where verify and repair put them."""
    res = read_state(str(DATA / name))
    facts = sequences(res)
    assert facts and all(f.seq is None for f in facts)
    text = facts[0].text()
    assert text.startswith("seq 0 (assumed)") and "restore it as seq 0" in text, text
    assert restore_seq(res) == 0


def test_whole_context_files_restore_as_the_whole_context() -> None:
    res = read_state(str(DATA / "llamacpp-2026-10-01/lfm2-f16-fa0-unified0-ctx.session"))
    assert file_sequence(res) is None and restore_seq(res) == -1


def _kind_tuples(tree: ast.AST) -> list[int]:
    kinds = {str(k) for k in ALL_KINDS}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts) and all(v in kinds for v in values):
                lines.append(node.lineno)
    return lines


def test_no_module_spells_a_group_of_state_kinds() -> None:
    home = ROOT / "core" / "reader" / "state_kinds.py"
    bad = []
    for folder in ("core", "app"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == home:
                continue
            lines = _kind_tuples(ast.parse(path.read_text(encoding="utf-8")))
            bad += [f"{path.relative_to(ROOT)}:{n}" for n in lines]
    assert bad == [], f"groups of state kinds spelled out (use kvscope.core.reader.state_kinds): {bad}"


def _calls(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of ``tree`` that call one of ``names`` (a plain name or an attribute: ``read_state(...)``,
    ``ByteSource.open(...)``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in names:
                out.append(node.lineno)
    return out


def test_the_commands_open_files_through_the_pipeline() -> None:
    """#30 item 1: the commands, the report and repair open and parse a user's file through
    ``kvscope.core.analysis.inspection`` (inspect_file / open_state + inspect_source), never with the reader's
    entry point or a ByteSource of their own (diff, the report and repair each had one)."""
    files = [*sorted((ROOT / "core" / "cli").glob("*_command.py")), *sorted((ROOT / "core" / "report").glob("*.py")),
             ROOT / "core" / "verify" / "repair.py"]
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in files
           for n in _calls(ast.parse(p.read_text(encoding="utf-8")), {"read_state", "open"})
           if "ByteSource" in p.read_text(encoding="utf-8").splitlines()[n - 1]
           or "read_state" in p.read_text(encoding="utf-8").splitlines()[n - 1]]
    assert bad == [], f"a file opened or parsed outside the inspection pipeline: {bad}"
