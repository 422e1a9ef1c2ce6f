"""One inspection pipeline: open a state file, parse it, check it against the model, judge it, enrich it.

Every front end that inspects a file goes through here: ``kvscope inspect``, ``diff`` (both files, kept open
for the byte comparison: :func:`open_state` + :func:`inspect_source`), ``repair`` (the file and its rebuilt
copy), the report, ``scan``, ``migrate``, ``verify`` and the app's document (which shows the parse first and
adds the statistics and the compatibility as they come in: :meth:`Inspection.add_stats`,
:meth:`Inspection.add_compat`, the steps :func:`inspect_source` runs). ``rewrite`` sits below analysis
(``core/convert``) and calls the reader's entry point itself. :func:`inspect_file` opens the file read-only
(regular files only: a FIFO or a device is refused before it can block), parses it with the one reader entry
point (:func:`kvscope.core.reader.parse.read_state`), adds the payload statistics when asked (their findings
join the file's), works out which layout generations load it, judges it
(:func:`kvscope.core.analysis.verdict.verdict`) and checks that the file did not change meanwhile.
:class:`Inspection` carries all of it; :meth:`Inspection.to_json` is ``inspect --json``'s object, the same for
every caller, and :meth:`Inspection.to_text` its text and Markdown.

Failures the user must read are :class:`kvscope.core.errors.InputError` (missing, special or
unreadable file; a file that changed while it was read). A file that is not a state file is no
failure: its inspection says so (``result.kind == "unknown"``, :attr:`Inspection.is_state`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.core.analysis.verdict import Verdict, verdict
from kvscope.core.errors import Cancelled, InputError
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.source import ByteSource, FileChangedError
from kvscope.core.textsafe import markdown_text, safe_text

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.analysis.consumers import ConsumerAnswer
    from kvscope.core.analysis.reuse import ReusePrediction
    from kvscope.core.analysis.stats import StatsReport
    from kvscope.core.model.profile import ModelProfile


@dataclass
class Inspection:
    """A state file as kvscope understands it: the parse, the model it was read with, the verdict,
    which layout generations load it (None: not asked) and the payload statistics (None: not asked)."""

    result: ParseResult
    profile: ModelProfile | None
    verdict: Verdict
    compatibility: list[GenCompat] | None = None
    stats: StatsReport | None = None
    stats_error: str | None = None  # why the statistics failed, where the caller kept going (keep_stats_error)

    @property
    def is_state(self) -> bool:
        """The bytes are a llama.cpp state of some kind (else the result says what they are not)."""
        return self.result.kind != "unknown"

    def not_state_reason(self) -> str:
        """Why the file is not a state file (for the one line a command prints)."""
        res = self.result
        return res.findings[0].message if res.findings else "not a llama.cpp state file"

    @property
    def values_scanned(self) -> bool:
        """The tensor values were scanned (:meth:`add_stats`): the verdict weighs NaN/Inf and zero rows."""
        return self.stats is not None

    def verdict_line(self) -> str:
        """The verdict's line, saying ``(values not scanned)`` in its title when the values were not scanned."""
        return self.verdict.line(self.values_scanned)

    def to_json(self, tree: bool = False, lazy: bool = False) -> dict[str, Any]:
        """``kvscope inspect --json``'s object: the parse, ``values_scanned`` (whether the verdict weighed the tensor
        values), ``verdict``, ``compatibility`` and, with statistics (``stats``, inspect's default), the findings
        they added.
        ``lazy``: big arrays as :class:`~kvscope.core.jsonout.JsonArray` pieces, for
        :func:`~kvscope.core.jsonout.write_json`."""
        from kvscope.core.reader.render import result_to_json

        out = result_to_json(self.result, self.profile, tree=tree, lazy=lazy)
        out["values_scanned"] = self.values_scanned
        out["verdict"] = self.verdict.to_json()
        if self.compatibility is not None:
            out["compatibility"] = [c.to_json() for c in self.compatibility]
        if self.is_state:
            out["releases"] = self.releases()
        if self.stats is not None:
            out["stats"] = self.stats.to_json()
            out["findings"] = [f.to_json() for f in self.result.findings]
        if self.is_state:
            out["reuse_prediction"] = [e.to_json() for e in self.reuse_prediction()]
            out["consumers"] = [a.to_json() for a in self.consumers()]
        return out

    def releases(self) -> dict[str, Any]:
        """``to_json``'s ``releases``: the release ranges that write the file and those that load it
        (:func:`kvscope.core.analysis.release_answers.releases_json`; ``loads_in`` None without the compatibility)."""
        from kvscope.core.analysis.release_answers import releases_json

        return releases_json(self.result, self.compatibility, self.profile)

    def releases_line(self) -> str:
        """The one line: ``written by b10644–b11401 (2026-08-27 → 10-05); loads in …``."""
        from kvscope.core.analysis.release_answers import releases_line

        return releases_line(self.releases())

    def add_stats(self, data: Any = None, threads: int | None = None) -> StatsReport:
        """Scan the payloads (``data``: the file's open source, else ``result.path`` is opened): their
        findings join the file's and the verdict is judged again. The pipeline's statistics step, for a
        caller that shows the parse before the statistics are in (the app's document); raises
        :class:`~kvscope.core.reader.source.FileChangedError` when the file changed."""
        from kvscope.core.analysis.stats import scan_stats

        self.stats = scan_stats(self.result, data=data, threads=threads)
        self.verdict = verdict(self.result, self.profile)
        return self.stats

    def compat_table(self, data: Any = None) -> list[GenCompat]:
        """Which layout generations load the file (``data`` as for :meth:`add_stats`), not stored: for a
        caller that sets :attr:`compatibility` itself (the app's document, on its GUI thread). It reads the
        file's error findings: after :meth:`add_stats` when both are wanted, as :func:`inspect_source`
        does, since an error the statistics find (non-finite values) changes the answers (a migration is
        no longer exact; a build loads the bad values, with a note)."""
        from kvscope.core.analysis.compat import compatibility

        return compatibility(self.result, self.profile, data=data) if self.is_state else []

    def add_compat(self, data: Any = None) -> list[GenCompat]:
        """:meth:`compat_table`, stored as :attr:`compatibility`."""
        self.compatibility = self.compat_table(data)
        return self.compatibility

    def consumers(self) -> list[ConsumerAnswer]:
        """What each consumer (llama.cpp builds, llama-server) does with the file, as ``to_json``'s
        ``consumers`` says (empty for a file that is not a state file)."""
        if not self.is_state:
            return []
        from kvscope.core.analysis.consumers import consumer_answers

        return consumer_answers(self.result, self.profile, self.compatibility)

    def reuse_prediction(self) -> list[ReusePrediction]:
        """What each pinned llama-server (``--swa-full`` off and on) does with the slot on a prompt that
        continues it (:mod:`kvscope.core.analysis.reuse`); empty for a file that is not a slot file."""
        if self.result.kind != "seq_file":
            return []
        from kvscope.core.analysis.reuse import predict_reuse

        return predict_reuse(self.result, self.profile, self.compatibility)

    def to_text(self, markdown: bool = False) -> str:
        """``kvscope inspect``'s text (``markdown``: its Markdown): the summary with the verdict under
        its first line (``(values not scanned)`` in it without the statistics), then which builds load it
        and the statistics, where they were asked for."""
        from kvscope.core.reader.render import result_to_text

        text = result_to_text(self.result, self.profile, markdown=markdown)
        head, _, rest = text.partition("\n")
        esc = markdown_text if markdown else safe_text  # the verdict may quote the file (a finding's message)
        text = f"{head}\n\n{'**verdict**' if markdown else 'verdict:'} {esc(self.verdict_line())}\n"
        if self.is_state:
            text += f"{'**releases**' if markdown else 'releases:'} {esc(self.releases_line())}\n"
        text += rest
        if self.compatibility:
            from kvscope.core.analysis.compat import compat_text

            text += "\n" + ("## " if markdown else "") + "compatibility (which llama.cpp layouts load it)\n"
            text += "\n".join(compat_text(self.compatibility)) + "\n"
        reuse = self.reuse_prediction() if self.is_state else []
        if reuse:
            text += "\n" + ("## " if markdown else "") + "llama-server reuse (a prompt that continues the slot)\n"
            text += "\n".join(("- " if markdown else "  ") + esc(e.line()) for e in reuse) + "\n"
        if self.stats is not None:
            text += "\n" + self.stats.to_text(markdown=markdown)
        return text


