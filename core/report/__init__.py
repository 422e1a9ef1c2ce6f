"""Reports: what a report of one state file says, as Markdown and JSON (no Qt).

``kvscope report`` and the app's File → Export report share this package; the pictures and the HTML
page are the Qt layer's (:mod:`kvscope.app.report`). A report is built in three steps, so the app can
keep the heavy work off the GUI thread:

1. :func:`~kvscope.core.report.collect.collect` (any thread): parse, payload statistics, the
   optional diff and lab run, the ``inspect --json`` object.
2. the pictures (:mod:`kvscope.app.report.images`, Qt, GUI thread): byte map, cell maps,
   per-layer statistics, layer heatmaps, the lab matrix, as PNG bytes.
3. :func:`~kvscope.core.report.writer.write_report` (any thread): ``report.md``, ``report.json``,
   the PNGs and ``report.html`` (:mod:`kvscope.app.report.html_page`, when given), written into a
   temporary folder next to the destination and renamed into place (an existing report is replaced
   only once the new one is complete).
"""
