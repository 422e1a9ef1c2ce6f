"""Which pinned llama.cpp build to run a state file in, and why (a sentence for the user).

llama.cpp loads a session or sequence file only when its version numbers equal the build's own, and
the unversioned blobs only in the byte layout the build writes; so the build that can load a file of
kvscope layout generation ``G`` is the pinned build whose ``writes`` is ``G``. For any other
generation (or an unknown one) the choice is the binding's own tree, llama.cpp 0c1e5709, which
llama-cpp-python 0.3.36 vendors, and the reason says that it will refuse the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.core.engine.abi import BINDING_ABI, BINDING_LABEL
from kvscope.core.engine.builds import BUILDS, InstalledBuild, LlamaBuild, by_name, installed
from kvscope.core.reader.layouts import generation_named


@dataclass(frozen=True)
class BuildChoice:
    """A build for a file, with the reason in words."""

    build: LlamaBuild
    reason: str
    loads: bool  # the build writes, and so loads, the file's generation

    def installed(self) -> InstalledBuild | None:
        return installed(self.build)

    def to_json(self) -> dict[str, object]:
        return {"build": self.build.name, "commit": self.build.commit, "writes": self.build.writes,
                "loads": self.loads, "reason": self.reason}


def build_for_layout(layout: str | None) -> BuildChoice:
    """The build for a file whose layout generation (``ParseResult.layout.name``, or an alias such as
    ``v4``) is ``layout``; None or "" for a file whose generation is not known."""
    gen = generation_named(layout) if layout else None
    name = gen.name if gen is not None else layout
    for b in BUILDS:
        if name == b.writes:
            return BuildChoice(b, f"llama.cpp {b.name} ({b.date}) writes layout {name}, so it can load this file", True)
    own = by_name(BINDING_ABI)
    if not layout:
        why = "the file's layout generation is not known"
    elif gen is None:
        why = f"{layout!r} is not a layout generation kvscope knows"
    else:
        why = (f"no pinned build writes layout {gen.name} (session v{gen.session_version}, seq v{gen.seq_version}); "
               f"it will refuse the file")
    return BuildChoice(own, f"using the binding's own llama.cpp {own.name} ({BINDING_LABEL}): {why}", False)
