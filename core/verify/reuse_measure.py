"""Does llama-server reuse a restored slot? The measurement, in the server's own accounting.

After ``/slots/N?action=restore``, a completion whose prompt is the slot's own tokens plus a short
continuation is the request a client resuming the slot sends. Its answer says what the server did:
``timings.cache_n`` tokens were taken from the slot, ``timings.prompt_n`` were computed.
:func:`reuse_from_completion` reads them, and the server's log lines for that request where kvscope
started the server (with ``-lv 4`` the server names its reason: "forcing full prompt re-processing
due to lack of cache data ...", "restored context checkpoint ..."); for a server the user runs,
whose log kvscope cannot read, the reason is the numbers'. :func:`measure_reuse` sends that
request itself. The prediction it is checked against is :mod:`kvscope.core.analysis.reuse`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvscope.core.engine.session import ServerClient, ServerError
from kvscope.core.textsafe import safe_text

# the server's log lines that explain a prompt's cache decision (their level: TRC needs -lv 4, INF does not)
_REASON_RES = (
    re.compile(r"(forcing full prompt re-processing due to lack of cache data[^(]*(\([^)]*\))?)"),
    re.compile(r"(restored context checkpoint \([^)]*\))"),
    re.compile(r"(cache reuse is not supported[^\n]*)"),
    re.compile(r"(need to evaluate at least 1 token[^\n]*)"),
)
_CACHED_RE = re.compile(r"cached n_tokens = (\d+)")
_TASK_RE = re.compile(r"\| task (\d+) \|")
_LAUNCH_RE = re.compile(r"id +(\d+) \| task (\d+) \| processing task")
_LINK_RE = re.compile(r",? see https?://\S+?(?=\))")
_DONE_RE = re.compile(r"id +(\d+) \| task (\d+) \| stop processing")
SETTLE_S = 3.0  # how long the log may lag behind the answer (llama.cpp writes it from a worker thread)


@dataclass
class ReuseMeasurement:
    """What the server did with the restored slot on a prompt that continues it."""

    restored_tokens: int
    reused_tokens: int
    reprocessed_tokens: int  # of the restored tokens, computed again
    reason: str
    prompt_tokens: int  # the request's prompt: the slot's tokens plus the continuation
    processed_tokens: int  # timings.prompt_n: every prompt token the server computed
    reason_from_log: bool = False  # the reason is the server's own log line

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        if self.restored_tokens and self.reused_tokens == 0:
            return (f"restores, but llama-server re-processes all {self.restored_tokens} tokens "
                    f"({self.processed_tokens} with the continuation): {self.reason}")
        return f"llama-server reuses {self.reused_tokens} of {self.restored_tokens} restored tokens: {self.reason}"


def _task_lines(log: list[str], id_task: int | None) -> list[str]:
    if id_task is None:
        return log
    return [ln for ln in log if (m := _TASK_RE.search(ln)) and int(m.group(1)) == id_task]


def last_task(log: list[str], id_slot: int) -> int | None:
    """The id of the last task the server started in slot ``id_slot`` (its answer carries none)."""
    found = [int(m.group(2)) for ln in log if (m := _LAUNCH_RE.search(ln)) and int(m.group(1)) == id_slot]
    return found[-1] if found else None


def log_reason(log: list[str], id_task: int | None = None) -> str | None:
    """The server's own reason for its cache decision in the task's log lines (None: not logged)."""
    lines = _task_lines(log, id_task)
    for rx in _REASON_RES:
        for ln in lines:
            m = rx.search(ln)
            if m:
                return safe_text(_LINK_RE.sub("", m.group(1)), limit=300)
    return None


def last_task_id(lines: list[str]) -> int:
    """The highest task id in these log lines (-1: none). llama-server numbers its tasks in order."""
    return max((int(m.group(1)) for ln in lines if (m := _TASK_RE.search(ln))), default=-1)


def settled_log(read: Callable[[int], list[str]], id_slot: int, after: int = -1, n: int = 400,
                wait_s: float = SETTLE_S) -> list[str]:
    """The server's last ``n`` log lines once slot ``id_slot`` has logged the end (``stop processing``) of a
    task numbered above ``after`` (:func:`last_task_id` of the log before the request was sent).

    llama-server answers a completion before the slot logs its release, and its log is written by a
    worker thread: read at once, the task's lines (the reason for the cache decision among them) can be
    missing on a busy machine, and the last task in the log is then an earlier one. The log keeps the
    order in which lines were logged, so when the end line is there, every earlier line of the task is
    too. After ``wait_s`` the log is taken as it is."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = list(read(n))
        if any((m := _DONE_RE.search(ln)) and int(m.group(1)) == id_slot and int(m.group(2)) > after
               for ln in lines):
            return lines
        if time.monotonic() >= deadline:
            return lines
        time.sleep(0.02)


