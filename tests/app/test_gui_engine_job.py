"""Verify and Repair are one job model in the app (issue #30 item 6): the document's ``verify_run`` and
``repair_run`` are both :class:`~kvscope.app.document.engine_job.EngineJob`, with one progress signal, one
Cancel and one outcome path; a progress tick updates the Overview's progress strip only (the page is rendered
when a run starts and when its outcome arrives, not once per tick); and Cancel of work in a child process
stops the command and what it started in its process group. The real engine runs are in
test_gui_engine_job_engine.py."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from typing import Any

from kvscope.app.base.tasks import CancelToken, Report
from kvscope.app.document.engine_job import EngineJob, run_command
from kvscope.app.document.repair_job import RepairRun
from tests.support.gui_helpers import LAB, count_page_renders

CLEAN = LAB / "seq0.clean.seqdata.bin"
TICKS = 120


def _pids_with(marker: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if marker in fh.read().decode("utf-8", "replace"):
                        out.append(int(pid))
            except OSError:
                continue
    return out


def test_verify_and_repair_are_runs_of_the_one_job_class(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(CLEAN, "llama")
    doc = w.doc
    assert type(doc.verify_run) is EngineJob and isinstance(doc.repair_run, EngineJob)
    assert type(doc.repair_run) is RepairRun and RepairRun.__mro__[1] is EngineJob
    assert w.overview.repair is doc.repair_run  # the Overview shows the document's run, not one of its own
    assert w.overview.verify_strip.job is doc.verify_run
    # one signal set: the view listens to the same names on both
    for name in ("changed", "progressed", "succeeded", "failed", "stopped"):
        assert getattr(type(doc.verify_run), name) is getattr(type(doc.repair_run), name)


def test_progress_ticks_update_the_strip_and_the_page_is_rendered_only_at_start_and_end(
        qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    """A run of ``TICKS`` progress ticks through the document's Verify job: the Overview's page is set once
    when it starts and once when its result arrives; the strip above it shows each tick."""
    w = open_doc(CLEAN, "llama")
    doc, ov = w.doc, w.overview
    sets = count_page_renders(w)
    renders0 = ov.renders
    release = threading.Event()
    result = {"verdict": "ok", "engine": {"kind": "llama.cpp", "build": "b11434"}, "reasons": ["all 4 records match"],
              "records": []}  # the --json object's shape, as test_gui_overview.py gives set_verify

    def work(token: CancelToken, report: Report) -> dict[str, Any]:
        for i in range(TICKS):
            token.check()
            report(i / TICKS, f"step {i}")
            time.sleep(0.002)
        release.wait(10)
        return result

    strip_updates0 = ov.verify_strip.updates
    doc.verify_run.submit("verify test", work, step="starting llama.cpp")
    assert doc.verifying and ov.verify_strip.isVisible() and "Verifying…" in ov.verify_button.text()
    qtbot.waitUntil(lambda: doc.verify_run.ticks >= TICKS, timeout=20000)
    qtbot.wait(50)
    assert ov.verify_strip.label.text().endswith("99% · step 119"), ov.verify_strip.label.text()
    assert ov.verify_strip.bar.value() == 992
    during = len(sets)
    release.set()
    qtbot.waitUntil(lambda: not doc.verifying, timeout=10000)
    assert doc.verify == result and not ov.verify_strip.isVisible()
    assert "Verify: ok in llama.cpp b11434" in ov.browser.toPlainText()
    assert ov.verify_strip.updates - strip_updates0 >= TICKS
    # the page: once for the start, once for the result (before the change: once per tick, 122 here)
    assert during == 1, during
    assert len(sets) == 2 and ov.renders - renders0 == 2, (len(sets), ov.renders - renders0)


def test_cancel_through_the_job_stops_a_thread_and_the_ui_is_idle(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    """The core's cancellation of thread work: the token's hook (``Verifier.cancel`` for Verify) stops it."""
    w = open_doc(CLEAN, "llama")
    doc, ov = w.doc, w.overview
    stopped_by_hook = threading.Event()
    started = threading.Event()

    def work(token: CancelToken, report: Report) -> None:
        token.on_cancel(stopped_by_hook.set)
        started.set()
        report(None, "restoring")
        stopped_by_hook.wait(30)
        token.check()  # raises the core's Cancelled

    doc.verify_run.submit("verify test", work)
    assert started.wait(10)
    ov.verify_strip.cancel_button.click()  # the strip's Cancel: the shell's Cancel Verify
    qtbot.waitUntil(lambda: not doc.verifying, timeout=10000)
    assert stopped_by_hook.is_set() and doc.verify_run.cancelled and doc.verify is None
    assert doc.verify_step is None and not ov.verify_strip.isVisible() and ov.verify_button.text() == "Verify"


def test_cancel_of_a_command_stops_it_and_its_children(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    """Work in a child process (Repair's ``kvscope repair``): Cancel stops the command and whatever it started
    in its process group, even a child that ignores SIGINT and outlives it."""
    w = open_doc(CLEAN, "llama")
    run = w.doc.repair_run
    marker = f"kvscope-test-{uuid.uuid4().hex}"
    script = ("import signal, subprocess, sys, time\n"
              "subprocess.Popen(['sleep', '300'], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))\n"
              "print('started', flush=True)\n"
              "time.sleep(300)\n")

    def work(token: CancelToken, report: Report) -> None:
        run_command([sys.executable, "-c", script, marker], token, report, "sleeping", tick_s=0.2)

    run.submit("repair test", work)
    qtbot.waitUntil(lambda: len(_pids_with(marker)) == 1 and run.step is not None and "sleeping" in run.step[1],
                    timeout=20000)
    leader = _pids_with(marker)[0]
    pgid = os.getpgid(leader)
    assert pgid == leader  # a process group of its own
    qtbot.waitUntil(lambda: len(_group(pgid)) >= 2, timeout=10000)
    kids = [p for p in _group(pgid) if p != leader]
    assert kids
    w.overview.repair_banner.cancel_button.click()
    qtbot.waitUntil(lambda: not run.running, timeout=20000)
    assert run.cancelled and run.error is None and run.result is None
    qtbot.waitUntil(lambda: _group(pgid) == [], timeout=10000)  # the child that ignored SIGINT too
    assert not w.overview.repair_banner.cancel_button.isVisible()
    assert w.overview.repair_banner.label.text().startswith("Repair cancelled")


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(pid))
    return out
