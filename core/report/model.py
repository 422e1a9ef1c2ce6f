"""What a report is made of: its options, the collected data, its pictures (no Qt here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvscope.core.errors import InputError

if TYPE_CHECKING:
    from kvscope.core.analysis.diff import StateDiff
    from kvscope.core.analysis.overview import Overview
    from kvscope.core.analysis.stats import LayerStats, StatsReport
    from kvscope.core.lab.report import LabRun
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section
    from kvscope.core.report.names import PathNames

Progress = Callable[[float | None, str], None]  # (fraction or None for "busy", text)
Cancelled = Callable[[], bool]

GENERATOR = "kvscope report"  # report.json's "report.generator": marks a folder a report may replace
MAX_HEATMAPS = 4  # flagged layers pictured; the others are listed
MAX_CELL_TABLES = 4  # cell tables pictured
GUI_EXTRA = "pip install 'kvscope[gui]'"  # what draws the pictures and report.html (the Qt layer)


class ReportError(InputError):
    """Bad input or an unwritable destination: one line for the user (exit code 2)."""


class Bookmark(Protocol):
    """What a report reads of a bookmark (the app's :class:`kvscope.app.document.bookmark.Bookmark`):
    bytes ``[start, end)`` of the file, and its JSON (start, end, length, name, note)."""

    @property
    def start(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


def no_progress(_fraction: float | None, _text: str) -> None:
    """A progress callback that ignores everything."""


@dataclass(frozen=True)
class ReportOptions:
    """What to report on. ``lab_context``: the live context for ``--lab`` (else the file's scenario folder);
    ``full_paths``: print paths as given instead of base names."""

    file: str
    model: str | None = None
    compare: str | None = None
    lab: bool = False
    lab_context: str | None = None
    lab_into: int = 0
    full_paths: bool = False
    bookmarks: tuple[Bookmark, ...] = ()  # the app's bookmarks on the file (the CLI has none)

    def names(self) -> PathNames:
        """How this report names the files it was built from."""
        from kvscope.core.report.names import PathNames

        return PathNames([p for p in (self.file, self.model, self.compare, self.lab_context) if p],
                         self.full_paths)


@dataclass
class LabSection:
    """The lab matrix run for the report, or why there is none (``run`` None, ``reason`` set)."""

    run: LabRun | None
    context: str | None  # the scenario folder or live state used
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """``{"ran": true, "context": ..., <run_to_json>}`` or ``{"ran": false, "reason": ...}``."""
        if self.run is None:
            return {"ran": False, "context": self.context, "reason": self.reason}
        from kvscope.core.lab.report import run_to_json

        return {"ran": True, "context": self.context, **run_to_json(self.run)}


@dataclass(frozen=True)
class Flagged:
    """A layer record pictured as a heatmap, and why."""

    record: LayerRecord
    stats: LayerStats | None
    why: str


@dataclass
class ReportData:
    """Everything collected for one report (step 1)."""

    options: ReportOptions
    result: ParseResult
    profile: ModelProfile | None
    stats: StatsReport | None
    stats_error: str | None
    inspect: dict[str, Any]  # exactly what ``kvscope inspect --json --stats`` prints
    overview: Overview  # the overview that heads every format (verdict, compatibility...)
    diff: StateDiff | None = None
    lab: LabSection | None = None
    flagged: list[Flagged] = field(default_factory=list)
    flagged_total: int = 0  # flagged records, pictured or not

    @property
    def name(self) -> str:
        """The state file as the report names it (its base name unless ``full_paths``)."""
        return self.overview.file

    def finding_counts(self) -> dict[str, int]:
        """Findings per severity (error, warning, info)."""
        from kvscope.core.analysis.verdict import finding_counts

        return finding_counts(self.result)


@dataclass(frozen=True)
class ReportImage:
    """One picture: file name in the report folder, title, caption and PNG bytes."""

    file: str
    title: str
    caption: str
    png: bytes
    width: int
    height: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "title": self.title, "caption": self.caption, "width": self.width,
                "height": self.height}


def layer_records(res: ParseResult) -> list[tuple[int, Section, KvStream | None, LayerRecord]]:
    """(section index, section, stream or None, record) of every layer record of ``res``, in the order the app's
    document index lists them (:class:`kvscope.app.document.doc_index.DocumentIndex`): per section, per stream,
    K records before V."""
    out: list[tuple[int, Section, KvStream | None, LayerRecord]] = []
    for si, sec in enumerate(res.sections):
        if sec.kind == "kv":
            out += [(si, sec, st, rec) for st in sec.streams for rec in (*st.k_layers, *st.v_layers)]
        else:
            out += [(si, sec, None, rec) for rec in sec.all_layers()]
    return out
