"""The Repair action's background job and its state per document (no widgets here).

``kvscope repair FILE --model GGUF -o OUT`` (:mod:`kvscope.core.verify.repair`) re-prefills a damaged
file's own tokens in the pinned build that writes its layout, saves the state as the file was saved,
verifies it and only then writes OUT atomically. The app runs exactly that command, in a child
process of its own (``python -m kvscope.core.cli.main repair ... --json``) so that Cancel can stop it
whatever engine call it is in and the app's process never holds its engines: the run is an
:class:`~kvscope.app.document.engine_job.EngineJob` (the job model Verify's run is too: one progress signal,
one Cancel, one outcome path) whose work runs the command with
:func:`~kvscope.app.document.engine_job.run_command`. Cancel sends SIGINT, which unwinds the command (its
engines closed, its temporary files and OUT's temporary removed), after
:data:`~kvscope.app.document.engine_job.KILL_AFTER_S` kills its process group, and kills what is left of
that group once the command has ended. The child's temporary folder is a private
one (``TMPDIR``), removed when it ends however it ends. The input is never written: an OUT that names
it, by any path, is refused before anything runs.

:func:`repair_problem` says, before anything runs, why the file cannot be repaired from the app (no
model, an empty or random file, a model the file does not fit, a blob given no tokens, a token outside the
vocabulary, media chunks, no pinned build for its layout): the check ``kvscope repair`` makes before any
engine starts (:func:`kvscope.core.verify.preconditions.repair_problem`), so Repair… is offered only where the
command would run; :func:`repair_build` applies the engine settings' build
where it writes the file's layout. A state blob carries no tokens: those the user gave for it (Tools →
Tokens for this blob…) go to the command as ``--tokens @FILE``, a JSON file in the run's private
temporary folder (never on the command line itself: a long prompt would pass the kernel's 128 KiB limit
on one argument). :class:`RepairRun` holds one document's run (the document's ``repair_run``): in
progress (step, Cancel), written (the result, to open), refused or failed (the one-line message).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject

from kvscope.app.base.tasks import Cancelled, CancelToken, Job, Report, Task, TaskRunner
from kvscope.app.document.engine_job import EngineJob, run_command
from kvscope.app.document.given_tokens import ACTION as TOKENS_ACTION
from kvscope.app.document.given_tokens import GivenTokens, all_ids, to_json
from kvscope.app.document.verify_job import EngineChoice
from kvscope.core.errors import InputError
from kvscope.core.fsutil import TEMP_PREFIX, output_problem
from kvscope.core.pinned_builds import BUILDS
from kvscope.core.textsafe import safe_text
from kvscope.core.verify.preconditions import REPAIR_NEEDS_MODEL

if TYPE_CHECKING:
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult

SUFFIX = ".repaired"  # the default output: beside the input, this before its extension
NEEDS_MODEL = f"{REPAIR_NEEDS_MODEL}: choose it with File → Model… (Ctrl+M)."
EXIT_BAD_INPUT = 2  # kvscope repair: the file cannot be rebuilt (one line on stderr)


class RepairRefused(InputError):
    """``kvscope repair`` refused the file or could not rebuild it: its one line."""


NEEDS_TOKENS = f"a state blob carries no tokens: give the ones it was made of with {TOKENS_ACTION}"  # the core's line


def repair_problem(res: ParseResult | None, profile: ModelProfile | None, model_path: str | None,
                   tokens: GivenTokens | None = None) -> str | None:
    """Why the file cannot be repaired from the app (one line), or None when it can (``tokens``: those given
    for a blob, which carries none): the core's own check, the one ``kvscope repair`` makes before any engine
    starts (:func:`kvscope.core.verify.preconditions.repair_problem`)."""
    if res is None:
        return "the file is still being read"
    if profile is None or not model_path:
        return NEEDS_MODEL
    from kvscope.core.verify.preconditions import repair_problem as core_repair_problem

    return core_repair_problem(res, profile, tokens, give_tokens=TOKENS_ACTION)


def repair_build(res: ParseResult, choice: EngineChoice) -> str | None:
    """The build to repair with: the engine settings' pinned build where it writes the file's layout (as
    Verify would restore it there), else None (the command's default: the build that writes it)."""
    build = choice.cleaned().build
    return build if build is not None and any(b.name == build and b.writes == res.layout.name for b in BUILDS) \
        else None


def default_output(path: str) -> str:
    """``dir/name.repaired.ext`` beside the input (``-2``, ``-3`` ... added while that name exists)."""
    folder, name = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(name)
    if stem.startswith(".") and not ext:  # ".slot" is a stem, not an extension
        stem, ext = name, ""
    for n in range(1, 1000):
        cand = os.path.join(folder, f"{stem}{SUFFIX}{'' if n == 1 else f'-{n}'}{ext}")
        if not os.path.lexists(cand):
            return cand
    return os.path.join(folder, f"{stem}{SUFFIX}-{os.getpid()}{ext}")


def repair_command(path: str, model: str, out: str, build: str | None, timeout_s: float,
                   tokens_file: str | None = None) -> list[str]:
    """The ``kvscope repair`` command line (``tokens_file``: a JSON file of the tokens, given as ``@FILE``)."""
    cmd = [sys.executable, "-m", "kvscope.core.cli.main", "repair", path, "--model", model, "-o", out, "--json",
           "--timeout", f"{timeout_s:g}"]
    return cmd + (["--build", build] if build else []) + (["--tokens", "@" + tokens_file] if tokens_file else [])


def write_tokens(folder: str, tokens: GivenTokens) -> str:
    """``folder/tokens.json``, what ``--tokens @FILE`` reads back as ``tokens``; its path."""
    path = os.path.join(folder, "tokens.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(to_json(tokens), fh)
    return path


def _leftovers(out: str, since: float) -> None:
    """A killed command's temporary beside OUT (``atomic_writer``'s, tagged ``repair``), made during the run."""
    folder = os.path.dirname(os.path.abspath(out))
    with contextlib.suppress(OSError):
        for e in os.scandir(folder):
            if e.name.startswith(TEMP_PREFIX + "repair") and e.is_file(follow_symlinks=False) \
                    and e.stat(follow_symlinks=False).st_mtime >= since - 1:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)


def repair_plan_text(res: ParseResult, build: str, tokens: GivenTokens | None = None) -> str:
    """What the run does, for its progress line: ``rebuilding the 12 tokens in llama-server b11434 ...``
    (``tokens``: those given for a blob)."""
    slot = res.kind == "seq_file" and (res.token_payload or {}).get("format") == "server_tokens"
    where = f"llama-server {build} (its slot save)" if slot else f"llama.cpp {build}"
    n = len(all_ids(tokens)) if tokens is not None else len(res.tokens)
    whose = "the" if tokens is not None else "the file's"
    given = " given" if tokens is not None else ""
    return f"rebuilding from {whose} {n} token{'' if n == 1 else 's'}{given} in {where}, then verifying"


def repair_job(path: str, model: str, out: str, build: str | None = None, timeout_s: float = 600.0,
               what: str = "", late: dict[str, Any] | None = None, tokens: GivenTokens | None = None) -> Job:
    """The job that runs ``kvscope repair`` on ``path`` into ``out``; returns its ``--json`` object
    (``what``: the progress line's text; ``tokens``: those given for a blob, passed as ``--tokens @FILE``
    from the run's private temporary folder, and the object then says ``tokens_given``). A Cancel that
    reaches the command after it has written and verified ``out`` cannot unwrite it: its ``--json`` object
    is put in ``late["result"]`` (the task's own result of a cancelled job is dropped), so the app says
    what was written."""

    def job(token: CancelToken, report: Report) -> dict[str, Any]:
        refused = output_problem(out, [path, model])  # the command's own rule, before it is started
        if refused is not None:
            raise RepairRefused(refused)
        step = what or "rebuilding from the file's tokens, then verifying"
        given = {"tokens_given": len(all_ids(tokens))} if tokens is not None else {}
        report(None, step)
        tmp = tempfile.mkdtemp(prefix="kvscope-repair-app-")
        t0 = time.time()
        returncode: int | None = None
        try:
            tokens_file = write_tokens(tmp, tokens) if tokens is not None else None
            returncode, stdout, stderr = run_command(repair_command(path, model, out, build, timeout_s, tokens_file),
                                                     token, report, step, env=dict(os.environ, TMPDIR=tmp))
        finally:
            if returncode is not None and returncode < 0:  # killed: nothing unwound
                _leftovers(out, t0)
            shutil.rmtree(tmp, ignore_errors=True)
        if token.cancelled:
            if returncode == 0 and late is not None:  # it had finished: OUT is written and verified
                with contextlib.suppress(ValueError):
                    late["result"] = {**json.loads(stdout.decode("utf-8")), **given, "finished_before_cancel": True}
            raise Cancelled()
        err = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
        line = err[-1].removeprefix("kvscope: ") if err else f"kvscope repair ended with status {returncode}"
        if returncode == EXIT_BAD_INPUT:
            raise RepairRefused(line)
        if returncode != 0:
            raise RuntimeError(f"kvscope repair failed: {line}")
        result: dict[str, Any] = json.loads(stdout.decode("utf-8"))
        result["seconds_total"] = time.time() - t0
        return {**result, **given}

    return job


class RepairRun(EngineJob):
    """One document's Repair, an :class:`~kvscope.app.document.engine_job.EngineJob` whose work is ``kvscope repair``
    in a child process; ``output`` is the file being (or last) written."""

    def __init__(self, runner: TaskRunner, parent: QObject | None = None) -> None:
        super().__init__(runner, "repair", parent)
        self.output: str | None = None  # the file being (or last) written

    @property
    def step_text(self) -> str:
        return self.step[1] if self.step is not None else ""

    def start(self, path: str, model: str, out: str, build: str | None = None, what: str = "",
                     tokens: GivenTokens | None = None) -> Task | None:
        """Repair ``path`` into ``out`` in the background (None, and ``error`` set, when ``out`` is the input);
        ``what`` says what it does (the progress line); ``tokens``: those given for a blob."""
        if self.task is not None and not self.task.done:
            return self.task
        self.output, self.result, self.error, self.cancelled = os.path.abspath(out), None, None, False
        refused = output_problem(out, [path, model])  # never the file or the model; no FIFO, device, folder
        if refused is not None:
            self.error = refused
            self.changed.emit()
            return None
        late: dict[str, Any] = {}
        return self.submit(f"repair {safe_text(os.path.basename(path))}",
                           repair_job(path, model, self.output, build, what=what, late=late, tokens=tokens),
                           late=late)

    def dismiss(self) -> None:
        if not self.running:
            self.output = None
        super().dismiss()
