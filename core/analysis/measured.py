"""What a ``kvscope verify`` result measured, put in place of the prediction it measured (no Qt here).

The reader cannot tell which layer's record a stream dropped when the records are alike: its
``missing_layer`` finding names the first empty slot and the candidate layers ("the first empty slot is
layer 16 (candidates: layers 0..16)"), a guess that finding's message carries into the verdict's reason,
libllama's predicted refusal and llama-server's reuse line. ``kvscope verify`` compares with the records a
real engine writes and lists the missing record by its true layer and role (status ``missing``); it may be
a K record where the reader guessed a V, since alike records read as the other kind. Wherever the guess
is shown, :func:`measured_text` puts Verify's answer instead (marked ``measured``), so the banner, the
findings, the Overview, the tree and the report all say what was measured.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from kvscope.core.analysis.verdict import Verdict
from kvscope.core.findings import Finding

# the reader's guess (core/reader/kv_section.py's missing_layer message), in the forms it has been written in
GUESS = re.compile(r"the first empty slot is layer \d+ \(candidates:? (?:layers )?\d+\.\.\d+\)")
_STREAM = re.compile(r"^stream(\d+)$")


def finding_where(f: Finding) -> tuple[str, int | None]:
    """The (section role, stream) a ``missing_layer`` finding is about, from its path."""
    parts = [p for p in f.path.split("/") if p]
    m = _STREAM.match(parts[-1]) if parts else None
    if m is not None and len(parts) >= 2:
        return parts[-2], int(m.group(1))
    return (parts[-1] if parts else ""), None


def named_missing(verify: dict[str, Any] | None) -> dict[tuple[str, int | None], list[tuple[int, str]]]:
    """The records a ``kvscope verify`` result lists as ``missing``: (layer, role) per (section, stream), in
    layer order."""
    out: dict[tuple[str, int | None], list[tuple[int, str]]] = {}
    for c in (verify or {}).get("records") or []:
        if not isinstance(c, dict) or c.get("status") != "missing" or c.get("il") is None:
            continue
        stream = c.get("stream")
        key = (str(c.get("section")), int(stream) if stream is not None else None)
        out.setdefault(key, []).append((int(c["il"]), str(c.get("role") or "")))
    return {k: sorted(v) for k, v in out.items()}


def missing_text(records: list[tuple[int, str]]) -> str:
    """``Verify names the missing record: layer 8 K (measured)``."""
    layers = ", ".join(f"layer {il} {role.upper()}" for il, role in records)
    return f"Verify names the missing record{'s' if len(records) > 1 else ''}: {layers} (measured)"


def _records(verify: dict[str, Any] | None, where: tuple[str, int | None] | None) -> list[tuple[int, str]]:
    named = named_missing(verify)
    if where is not None:
        return named.get(where, [])
    return sorted(r for recs in named.values() for r in recs)


def measured_text(text: str, verify: dict[str, Any] | None, where: tuple[str, int | None] | None = None) -> str:
    """``text`` with the reader's guess at a dropped record's layer replaced by the record(s) Verify lists as
    missing (those of ``where``'s stream, else all); ``text`` itself when Verify lists none."""
    records = _records(verify, where)
    if not records or "first empty slot" not in text:
        return text
    return GUESS.sub(missing_text(records), text)


def measured_message(f: Finding, verify: dict[str, Any] | None) -> str | None:
    """A ``missing_layer`` finding's message with the record Verify lists as missing in its stream instead of
    the reader's guess; None when Verify did not measure it (or the finding is of another code)."""
    if f.code != "missing_layer":
        return None
    records = _records(verify, finding_where(f))
    if not records:
        return None
    text = measured_text(f.message, verify, finding_where(f))
    return text if text != f.message else f"{f.message}; {missing_text(records)}"


def measured_verdict(v: Verdict, verify: dict[str, Any] | None) -> Verdict:
    """``v`` with the reader's guess at a dropped record's layer replaced by what Verify measured (said at the
    end of the reason when the reason does not hold the guess)."""
    records = _records(verify, None)
    if not records:
        return v
    reason = measured_text(v.reason, verify)
    if reason == v.reason and missing_text(records) not in reason:
        reason = f"{v.reason}; {missing_text(records)}"
    return replace(v, reason=reason)
