"""The reuse measurement reads llama-server's log only once the task has logged its end.

llama-server answers a completion before the slot logs ``stop processing``, and writes its log from a
worker thread: read at once on a busy machine, the task's reason line ("forcing full prompt
re-processing ...") was sometimes not in the file yet (the full suite failed on it once in two runs).
"""

from __future__ import annotations

import time

from kvscope.core.verify.reuse_measure import last_task_id, log_reason, settled_log

LAUNCH = "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0"
REASON = ("slot update_slots: id  0 | task 7 | forcing full prompt re-processing due to lack of cache data "
          "(likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194)")
DONE = "slot      release: id  0 | task 7 | stop processing: n_tokens = 10, truncated = 0"


class GrowingLog:
    """A log that gets one more line each time it is read (as a lagging writer would)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.reads = lines, 0

    def __call__(self, n: int) -> list[str]:
        self.reads += 1
        return self.lines[: self.reads][-n:]


EARLIER = [LAUNCH.replace("task 7", "task 6"), DONE.replace("task 7", "task 6")]


def test_the_log_is_read_until_the_task_has_ended() -> None:
    assert last_task_id(EARLIER) == 6 and last_task_id(["no task here"]) == -1
    log = GrowingLog([*EARLIER, "srv  log_server_r: request: POST /completion", LAUNCH, REASON, DONE, "later"])
    lines = settled_log(log, 0, after=6)  # the earlier task's end does not count: the log lags behind
    assert lines[-1] == DONE and log.reads == 6
    assert log_reason(lines, 7) is not None and log_reason(lines, 7).startswith("forcing full prompt")


def test_another_slots_end_does_not_count() -> None:
    other = DONE.replace("id  0", "id  1")
    log = GrowingLog([LAUNCH, other, REASON, DONE])
    assert settled_log(log, 0, after=6)[-1] == DONE and log.reads == 4


def test_a_log_that_never_shows_the_end_is_taken_as_it_is_after_the_wait() -> None:
    t0 = time.monotonic()
    lines = settled_log(lambda n: [LAUNCH, REASON], 0, after=6, wait_s=0.2)
    assert lines == [LAUNCH, REASON] and 0.2 <= time.monotonic() - t0 < 2.0
    assert settled_log(lambda n: [], 0, wait_s=0.05) == []
    assert settled_log(lambda n: EARLIER, 0, after=6, wait_s=0.05) == EARLIER
