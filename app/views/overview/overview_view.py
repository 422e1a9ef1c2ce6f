"""The Overview, the page every file opens on: the verdict first, then what the file is.

It renders :func:`kvscope.core.analysis.overview.build_overview` (the same object the report starts with):
the verdict in one line with its reason, the top findings and the missing bytes as links that
select their bytes in the shared selection (and bring the hex view up), what the file is (kind,
the llama.cpp API that writes it, layout generation with confidence and runners-up, model and
whether it fits, sequences, sections), which llama.cpp builds load it (per pinned build, libllama and
llama-server apart, predicted or measured by Verify: :mod:`~kvscope.app.views.overview.builds_html`), and
the result of ``kvscope verify`` (:mod:`~kvscope.app.views.overview.verify_html`): "not verified" with a link that runs
it, the run in progress with Cancel, why it could not run, or the result (a record's link shows it on
the Layers view). A damaged file (or one Verify finds diverging) has "Repair…" beside its verdict when it
can be rebuilt from its tokens (``kvscope repair``; why not, when it cannot): ``repairRequested`` asks the
window for the output file, the run (the document's :class:`~kvscope.app.document.repair_job.RepairRun`) shows
in the strip above the page with Cancel, and its outcome stays there (Open the repaired file, or the one line why
nothing was written). A state blob carries no tokens: a line under the verdict says so, with a link to give
the ones it was made of (``tokensRequested``: Tools → Tokens for this blob…), or how many were given, which
Verify re-prefills and Repair rebuilds from, with links to change or clear them. The overview object is
built once per parse (``sequences`` sorts every cell table) and only its compatibility, verification and
verdict are replaced as they come in. Verify and Repair are the document's
:class:`~kvscope.app.document.engine_job.EngineJob` runs: a progress tick updates only their strip above the
page (:class:`~kvscope.app.views.overview.job_strip.JobStrip`, :class:`RepairBanner`), and the page is
rendered again when a run starts and when its outcome arrives. Export saves the page as PNG.
"""

from __future__ import annotations

import os
from dataclasses import replace

from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QHBoxLayout, QPushButton, QTextBrowser, QVBoxLayout, QWidget

from kvscope.app.base.theme import SEVERITY_COLORS, VERIFY_LEVELS, Theme, verdict_color
from kvscope.app.document.document import Document
from kvscope.app.document.given_tokens import ACTION as TOKENS_ACTION
from kvscope.app.document.given_tokens import count_text
from kvscope.app.document.repair_job import RepairRun, repair_problem
from kvscope.app.document.verify_job import NEEDS_MODEL
from kvscope.app.document.verify_marks import verify_marks
from kvscope.app.views.export import doc_export_button
from kvscope.app.views.overview import builds_html, verify_html
from kvscope.app.views.overview.job_strip import JobStrip
from kvscope.app.views.overview.repair_banner import RepairBanner
from kvscope.core.analysis.measured import measured_message
from kvscope.core.analysis.overview import Overview, build_overview, slot_reuse
from kvscope.core.analysis.release_answers import release_ranges
from kvscope.core.analysis.verdict import Verdict, plural
from kvscope.core.findings import Finding
from kvscope.core.reader.records import ParseResult
from kvscope.core.textsafe import html_text as escape  # one visible line (bidi, controls escaped), then entities

VERIFY_BUTTON_TIP = ("restore the file in real llama.cpp, re-prefill its tokens (a blob's: those given with "
                     f"{TOKENS_ACTION}) and compare (Tools → Verify, Ctrl+Shift+V)")


