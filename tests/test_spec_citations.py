"""What the core's docs promise exists: every ``spec §N`` / ``docs §N`` a core module cites names a section
of docs/state-format.md (the numbers drifted once the spec was renumbered), and every finding code is
emitted by some module."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "docs" / "state-format.md"
CITE = re.compile(r"(?:spec|docs) (§[0-9][0-9.\-, §and]*)")
NUMBER = re.compile(r"§?([0-9]+(?:\.[0-9]+)?)")


def _sections() -> set[str]:
    heads = re.findall(r"^#{2,3} ([0-9]+(?:\.[0-9]+)?)\.? ", SPEC.read_text(encoding="utf-8"), re.M)
    return set(heads)


def test_the_spec_has_numbered_sections() -> None:
    assert {"2.2", "4", "6.1", "7.1", "8"} <= _sections()


def test_every_citation_names_a_section_of_the_spec() -> None:
    have = _sections()
    wrong = []
    for py in sorted((ROOT / "core").rglob("*.py")):
        for m in CITE.finditer(py.read_text(encoding="utf-8")):
            for ref in NUMBER.findall(m.group(1)):
                if ref not in have:
                    wrong.append(f"{py.relative_to(ROOT)}: §{ref}")
    assert wrong == []


def test_every_finding_code_is_emitted_somewhere() -> None:
    """A documented code that nothing emits is a promise a user's tooling would wait on forever."""
    from kvscope.core.findings import FINDING_CODES

    source = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "core").rglob("*.py") if p.name != "findings.py")
    assert sorted(c for c in FINDING_CODES if f'"{c}"' not in source) == []
