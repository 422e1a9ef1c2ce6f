"""The Overview, the page every file opens on: the verdict first, then what the file is.

It renders :func:`kvscope.core.overview.build_overview` (the same object the report starts with):
the verdict in one line with its reason, the top findings and the missing bytes as links that
select their bytes in the shared selection (and bring the hex view up), what the file is (kind,
the llama.cpp API that writes it, layout generation with confidence and runners-up, model and
whether it fits, sequences, sections), which llama.cpp generations load it, and the result of
``kvscope verify`` once one is given (:meth:`Document.set_verify`), "not verified" until then.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from kvscope.app.base.theme import SEVERITY_COLORS, Theme, verdict_color
from kvscope.app.document.document import Document
from kvscope.core.findings import Finding
from kvscope.core.overview import Overview, build_overview
from kvscope.core.verdict import Verdict, plural

STAGE_MARK = {"ok": "✔", "silent": "⚠", "header": "✘", "memory": "✘", "unknown": "?"}


class OverviewView(QWidget):
    """The overview page of one document; ``jumpRequested(view)`` asks the page to show a view."""

    jumpRequested = Signal(str)

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.theme = theme
        self.overview: Overview | None = None
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.browser.setOpenExternalLinks(False)
        self.browser.anchorClicked.connect(self._on_link)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.browser)
        for sig in (doc.loaded, doc.statsReady, doc.compatReady, doc.verifyChanged, doc.fileChanged):
            sig.connect(self.refresh)
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    # -- content ----------------------------------------------------------------------------------
    def refresh(self, *_args: object) -> None:
        res = self.doc.result
        if res is None:
            self.overview = None
            self.browser.setHtml(f"<p>Reading {escape(self.doc.name)}…</p>")
            return
        self.overview = build_overview(res, self.doc.profile, self.doc.compat, self.doc.verify, full_paths=True)
        self.browser.setHtml(self.html())

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
        if self.doc.changed:
            parts.append(f'<p><b>The file changed on disk:</b> {escape(self.doc.changed)}. What is shown is the file '
                         'as it was read; reload it to see the new bytes.</p>')
        parts += self._findings_html(v, dark)
        parts.append("<h3>What it is</h3>")
        rows = [("file", f"{escape(ov.file)} ({ov.size:,} bytes)"),
                ("kind", escape(f"{ov.kind_title} ({ov.kind})")),
                ("written by", f"<code>{escape(ov.writer)}</code>"),
                ("layout", escape(ov.layout_line())),
                ("model", self._model_html(ov, dark)),
                ("tokens", plural(ov.tokens, "token") if ov.tokens else "none stored"),
                ("sequences", "<br>".join(escape(s.text()) for s in ov.sequences) or "no cells"),
                ("sections", "<br>".join(escape(s.text()) for s in ov.sections) or "none")]
        parts.append(_table(rows))
        parts.append("<h3>Which llama.cpp builds load it</h3>")
        parts.append(self._compat_html(ov, dark))
        parts.append("<h3>Verification</h3>")
        parts.append("<p>" + "<br>".join(escape(line) for line in ov.verify_lines()) + "</p>")
        return "".join(parts)

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
                       f"{escape(f.message)}</li>")
        out.append("</ul>")
        if len(res.findings) > len(v.top_findings):
            out.append('<p><a href="view:findings">All findings…</a></p>')
        return out

    @staticmethod
    def _model_html(ov: Overview, dark: bool) -> str:
        text = escape(ov.model)
        if ov.model_fits is None:
            return f"{text}: {escape(ov.model_note)}"
        col = verdict_color("healthy" if ov.model_fits else "damaged", dark).name()
        return f'{text}: <span style="color:{col}">{escape(ov.model_note)}</span>'

    def _compat_html(self, ov: Overview, dark: bool) -> str:
        if ov.compat is None:
            why = self.doc.compat_error
            return f"<p>{escape('not known: ' + why) if why else 'working it out…'}</p>"
        if not ov.compat:
            return "<p>none: not a state file of a known layout</p>"
        lines = ov.compat_lines()
        items = []
        for c, line in zip(ov.compat, lines, strict=True):
            level = "healthy" if c.loads else ("suspicious" if c.stage in ("silent", "unknown") else "damaged")
            col = verdict_color(level, dark).name()
            items.append(f'<li><span style="color:{col}">{STAGE_MARK.get(c.stage, "?")}</span> {escape(line)}</li>')
        loads = ov.loads_in()
        head = (f"<p>Loads as it is in: <b>{escape(', '.join(loads))}</b></p>" if loads
                else "<p><b>No llama.cpp generation loads it as it is.</b></p>")
        return head + "<ul>" + "".join(items) + "</ul>"

    # -- links ------------------------------------------------------------------------------------
    def _on_link(self, url: QUrl) -> None:
        self.follow(url.toString())

    def follow(self, link: str) -> bool:
        """Act on an overview link (``finding:N``, ``missing:``, ``view:NAME``); True when it did something."""
        scheme, _, arg = link.partition(":")
        doc, idx, res = self.doc, self.doc.index, self.doc.result
        if idx is None or res is None:
            return False
        if scheme == "view" and arg:
            self.jumpRequested.emit(arg)
            return True
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
