"""Findings: what a reader or checker has to say about a byte range of a state file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}

# Stable codes. Tools, tests and the GUI key on these strings: never rename one. Each is emitted somewhere
# (tests/test_spec_citations.py checks it): an ambiguous layout is said by the layout's alternatives, an
# inferred rotation by the stream's n_rot_inferred, not by findings.
FINDING_CODES: frozenset[str] = frozenset(
    {
        "unknown_format",
        "truncated",
        "trailing_bytes",
        "unparsed",
        "missing_layer",
        "layer_count_mismatch",
        "type_mismatch",
        "row_size_mismatch",
        "cell_count_invalid",
        "seq_meta_invalid",
        "position_anomaly",
        "token_out_of_vocab",
        "model_mismatch",
        "nonfinite_values",
        "zero_rows",
        "resynced",
        "stream_count_invalid",
        "value_invalid",
        "unconfirmed_end",
        "read_by_structure",
        "token_cell_mismatch",
        "version_newer",
    }
)
# Findings that say a llama.cpp newer than this kvscope wrote the file (its version word above the newest known):
# the verdict is "newer", never "damaged", and nothing rewrites such a file as a layout kvscope knows.
NEWER_CODES: frozenset[str] = frozenset({"version_newer"})


@dataclass
class Finding:
    """One observation with an absolute byte range; ``path`` names the structure node."""

    severity: Severity
    code: str
    offset: int
    length: int
    message: str
    path: str = ""
    layer: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    node: Any = field(default=None, repr=False, compare=False)  # structure node, resolved to ``path``

    def __post_init__(self) -> None:
        if self.code not in FINDING_CODES:
            raise ValueError(f"unknown finding code {self.code!r}")

    def layer_text(self) -> str:
        """The record's model layer (``6``), else its index said as an index (``#5``: read without a model, an
        iSWA half's or a hybrid's record is not known by its layer), else nothing."""
        if self.layer is not None:
            return str(self.layer)
        index = self.extra.get("index")
        return f"#{index}" if isinstance(index, int) else ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "severity": self.severity,
            "code": self.code,
            "offset": self.offset,
            "length": self.length,
            "message": self.message,
            "path": self.path,
            "layer": self.layer,
        }
        if self.extra:
            out["extra"] = self.extra
        return out