def log_mark(engine: Any) -> int:
    """:func:`last_task_id` of the log of a server kvscope started (-1 for the user's, whose log it cannot
    read): taken before the request whose reuse :func:`engine_reuse` then reads."""
    read = getattr(engine, "server_log", None)
    return last_task_id(list(read())) if callable(read) and getattr(engine, "started", False) else -1


def reuse_from_completion(doc: dict[str, Any], restored_tokens: int, prompt_tokens: int,
                          log: list[str] | None = None, id_slot: int = 0) -> ReuseMeasurement:
    """The measurement from a completion's answer (``doc``) sent right after the restore; ``log``: the
    server's log lines, where kvscope has them."""
    t = doc.get("timings") or {}
    cache_n = int(t.get("cache_n") or 0)
    prompt_n = int(t.get("prompt_n") or 0)
    id_task = last_task(log or [], id_slot)
    reused = min(cache_n, restored_tokens)
    why = log_reason(log or [], id_task) if log else None
    if why is None:
        lines = _task_lines(log or [], id_task)
        cached = next((m.group(1) for ln in lines if (m := _CACHED_RE.search(ln))), None)
        if reused == restored_tokens:
            why = "the prompt's common prefix with the slot is served from the restored memory"
        elif reused == 0:
            why = "the server kept none of the restored memory (its log gives no reason at this verbosity)"
        else:
            why = f"the server kept {reused} of the restored tokens"
        if cached is not None:
            why += f" (log: cached n_tokens = {cached})"
        from_log = False
    else:
        from_log = True
    return ReuseMeasurement(restored_tokens, reused, restored_tokens - reused, why, prompt_tokens, prompt_n, from_log)


def continuation_tokens(client: ServerClient, fallback: list[int], text: str = " and then") -> list[int]:
    """A few tokens to continue the slot with: ``text`` tokenized by the server, else ``fallback``."""
    try:
        got = client.tokenize(text, add_special=False)
    except (ServerError, OSError, ValueError, KeyError, TypeError):  # an old or odd server's answer: fall back
        got = []
    return got[:4] or fallback[-3:] or [0]


def measure_reuse(client: ServerClient, id_slot: int, tokens: list[int], *, log: Any = None,
                  continuation: list[int] | None = None) -> ReuseMeasurement:
    """Send the slot's ``tokens`` plus a continuation to ``id_slot`` (just restored) and read the answer.
    ``log``: a callable giving the server's log lines (``ServerProcess.log_tail``), or None."""
    cont = continuation if continuation is not None else continuation_tokens(client, tokens)
    prompt = [*tokens, *cont]
    mark = last_task_id(list(log(400))) if callable(log) else -1
    doc = client.complete(prompt, n_predict=1, id_slot=id_slot, temperature=0.0)
    lines = settled_log(log, id_slot, mark) if callable(log) else None
    return reuse_from_completion(doc, len(tokens), len(prompt), lines, id_slot)


def engine_reuse(engine: Any, restored_tokens: int, mark: int = -1) -> dict[str, Any] | None:
    """``verify --engine server``'s ``reuse``: from the completion its server engine sent right after the
    restore (the slot's tokens plus the next token) and, where kvscope started the server, its log
    (``mark``: :func:`log_mark` before that completion); None when there was no answer. ``line`` is the
    text output's."""
    doc = getattr(engine, "last_completion", None)
    if not isinstance(doc, dict):
        return None
    slot = doc.get("id_slot")
    id_slot = slot if isinstance(slot, int) else 0
    read = getattr(engine, "server_log", None)
    log = settled_log(read, id_slot, mark) if callable(read) and getattr(engine, "started", False) else []
    m = reuse_from_completion(doc, restored_tokens, restored_tokens + 1, log, id_slot)
    ctx = getattr(engine, "ctx", None)
    # the settings are known for a server kvscope started (verify runs it with --swa-full), not for the user's
    swa_full = bool(ctx.swa_full) if getattr(engine, "started", False) and ctx is not None else None
    return {**m.to_json(), "swa_full": swa_full, "line": m.line()}