class OverviewView(QWidget):
    """The overview page of one document; ``jumpRequested(view)`` asks the page to show a view,
    ``verifyRequested`` / ``cancelVerifyRequested`` the window to start or stop a verification,
    ``repairRequested`` the window to ask where to write a repair, ``openRequested(path)`` to open one,
    ``tokensRequested`` the window to ask for the tokens a blob was made of."""

    jumpRequested = Signal(str)
    verifyRequested = Signal()
    cancelVerifyRequested = Signal()
    repairRequested = Signal()
    openRequested = Signal(str)
    tokensRequested = Signal()
    export_name = "overview"

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.theme = theme
        self.overview: Overview | None = None
        self._base: tuple[ParseResult, object, Overview] | None = None  # built once per parse and model
        self.builds = 0  # how many times the overview object was built (tests: once per parse)
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.browser.setOpenExternalLinks(False)
        self.browser.anchorClicked.connect(self._on_link)
        self.verify_button = QPushButton("Verify")
        self.verify_button.setToolTip(VERIFY_BUTTON_TIP)
        self.verify_button.clicked.connect(self.verifyRequested)
        self.repair_button = QPushButton("Repair…")
        self.repair_button.clicked.connect(lambda: self.follow("repair:"))
        self.export_button = doc_export_button(self, doc)
        self.renders = 0  # how many times the page was rendered (tests: per run start and end, not per tick)
        self.repair: RepairRun = doc.repair_run
        self.repair_banner = RepairBanner(self.repair, theme)
        self.verify_strip = JobStrip(doc.verify_run, lambda: f"Verifying in {doc.verify_engine}",
                                     self.cancelVerifyRequested.emit, "stop the verification: the engine call in "
                                     "flight is killed and nothing is kept (Tools → Cancel Verify)")
        self.repair_banner.openRequested.connect(self.openRequested)
        self.repair.changed.connect(self.show_page)  # a run started or ended; its progress is the banner's
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addStretch(1)
        top.addWidget(self.repair_button)
        top.addWidget(self.verify_button)
        top.addWidget(self.export_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.repair_banner)
        lay.addWidget(self.verify_strip)
        lay.addWidget(self.browser, 1)
        for sig in (doc.loaded, doc.statsReady, doc.compatReady, doc.verifyChanged, doc.fileChanged, doc.tokensChanged):
            sig.connect(self.refresh)
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    # -- content ----------------------------------------------------------------------------------
    def _overview(self, res: ParseResult) -> Overview:
        """The overview of ``res``: built once per parse and model; then only what comes later is replaced."""
        doc = self.doc
        base = self._base
        if base is None or base[0] is not res or base[1] is not doc.profile:
            ov = build_overview(res, doc.profile, doc.compat, doc.verify, full_paths=True)
            self.builds += 1
            self._base = (res, doc.profile, ov)
            return ov
        consumers = doc.consumers()  # the inspection's (inspect --json's), as the report's; the reuse follows it
        return replace(base[2], compat=doc.compat, verify=doc.verify, verdict=doc.verdict() or base[2].verdict,
                       reuse=slot_reuse(res, doc.profile, doc.compat, consumers if doc.compat is not None else None),
                       consumers=consumers, releases=release_ranges(res, doc.compat, doc.profile))

    def refresh(self, *_args: object) -> None:
        res = self.doc.result
        if res is None:
            self.overview = None
            self._base = None
            self.browser.setHtml(f"<p>Reading {escape(self.doc.name)}…</p>")
            self.verify_button.setEnabled(False)
            self.repair_button.hide()
            return
        self.overview = self._overview(res)
        self.show_page()

    def show_page(self) -> None:
        """Render the page (the scroll position kept, so a run's start or end does not jump the page)."""
        doc = self.doc
        why = doc.verify_problem()  # the core's check, as kvscope verify's: disabled with the reason
        self.verify_button.setEnabled(not doc.verifying and self.overview is not None and why is None)
        self.verify_button.setText("Verifying…" if doc.verifying else "Verify")
        self.verify_button.setToolTip(VERIFY_BUTTON_TIP + (f": not now: {why}" if why else ""))
        if self.overview is None:
            return
        self._update_repair_button()
        bar = self.browser.verticalScrollBar()
        at = bar.value()
        self.renders += 1
        self.browser.setHtml(self.html())
        bar.setValue(at)

    @property
    def verdict(self) -> Verdict | None:
        return self.overview.verdict if self.overview is not None else None

    def html(self) -> str:
        ov = self.overview
        assert ov is not None
        dark = self.theme.dark
        v = ov.verdict
        color = verdict_color(v.level, dark).name()
        parts = [f'<h2 style="color:{color};margin-bottom:2px">{escape(v.title.upper())}</h2>',
                 f'<p style="font-size:large;margin-top:0">{escape(v.reason)}</p>']
        parts += self._repair_html()
        parts += self._tokens_html()
        if self.doc.verify:
            vcol = verdict_color(VERIFY_LEVELS.get(str(self.doc.verify.get("verdict")), "suspicious"), dark).name()
            stale = f" <i>({escape(self.doc.verify_stale)})</i>" if self.doc.verify_stale else ""
            parts.append(f'<p><a href="view:verify"><span style="color:{vcol}"><b>'
                         f"{escape(verify_html.summary_line(self.doc.verify))}</b></span></a>{stale}</p>")
        if self.doc.changed:
            parts.append(f'<p><b>The file changed on disk:</b> {escape(self.doc.changed)}. What is shown is the file '
                         'as it was read; reload it to see the new bytes.</p>')
        parts += self._findings_html(v, dark)
        parts.append("<h3>What it is</h3>")
        rows = [("file", f"{escape(ov.file)} ({ov.size:,} bytes)"),
                ("kind", escape(f"{ov.kind_title} ({ov.kind})")),
                ("written by", f"<code>{escape(ov.writer)}</code>"),
                ("layout", escape(ov.layout_line())),
                *([("releases", escape(ov.releases_line()))] if ov.releases_line() else []),
                ("model", self._model_html(ov, dark)),
                ("tokens", plural(ov.tokens, "token") if ov.tokens else "none stored" + (
                    f"; {escape(count_text(self.doc.given_tokens))} given ({escape(TOKENS_ACTION)})"
                    if self.doc.given_tokens is not None else "")),
                ("sequences", "<br>".join(escape(s.text()) for s in ov.sequences) or "no cells"),
                ("sections", "<br>".join(escape(s.text()) for s in ov.sections) or "none"),
                ("cache types", "<br>".join(escape(t) for t in ov.cache_types) or "no records"),
                ("rotation", "<br>".join(escape(t) for t in ov.rotation) or "no KV records")]
        parts.append(_table(rows))
        parts.append('<h3><a name="builds"></a>Which llama.cpp builds load it</h3>')
        parts.append(builds_html.section_html(ov, dark, self.doc.compat_error))
        if ov.reuse:  # a slot file: what llama-server will reuse of it (a Verify's measurement replaces its line)
            parts.append("<h3>Will llama-server reuse it</h3>")
            parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in ov.reuse_lines()) + "</ul>")
        parts.append('<h3><a name="verify"></a>Verification</h3>')
        parts.append(self._verify_html(dark))
        return "".join(parts)

    def _verify_html(self, dark: bool) -> str:
        doc = self.doc
        if doc.verifying:
            return verify_html.running_html(doc.verify_engine)
        if doc.verify_error:
            return verify_html.error_html(doc.verify_engine, doc.verify_error, dark)
        if doc.verify:
            stale = ""
            if doc.verify_stale:
                col = verdict_color("suspicious", dark).name()
                stale = (f'<p><span style="color:{col}"><b>Not the last run:</b></span> {escape(doc.verify_stale)}. '
                         '<a href="verify:">Verify again</a></p>')
            return stale + verify_html.result_html(doc.verify, dark)
        engine = doc.verify_engine or "the engine of the settings"
        why = NEEDS_MODEL if doc.profile is None else doc.verify_problem()
        return verify_html.not_verified_html(engine, why is None, f"Verify: not possible: {why}"
                                             if why is not None and why != NEEDS_MODEL else why or "")

    def _findings_html(self, v: Verdict, dark: bool) -> list[str]:
        res = self.doc.result
        assert res is not None
        out = []
        if v.missing is not None:
            m = v.missing
            names = ", ".join(r.name for r in m.records[:8]) + (" …" if len(m.records) > 8 else "")
            out.append(f'<p><a href="missing:">Missing bytes</a>: {escape(m.text())}'
                       + (f" — {escape(names)}" if names else "") + "</p>")
        if not res.findings:
            out.append("<p>No findings.</p>")
            return out
        out.append(f"<h3>Top findings <small>(of {plural(len(res.findings), 'finding')})</small></h3><ul>")
        for f in v.top_findings:
            i = next((k for k, g in enumerate(res.findings) if g is f), -1)
            col = _severity_color(f, dark)
            out.append(f'<li><span style="color:{col}"><b>{escape(f.severity)}</b></span> '
                       f'<code>{escape(f.code)}</code> <a href="finding:{i}">@{f.offset:,} (+{f.length:,})</a>: '
                       f"{escape(measured_message(f, self.doc.verify) or f.message)}</li>")
        out.append("</ul>")
        if len(res.findings) > len(v.top_findings):
            out.append('<p><a href="view:findings">All findings…</a></p>')
        return out

    @staticmethod
    def _model_html(ov: Overview, dark: bool) -> str:
        text = escape(ov.model)
        if ov.model_fits is None:
            if ov.model_note.startswith("not certain"):
                col = verdict_color("suspicious", dark).name()
                return f'{text}: <span style="color:{col}">{escape(ov.model_note)}</span>'
            return f"{text}: {escape(ov.model_note)}"
        col = verdict_color("healthy" if ov.model_fits else "damaged", dark).name()
        return f'{text}: <span style="color:{col}">{escape(ov.model_note)}</span>'

    # -- repair -----------------------------------------------------------------------------------
    def damaged(self) -> bool:
        """The verdict is damaged, or the last Verify found the file damaged or diverging."""
        v = self.verdict
        verified = VERIFY_LEVELS.get(str((self.doc.verify or {}).get("verdict")))
        return (v is not None and v.level == "damaged") or verified == "damaged"

    def repair_problem(self) -> str | None:
        """Why the file cannot be repaired now (one line), None when it can."""
        if self.repair.running:
            return "a repair of this file is running"
        if self.doc.changed:
            return "the file changed on disk: reload it first"
        return repair_problem(self.doc.result, self.doc.profile, self.doc.model_path, self.doc.given_tokens)

    def _source(self) -> str:
        """Whose tokens a repair rebuilds from: ``the file's own tokens``, ``the 12 tokens given``."""
        given = self.doc.given_tokens
        return f"the {escape(count_text(given))} given" if given is not None else "the file's own tokens"

    def _update_repair_button(self) -> None:
        """Shown beside Verify while the file is damaged; enabled when it can be repaired (the tooltip says why not)."""
        why = self.repair_problem()
        self.repair_button.setVisible(self.damaged() or self.repair.running)
        self.repair_button.setEnabled(why is None)
        self.repair_button.setText("Repairing…" if self.repair.running else "Repair…")
        self.repair_button.setToolTip("rebuild the state from the file's own tokens (a blob's: those given with "
                                      f"{TOKENS_ACTION}) in real llama.cpp, verify it and write it to a new file "
                                      "(Tools → Repair…)" + (f": not now: {why}" if why else ""))

    def _repair_html(self) -> list[str]:
        if not self.damaged() or self.repair.running:
            return []
        why = self.repair_problem()
        if why is None:
            return [f'<p><a href="repair:"><b>Repair…</b></a> rebuilds the state from {self._source()} in '
                    "real llama.cpp, verifies it and writes it to a new file (the input is never changed).</p>"]
        return [f"<p>Repair: not possible: {escape(why)}</p>"]

    def _tokens_html(self) -> list[str]:
        """A blob without tokens: the tokens given for it (Verify and Repair re-prefill them), or how to give them."""
        doc = self.doc
        if not doc.takes_tokens():
            return []
        busy = doc.verifying or self.repair.running
        given = doc.given_tokens
        if given is None:
            link = "give the tokens it was made of" if busy else '<a href="tokens:">give the tokens it was made of…</a>'
            return [f"<p>This blob carries no tokens: Verify only restores it and Repair cannot rebuild it; {link} "
                    f"({escape(TOKENS_ACTION)}).</p>"]
        text = doc.given_tokens_text
        origin = f" from {escape(os.path.basename(text[1:].strip()))}" if text.startswith("@") else ""
        links = "" if busy else ' · <a href="tokens:">Change…</a> · <a href="tokens-clear:">Clear</a>'
        return [f"<p><b>{escape(count_text(given))} given</b>{origin} ({escape(TOKENS_ACTION)}): Verify re-prefills "
                f"them and Repair rebuilds from them{links}</p>"]

    # -- links ------------------------------------------------------------------------------------
    def _on_link(self, url: QUrl) -> None:
        self.follow(url.toString())

    def follow(self, link: str) -> bool:
        """Act on an overview link (``finding:N``, ``missing:``, ``view:NAME``); True when it did something."""
        scheme, _, arg = link.partition(":")
        doc, idx, res = self.doc, self.doc.index, self.doc.result
        if idx is None or res is None:
            return False
        if scheme == "verify":
            self.verifyRequested.emit()
            return True
        if scheme == "cancel-verify":
            self.cancelVerifyRequested.emit()
            return True
        if scheme == "repair":
            if self.repair_problem() is None:
                self.repairRequested.emit()
                return True
            return False
        if scheme == "tokens" and doc.takes_tokens():
            self.tokensRequested.emit()
            return True
        if scheme == "tokens-clear" and doc.given_tokens is not None:
            try:
                doc.set_given_tokens(None)
            except ValueError as e:
                doc.message.emit(f"{doc.name}: {e}")
                return False
            return True
        if scheme == "view" and arg == "verify":
            self.browser.scrollToAnchor("verify")
            return True
        if scheme == "view" and arg:
            self.jumpRequested.emit(arg)
            return True
        if scheme == "vrec" and arg.isdigit():
            return self._show_record(int(arg))
        f: Finding | None = None
        if scheme == "finding" and arg.isdigit() and int(arg) < len(res.findings):
            f = res.findings[int(arg)]
        elif scheme == "missing" and self.verdict is not None and self.verdict.missing is not None:
            f = self.verdict.missing.finding
        if f is None:
            return False
        doc.bus.select(idx.for_finding(f), origin=self)
        self.jumpRequested.emit("hex")
        return True

    def _show_record(self, i: int) -> bool:
        """Select the file's record of verify entry ``i`` (its layer when the file lacks it) on the Layers view."""
        doc, idx = self.doc, self.doc.index
        marks = verify_marks(doc.result, doc.verify)
        if idx is None or not 0 <= i < len(marks):
            return False
        m = marks[i]
        rec = m.record
        if rec is None:  # missing: the file's record of that role nearest the layer, where the strip marks it
            near = [r for si, _, st, r in idx.records if si == m.section_index and r.role == m.role
                    and (st.index if st is not None else None) == m.stream]
            rec = min(near, key=lambda r: abs((r.il if r.il is not None else r.index) - m.x), default=None)
        if rec is None:
            return False
        doc.bus.select(idx.for_record(rec), origin=self)
        self.jumpRequested.emit("layers")
        return True

    def export_widget(self) -> QWidget:
        return self.browser

    def finding_links(self) -> list[str]:
        """The links of the top findings, in the order shown."""
        res = self.doc.result
        if res is None or self.verdict is None:
            return []
        return [f"finding:{next(k for k, g in enumerate(res.findings) if g is f)}" for f in self.verdict.top_findings]


def _severity_color(f: Finding, dark: bool) -> str:
    if dark:
        return {"error": "#ff7b7b", "warning": "#ffb454"}.get(f.severity, "#8ab8ff")
    return SEVERITY_COLORS.get(f.severity, "#505050")


def _table(rows: list[tuple[str, str]]) -> str:
    """Rows of (label, HTML) as a two-column table."""
    body = "".join(f'<tr><td style="padding-right:14px;vertical-align:top"><b>{escape(k)}</b></td>'
                   f"<td>{v}</td></tr>" for k, v in rows)
    return f'<table cellspacing="0" cellpadding="2">{body}</table>'