def open_state(path: str | os.PathLike[str]) -> ByteSource:
    """``path`` opened read-only for the reader; :class:`InputError` when it is missing, a folder,
    not a regular file (a FIFO cannot block the open) or unreadable."""
    name = os.fspath(path)
    if not os.path.lexists(name):
        raise InputError(f"{name}: no such file")
    if os.path.isdir(name):
        raise InputError(f"{name}: is a directory")
    try:
        return ByteSource.open(name)
    except OSError as e:
        raise InputError(f"cannot open {name}: {e.strerror or e}") from None
    except ValueError as e:  # not a regular file (a FIFO, a device, a socket)
        raise InputError(f"{name}: {e}") from None


def inspect_source(src: ByteSource, profile: ModelProfile | None = None, *, kind: str | None = None,
                   layout: str | None = None, stats: bool = False, compat: bool = True,
                   threads: int | None = None, keep_stats_error: bool = False) -> Inspection:
    """The inspection of the bytes ``src`` holds (see the module docstring); a file that changes
    meanwhile raises :class:`~kvscope.core.reader.source.FileChangedError`. ``layout`` names a
    generation to force (:class:`InputError` for an unknown name); ``threads``: the statistics'.
    ``keep_stats_error``: a statistics scan that fails (but for the file changing) leaves ``stats`` None
    and its first line in :attr:`Inspection.stats_error`, and the inspection goes on (the report: one
    without statistics beats none); else it raises."""
    from kvscope.core.reader.parse import read_state

    try:
        res = read_state(src, profile=profile, kind=kind, layout=layout)
    except ValueError as e:  # an unknown --layout name
        raise InputError(str(e)) from None
    src.check()
    found = Inspection(res, profile, verdict(res, profile))
    if found.is_state:
        if stats:
            try:
                found.add_stats(src, threads)
            except (FileChangedError, Cancelled):
                raise
            except Exception as e:
                if not keep_stats_error:
                    raise
                found.stats_error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if compat:
            found.add_compat(src)
        src.check()
    return found


def inspect_file(path: str | os.PathLike[str], profile: ModelProfile | None = None, *, kind: str | None = None,
                 layout: str | None = None, stats: bool = False, compat: bool = True,
                 threads: int | None = None, keep_stats_error: bool = False) -> Inspection:
    """:func:`inspect_source` of the file at ``path``, opened and closed here; a file that changed while
    it was read is an :class:`InputError` naming it."""
    src = open_state(path)
    try:
        return inspect_source(src, profile, kind=kind, layout=layout, stats=stats, compat=compat, threads=threads,
                              keep_stats_error=keep_stats_error)
    except FileChangedError as e:
        raise InputError(f"{os.fspath(path)}: {e}") from None
    finally:
        src.close()
