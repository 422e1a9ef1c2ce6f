"""A report's pictures and its HTML page, and the app's File → Export report (Qt).

What a report says (its data, Markdown, JSON, the atomic write) is the core's
(:mod:`kvscope.core.report`). Here:

* :func:`~kvscope.app.report.images.render_images` (GUI thread): the pictures, drawn by the same
  view classes the app shows (byte map, cell map, per-layer statistics, layer heatmaps) plus the
  lab matrix, encoded as PNG bytes (:mod:`~kvscope.app.report.figures`, :mod:`~kvscope.app.report.snapshot`).
* :func:`~kvscope.app.report.html_page.render_html`: ``report.html``, one page with the pictures in it.
* :func:`~kvscope.app.report.builder.build_report`: collect, draw, write in a row (the command line).
* :mod:`~kvscope.app.report.export`: File → Export report, the heavy steps off the GUI thread.
"""
