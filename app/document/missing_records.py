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

import re
from dataclasses import dataclass, replace
from typing import Any

from kvscope.core.analysis.verdict import Verdict
from kvscope.core.findings import Finding
from kvscope.core.reader.records import ParseResult

_STREAM = re.compile(r"^stream(\d+)$")
_GUESS = re.compile(r"the first empty slot is layer \d+ \(candidates: layers \d+\.\.\d+\)")


@dataclass(frozen=True)
class DroppedRecord:
    """One record a stream should hold and does not, at the offset where it would have been."""

    finding: Finding
    section: str  # the section's role ("kv")
    stream: int | None
    role: str  # "k", "v" ("k or v" when the reader cannot tell)
    offset: int
    layer: int | None  # the layer Verify names (None: not verified, or not named)
    candidates: tuple[int, ...]  # the layers it may have been, as far as the bytes tell

    @property
    def name(self) -> str:
        """``K3 (missing)`` once Verify named it, else ``K? (missing: one of layers 0..3)``."""
        role = self.role.upper().replace(" OR ", "/")
        if self.layer is not None:
            return f"{role}{self.layer} (missing: Verify names layer {self.layer})"
        if self.candidates:
            return f"{role}? (missing: one of layers {self.candidates[0]}..{self.candidates[-1]})"
        return f"{role}? (missing)"


def _where(f: Finding) -> tuple[str, int | None]:
    parts = [p for p in f.path.split("/") if p]
    m = _STREAM.match(parts[-1]) if parts else None
    if m is not None and len(parts) >= 2:
        return parts[-2], int(m.group(1))
    return (parts[-1] if parts else ""), None


def named_missing(verify: dict[str, Any] | None) -> dict[tuple[str, int | None, str], list[int]]:
    """The layers a ``kvscope verify`` result lists as ``missing``, per (section, stream, role)."""
    out: dict[tuple[str, int | None, str], list[int]] = {}
    for c in (verify or {}).get("records") or []:
        if not isinstance(c, dict) or c.get("status") != "missing" or c.get("il") is None:
            continue
        stream = c.get("stream")
        key = (str(c.get("section")), int(stream) if stream is not None else None, str(c.get("role")))
        out.setdefault(key, []).append(int(c["il"]))
    return {k: sorted(v) for k, v in out.items()}


def dropped_records(res: ParseResult | None, verify: dict[str, Any] | None = None) -> list[DroppedRecord]:
    """One entry per record the ``missing_layer`` findings count, named by ``verify`` where it lists them."""
    if res is None:
        return []
    named = named_missing(verify)
    out = []
    for f in res.findings:
        if f.code != "missing_layer":
            continue
        section, stream = _where(f)
        role = str(f.extra.get("role") or "k")
        cands = tuple(int(c) for c in f.extra.get("candidates") or ())
        layers = named.get((section, stream, role), [])
        for i in range(max(1, int(f.extra.get("missing") or 1))):
            layer = layers[i] if i < len(layers) else None
            out.append(DroppedRecord(f, section, stream, role, f.offset, layer, cands))
    return out


def refine_verdict(v: Verdict, res: ParseResult | None, verify: dict[str, Any] | None) -> Verdict:
    """``v`` with the reader's guess at a dropped record's layer replaced by the layer Verify names."""
    named = [d for d in dropped_records(res, verify) if d.layer is not None]
    if not named:
        return v
    layers = ", ".join(f"layer {d.layer} {d.role.upper()}" for d in named)
    answer = f"Verify names the missing record{'s' if len(named) > 1 else ''}: {layers}"
    reason, n = _GUESS.subn(answer, v.reason)
    if not n:
        reason = f"{v.reason}; {answer}"
    return replace(v, reason=reason)
