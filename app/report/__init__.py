"""Reports: one state file as a self-contained HTML page, a Markdown page, JSON and PNG pictures.

``kvscope report`` and the app's File → Export report share this package. A report is built in
three steps, so the app can keep the heavy work off the GUI thread:

1. :func:`~kvscope.app.report.collect.collect` (no Qt, any thread): parse, payload statistics,
   the optional diff and lab run, the ``inspect --json`` object.
2. :func:`~kvscope.app.report.images.render_images` (GUI thread): the pictures, drawn by the
   same view classes the app shows (byte map, cell map, per-layer statistics, layer heatmaps)
   plus the lab matrix, encoded as PNG bytes.
3. :func:`~kvscope.app.report.writer.write_report` (no Qt, any thread): ``report.html``,
   ``report.md``, ``report.json`` and the PNGs, written into a temporary folder next to the
   destination and renamed into place (an existing report is replaced only once the new one is
   complete).

:func:`~kvscope.app.report.builder.build_report` runs the three in a row (the command line).
"""
