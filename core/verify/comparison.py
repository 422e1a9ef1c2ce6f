"""What a comparison of a state file with a fresh prefill says (:mod:`kvscope.core.verify.compare` works it
out): each record's status and figures, the cells each side holds, the tolerance and the limits it was
judged by, and what the comparison needs of a calibration (:class:`RecordLimits`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kvscope.core import errors
from kvscope.core import ggml_types as gt

STATUSES = ("match", "differs", "nonfinite", "missing", "extra")



Cancelled = errors.Cancelled  # the one "the user stopped the work" (re-exported for the verify modules)


@dataclass(frozen=True)
class Tolerance:
    """How close a file value must be to the engine's, relative to the record's RMS: the largest
    difference (``max_rel``) and the RMS of the differences (``rms_rel``), per cache type family."""

    float_max: float = 0.05
    float_rms: float = 0.01
    q8_max: float = 0.12
    q8_rms: float = 0.03
    q5_max: float = 0.5
    q5_rms: float = 0.1
    q4_max: float = 0.9
    q4_rms: float = 0.2

    def for_type(self, type_id: int) -> tuple[float, float]:
        name = gt.type_name(type_id) if gt.is_known_type(type_id) else ""
        if not gt.is_known_type(type_id) or not gt.is_quantized(type_id):
            return self.float_max, self.float_rms
        if name.startswith("q8"):
            return self.q8_max, self.q8_rms
        if name.startswith(("q5", "q6")):
            return self.q5_max, self.q5_rms
        return self.q4_max, self.q4_rms

    def to_json(self) -> dict[str, Any]:
        return {"relative_to": "the record's RMS in the engine's state", **asdict(self)}


@dataclass
class RecordCheck:
    """One tensor record of the file against the engine's."""

    section: str
    section_index: int
    stream: int | None
    role: str  # k / v / r / s
    il: int | None  # the model layer (the engine's record: the true layer)
    status: str
    type: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None  # max_abs / max |engine value|
    rms_rel: float | None = None  # RMS of the differences / RMS of the engine's values
    exact: bool | None = None  # bitwise equal on the compared cells
    n_cells: int = 0  # cells compared
    n_bad_cells: int = 0  # cells beyond the tolerance (or non-finite)
    first_cell: dict[str, Any] | None = None  # the first bad cell: index in the file, sequences, position
    file_index: int | None = None  # the record's place among the stream's records in the file
    file_il: int | None = None  # the layer the file's structure gives the record, when it is not its true layer
    note: str = ""
    cell_rms_rel: float | None = None  # RMS of the differences over the cells that differ at all / the record's RMS
    spread_max_rel: float | None = None  # the engine's own variation (calibration): largest difference / max |value|
    spread_rms_rel: float | None = None  # ... RMS over the cells a schedule changes / the record's RMS
    limit_max_abs: float | None = None  # the limits applied: a cell's largest |difference|
    limit_rms_rel: float | None = None  # ... and the record's rms_rel
    n_zero_cells: int = 0  # bad cells whose row the file holds as zeros where the engine computes values

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()}


RecordKey = tuple[str, int | None, str, int | None]  # (section role, stream, record role, layer)


@dataclass(frozen=True)
class Limits:
    """What one record is judged by: a cell is bad beyond ``max_abs`` (its largest absolute difference),
    the record differs beyond ``rms_rel`` (the RMS of its differences over the record's RMS); the engine's
    own variation they were derived from, where a calibration measured one."""

    max_abs: float
    rms_rel: float
    spread_max_rel: float | None = None
    spread_rms_rel: float | None = None


class RecordLimits(Protocol):
    """What the comparison needs of a calibration (``calibrate.Calibration``)."""

    def record_limits(self, key: RecordKey, floor: Limits, ref_max: float) -> Limits:
        """The limits of record ``key``: ``floor`` (the fixed tolerance) or wider; ``ref_max``: the largest
        |value| of the engine's record."""
        ...

    def to_json(self) -> dict[str, Any]:
        ...


@dataclass
class CellsCheck:
    """The cells of one section/stream: those both states hold, and those only one holds."""

    section: str
    section_index: int
    stream: int | None
    n_file: int
    n_fresh: int
    n_common: int
    missing: int = 0  # cells the engine holds that the file lacks
    extra: int = 0  # cells the file holds that the engine does not
    not_compared: int = 0  # file cells at or after the comparison limit (media)
    first_missing: dict[str, Any] | None = None
    first_extra: dict[str, Any] | None = None
    position_differs: int = 0  # recurrent cells of one sequence at another position

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Comparison:
    records: list[RecordCheck] = field(default_factory=list)
    cells: list[CellsCheck] = field(default_factory=list)
    tolerance: Tolerance = field(default_factory=Tolerance)
    notes: list[str] = field(default_factory=list)
    calibration: RecordLimits | None = None

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.records:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    @property
    def all_match(self) -> bool:
        return bool(self.records) and all(r.status == "match" for r in self.records) and not self.cell_problems

    @property
    def cell_problems(self) -> int:
        return sum(c.missing + c.extra + c.position_differs for c in self.cells)

    def bad_records(self) -> list[RecordCheck]:
        return [r for r in self.records if r.status != "match"]

    def to_json(self) -> dict[str, Any]:
        return {"records": [r.to_json() for r in self.records], "cells": [c.to_json() for c in self.cells],
                "counts": self.counts(), "tolerance": self.tolerance.to_json(), "notes": list(self.notes),
                "calibration": self.calibration.to_json() if self.calibration is not None else None}
