"""A ``kvscope verify`` result's per-record statuses, tied to the file's own layer records (no Qt here).

``kvscope verify --json`` lists one entry per record (``section``, ``section_index``, ``stream``, ``role``,
``il``, ``status``, ``max_abs``, ``file_index`` ...): ``il`` is the engine's (true) layer, ``file_index``
the record's place among the non-empty records of its stream in the file (K then V, or r then s, in
file order, as :mod:`kvscope.core.verify.compare` pairs them). :func:`verify_marks` finds each entry's
:class:`~kvscope.core.reader.records.LayerRecord` in the parse (None for a ``missing`` record, which
the file does not hold) and where it sits on the per-layer plots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvscope.core.analysis.verdict import plural
from kvscope.core.reader.records import LayerRecord, ParseResult, Section

STATUSES = ("match", "differs", "nonfinite", "missing", "extra")


@dataclass(frozen=True)
class RecordMark:
    """One verified record: the verify entry, the file's record (None: missing) and its place."""

    check: dict[str, Any]
    record: LayerRecord | None
    section_index: int
    stream: int | None
    role: str
    x: float  # on the layer axis: the file record's layer (else index); a missing record's true layer

    @property
    def status(self) -> str:
        return str(self.check.get("status"))

    def text(self) -> str:
        """``match (max |Δ| 0)``, ``differs (max |Δ| 0.31, first bad cell pos 3)``, ``missing``."""
        c = self.check
        parts = []
        if c.get("max_abs") is not None and self.status in ("match", "differs"):
            parts.append(f"max |Δ| {float(c['max_abs']):.3g}")
        if c.get("exact"):
            parts.append("bitwise equal")
        first = c.get("first_cell")
        if isinstance(first, dict) and first:
            parts.append("first bad cell " + ", ".join(f"{k} {v}" for k, v in first.items()))
        if c.get("n_bad_cells"):
            parts.append(plural(int(c["n_bad_cells"]), "bad cell"))
        if c.get("note"):
            parts.append(str(c["note"]))
        return self.status + (f" ({'; '.join(parts)})" if parts else "")

    def where(self) -> str:
        """``layer 1 K (kv · stream 0)``."""
        c = self.check
        il = c.get("il")
        sec = str(c.get("section"))
        return (f"layer {'?' if il is None else il} {self.role.upper()} ("
                + (sec if self.stream is None else f"{sec} · stream {self.stream}") + ")")


def _unit_records(sec: Section, stream: int | None) -> list[LayerRecord]:
    """The stream's (or section's) records as the comparison walks them: K then V, r then s, non-empty."""
    if sec.kind == "kv":
        st = next((s for s in sec.streams if s.index == stream), None)
        recs = [*st.k_layers, *st.v_layers] if st is not None else []
    elif sec.kind == "recurrent":
        recs = [*sec.r_layers, *sec.s_layers]
    else:
        recs = list(sec.records)
    return [r for r in recs if r.data_size > 0 and (r.row_bytes > 0 or r.transposed)]


def verify_marks(res: ParseResult | None, result: dict[str, Any] | None) -> list[RecordMark]:
    """Every record entry of ``result`` (a ``kvscope verify --json`` object) with the file's record."""
    if res is None or not result:
        return []
    out = []
    units: dict[tuple[int, int | None], list[LayerRecord]] = {}
    for c in result.get("records") or []:
        if not isinstance(c, dict):
            continue
        si = int(c.get("section_index") or 0)
        stream = c.get("stream")
        stream = int(stream) if stream is not None else None
        role = str(c.get("role") or "")
        rec: LayerRecord | None = None
        sec = res.sections[si] if 0 <= si < len(res.sections) else None
        if sec is not None and sec.role == c.get("section") and c.get("file_index") is not None:
            recs = units.setdefault((si, stream), _unit_records(sec, stream))
            k = int(c["file_index"])
            rec = recs[k] if 0 <= k < len(recs) else None
        il = c.get("il")
        if rec is not None:
            x = float(rec.il if rec.il is not None else rec.index)
        else:
            x = float(il) if il is not None else -1.0
        out.append(RecordMark(c, rec, si, stream, role, x))
    return out


def mark_of(marks: list[RecordMark], rec: LayerRecord) -> RecordMark | None:
    """The mark of the file's record ``rec`` (None: not verified)."""
    return next((m for m in marks if m.record is rec), None)


def status_counts(result: dict[str, Any] | None) -> dict[str, int]:
    """Records per status, in :data:`STATUSES` order (statuses with no record left out)."""
    counts = {s: 0 for s in STATUSES}
    for c in (result or {}).get("records") or []:
        if isinstance(c, dict) and c.get("status") in counts:
            counts[str(c["status"])] += 1
    return {k: v for k, v in counts.items() if v}
