"""GUI responsiveness on a big state: the longest GUI-thread stall while it opens and is browsed.

Writes a synthetic sequence file (``bench_reader``'s writer: 131,072 cells by default), opens it
in the app (offscreen), switches through every view while the background parse and statistics
run, and records the gaps between ticks of a 10 ms QTimer on the GUI thread. It prints the time
until tree, byte map and findings are shown (goal ≤ 1 s for a 2 GiB file) and the worst stall
per view, as a ratio to the timer period measured in the same run (goal: no stall over 100 ms), and
the time until the Overview (the page a file opens on) is first painted with its verdict (goal ≤ 1 s
for a 2 GiB file).

Usage::

    .venv/bin/python bench/bench_gui.py                 # ~1 GiB, 131,072 cells
    .venv/bin/python bench/bench_gui.py --size-gib 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench_reader import choose_layout, write_state  # noqa: E402

VIEWS = ("hex", "cells", "layers", "tokens", "findings", "diff", "lab")
TICK_MS = 10


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--cells", type=int, default=131_072)
    ap.add_argument("--dwell", type=float, default=1.5, help="seconds on each view")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args(argv)

    from PySide6.QtCore import QEvent, QObject, QTimer

    import kvscope.core.diff
    import kvscope.core.reader.parse
    import kvscope.core.stats  # noqa: F401  (imported before the clock starts, as a running app has them)
    from kvscope.app.base.application import ensure_app
    from kvscope.app.shell.main_window import MainWindow

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "big.seqstate"
        lay = choose_layout(int(args.size_gib * (1 << 30)), args.cells, 8, False)
        write_state(path, lay, seed=1)
        size = path.stat().st_size
        app = ensure_app()
        win = MainWindow()
        win.resize(1400, 900)
        win.show()
        ticks: list[float] = []
        timer = QTimer()
        timer.setInterval(TICK_MS)
        timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
        timer.start()
        marks: list[tuple[str, float]] = []
        shown: dict[str, float] = {}
        t0 = time.perf_counter()
        w = win.open_file(str(path))
        assert w is not None
        w.doc.loaded.connect(lambda: shown.setdefault("loaded", time.perf_counter() - t0))

        class FirstPaint(QObject):
            """Notes the first paint of the overview once it shows a verdict."""

            def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802
                if event.type() == QEvent.Type.Paint and w.overview.verdict is not None:
                    shown.setdefault("overview", time.perf_counter() - t0)
                return False

        painted = FirstPaint()
        w.overview.browser.viewport().installEventFilter(painted)
        step = int(args.dwell * 1000)

        def switch(i: int) -> None:
            if i < len(VIEWS):
                w.show_view(VIEWS[i])
                marks.append((VIEWS[i], time.perf_counter()))
                QTimer.singleShot(step, lambda: switch(i + 1))
            else:
                marks.append(("end", time.perf_counter()))
                app.quit()

        marks.append(("open", t0))
        QTimer.singleShot(step, lambda: switch(0))
        app.exec()
        timer.stop()

    gaps = [(b - a, b) for a, b in zip(ticks, ticks[1:], strict=False)]
    first = 1000 * shown.get("overview", float("nan"))
    print(f"overview (verdict) first painted after {first:.0f} ms (goal <= 1000 ms for 2 GiB) -> "
          + ("PASS" if first <= 1000 else "MISS"))
    print(f"file: {size / (1 << 20):,.0f} MiB, {lay.cells:,} cells; tree, byte map and findings shown after "
          f"{1000 * shown.get('loaded', float('nan')):.0f} ms (goal <= 1000 ms for 2 GiB)")
    print(f"{'phase':10s} {'worst stall':>12s} {'timer period':>13s} {'ratio':>7s}  goal <= 100 ms")
    worst_all = 0.0
    for (name, start), (_, end) in zip(marks, marks[1:], strict=False):
        inside = [g for g, at in gaps if start <= at < end]
        worst = max(inside, default=0.0)
        worst_all = max(worst_all, worst)
        print(f"{name:10s} {1000 * worst:10.0f} ms {TICK_MS:10d} ms {worst * 1000 / TICK_MS:6.1f}x  "
              + ("PASS" if worst <= 0.1 else "MISS"))
    print(f"worst GUI-thread stall: {1000 * worst_all:.0f} ms -> {'PASS' if worst_all <= 0.1 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
