"""Records a damaged file dropped (``missing_layer`` findings), and the layer a Verify result names for them
(no Qt here).

The reader sees that a stream holds fewer K (or V) records than its ``n_layer`` says; when the records
are alike it cannot tell which layer's record went, and names the first empty slot with the candidate
layers. ``kvscope verify`` compares with the records a real engine writes and lists the missing one by
its true layer (status ``missing``). :func:`dropped_records` gives one :class:`DroppedRecord` per
missing record, named by Verify where it has run; :func:`refine_verdict` puts Verify's answer in the
verdict's reason instead of the reader's guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.core.analysis.measured import finding_where, measured_verdict
from kvscope.core.analysis.measured import named_missing as _named
from kvscope.core.analysis.verdict import Verdict
from kvscope.core.findings import Finding
from kvscope.core.reader.records import ParseResult


def layer_runs(layers: tuple[int, ...]) -> str:
    """``0..4, 6..10, 12..16``: the candidate layers as runs (a stream of an iSWA cache holds only its own
    layers: one range from the first to the last would name the other cache's layers too)."""
    runs: list[list[int]] = []
    for il in sorted(set(layers)):
        if runs and il == runs[-1][1] + 1:
            runs[-1][1] = il
        else:
            runs.append([il, il])
    return ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in runs)


@dataclass(frozen=True)
class DroppedRecord:
    """One record a stream should hold and does not, at the offset where it would have been."""

    finding: Finding
    section: str  # the section's role ("kv")
    stream: int | None
    role: str  # "k", "v" ("k or v" when the reader cannot tell); Verify's role once it named the record
    offset: int
    layer: int | None  # the layer Verify names (None: not verified, or not named)
    candidates: tuple[int, ...]  # the layers it may have been, as far as the bytes tell

    @property
    def name(self) -> str:
        """``K3 (missing: Verify names layer 3)`` once Verify named it, else ``K? (missing: one of layers 0..3)``."""
        role = self.role.upper().replace(" OR ", "/")
        if self.layer is not None:
            return f"{role}{self.layer} (missing: Verify names layer {self.layer})"
        if self.candidates and self.finding.extra.get("candidates_are") == "index":  # no model: not layers
            return f"{role}? (missing: one of records #{self.candidates[0]}..#{self.candidates[-1]})"
        if self.candidates:
            return f"{role}? (missing: one of layers {layer_runs(self.candidates)})"
        return f"{role}? (missing)"


def dropped_records(res: ParseResult | None, verify: dict[str, Any] | None = None) -> list[DroppedRecord]:
    """One entry per record the ``missing_layer`` findings count, named by ``verify`` where it lists them: the
    records Verify lists as missing in the finding's stream, whatever their role (alike K and V records read as
    each other, so the reader may count a dropped K as a missing V)."""
    if res is None:
        return []
    named = _named(verify)
    used: dict[tuple[str, int | None], int] = {}
    out = []
    for f in res.findings:
        if f.code != "missing_layer":
            continue
        section, stream = finding_where(f)
        role = str(f.extra.get("role") or "k")
        cands = tuple(int(c) for c in f.extra.get("candidates") or ())
        records = named.get((section, stream), [])
        for _ in range(max(1, int(f.extra.get("missing") or 1))):
            k = used.get((section, stream), 0)
            used[(section, stream)] = k + 1
            if k < len(records):
                il, got = records[k]
                out.append(DroppedRecord(f, section, stream, got or role, f.offset, il, cands))
            else:
                out.append(DroppedRecord(f, section, stream, role, f.offset, None, cands))
    return out


def refine_verdict(v: Verdict, res: ParseResult | None, verify: dict[str, Any] | None) -> Verdict:
    """``v`` with the reader's guess at a dropped record's layer replaced by what Verify measured (the core's
    :func:`~kvscope.core.analysis.measured.measured_verdict`, which the report's overview applies too)."""
    return measured_verdict(v, verify) if res is not None else v
