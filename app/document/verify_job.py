"""The Verify action's background job and the engine it runs in (no widgets here).

:class:`EngineChoice` is what the settings hold: the engine (``llama.cpp``, ``server``, ``torch``), a
pinned build or the user's own libllama folder, and for llama-server a running server (URL and its
``--slot-save-path`` folder) or a binary kvscope starts. :func:`verify_job` runs
:class:`kvscope.core.verify.run.Verifier` on a pool thread with the document's model profile: its
progress goes to the task's ``report``, the task's cancel kills the engine call in flight
(``token.on_cancel``), and the result comes back as the ``kvscope verify --json`` object. A blob carries no
tokens: those the user gave for it (``tokens``, as ``--tokens`` gives them) are re-prefilled. A setup
problem (no engine installed, a build not built, a server that does not answer) fails the task with
the verifier's one-line message, which says how to get the engine.

The verify core is imported inside the job, so the app starts without the ``engine`` extra.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvscope.app.base.tasks import Cancelled, CancelToken, Job, Report
from kvscope.core.engine.choices import VERIFY_ENGINES

if TYPE_CHECKING:
    from kvscope.app.document.given_tokens import GivenTokens
    from kvscope.core.model.profile import ModelProfile

ENGINE_TITLES = {"llama.cpp": "llama.cpp (libllama in a child process)", "server": "llama-server (HTTP)",
                 "torch": "torch memory core (restore only)"}
NEEDS_MODEL = ("Verify needs the GGUF model the file was written with: choose it with File → Model… (Ctrl+M), "
               "then verify again.")


@dataclass(frozen=True)
class EngineChoice:
    """The engine Verify (and the Lab's real-engine runs) use; None fields take kvscope's defaults."""

    engine: str = "llama.cpp"
    build: str | None = None  # a pinned build name; None: the one that writes the file's layout
    lib_path: str | None = None  # the user's own libllama folder (instead of a pinned build)
    server_url: str | None = None  # a running llama-server ...
    slot_dir: str | None = None  # ... and its --slot-save-path folder
    server_bin: str | None = None  # a llama-server binary kvscope starts (instead of the pinned build's)

    def stripped(self) -> EngineChoice:
        """The choice with its text fields stripped and blanks as None."""
        def v(x: str | None) -> str | None:
            return x.strip() if x and x.strip() else None

        return EngineChoice(self.engine, v(self.build), v(self.lib_path), v(self.server_url), v(self.slot_dir),
                            v(self.server_bin))

    def cleaned(self) -> EngineChoice:
        """The choice with blanks as None and only the fields its engine uses."""
        c = self.stripped()
        if c.engine == "torch":
            return EngineChoice("torch")
        if c.engine == "llama.cpp":
            return replace(c, server_url=None, slot_dir=None, server_bin=None,
                           build=None if c.lib_path else c.build)
        if c.server_url:  # a running server: no build, no binary, no library
            return replace(c, build=None, lib_path=None, server_bin=None)
        return replace(c, lib_path=None, slot_dir=None, build=None if c.server_bin else c.build)

    def problem(self) -> str | None:
        """What is wrong with the choice (one line), or None."""
        if self.engine not in VERIFY_ENGINES:
            return f"unknown engine {self.engine!r} ({', '.join(VERIFY_ENGINES)})"
        c = self.cleaned()
        if c.engine == "server" and c.server_url and not c.slot_dir:
            return "a running llama-server needs its --slot-save-path folder (Slot folder in the engine settings)"
        return None

    def verifier_kwargs(self) -> dict[str, Any]:
        c = self.cleaned()
        return {"engine": c.engine, "build": c.build, "lib_path": c.lib_path, "server_url": c.server_url,
                "slot_dir": c.slot_dir, "server_bin": c.server_bin}

    def lab_kwargs(self, lab_engine: str) -> dict[str, Any]:
        """Arguments of :class:`kvscope.core.lab.engine_lab.EngineLabRunner` for ``lab_engine`` (``llama.cpp``,
        ``server`` or ``both``, which runs llama.cpp): the settings' build, library or server, whichever
        engine Verify is set to."""
        c = replace(self, engine="server" if lab_engine == "server" else "llama.cpp").cleaned()
        return {"build": c.build, "lib_path": c.lib_path, "server_url": c.server_url, "slot_dir": c.slot_dir,
                "server_bin": c.server_bin}

    def describe(self) -> str:
        """One line for menus and status: ``llama.cpp (build b11434)``."""
        c = self.cleaned()
        if c.engine == "torch":
            return "torch memory core"
        if c.engine == "server":
            if c.server_url:
                return f"llama-server at {c.server_url}"
            if c.server_bin:
                return f"llama-server {os.path.basename(c.server_bin)} (started by kvscope)"
            return f"llama-server, build {c.build or 'chosen by the file'} (started by kvscope)"
        if c.lib_path:
            return f"llama.cpp from {c.lib_path}"
        return f"llama.cpp, build {c.build or 'chosen by the file'}"


def verify_job(path: str, model: str, choice: EngineChoice, profile: ModelProfile | None = None,
               tokens: GivenTokens | None = None) -> Job:
    """The job that verifies ``path`` with ``model`` in ``choice``'s engine (``tokens``: those given for a blob,
    re-prefilled instead of the file's); returns the ``--json`` object."""

    def job(token: CancelToken, report: Report) -> dict[str, Any]:
        from kvscope.core.verify.run import Verifier, VerifyError

        problem = choice.problem()
        if problem is not None:
            raise VerifyError(problem)

        def progress(done: int, total: int, label: str) -> None:
            report(done / max(1, total), label)

        report(0.0, f"starting {choice.cleaned().engine}")
        verifier = Verifier(path, model, progress=progress, profile=profile, tokens=tokens,
                            **choice.verifier_kwargs())
        token.on_cancel(verifier.cancel)
        token.check()
        result = verifier.run()
        if result.cancelled or token.cancelled:
            raise Cancelled()
        return result.to_json()

    return job
