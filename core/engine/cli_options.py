"""The command-line options that say which llama.cpp to run and with what (``kvscope verify`` and ``kvscope lab``):
the engine's location, and :func:`parse_pairs`, the one parser of ``KEY=VALUE`` options (``--ctx-param``,
``--live-seq``; :mod:`kvscope.core.cli.plumbing` exports it to every command)."""

from __future__ import annotations

import argparse

from kvscope.core.engine.builds import BUILDS
from kvscope.core.errors import UsageError


def parse_pairs(items: list[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` strings of a repeatable ``option`` as a dict (keys and values stripped; a later key wins).

    UsageError names the option and the item when one has no ``=`` or an empty key.
    """
    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"{option} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def add_engine_location(p: argparse.ArgumentParser, build_default: str) -> None:
    """``--build`` | ``--lib`` (one of them), ``--server``, ``--slot-dir``, ``--server-bin``.

    ``build_default`` says, for ``--build``'s help, which build is used when none is given.
    """
    names = ", ".join(b.name for b in BUILDS)
    lib = p.add_mutually_exclusive_group()
    lib.add_argument("--build", metavar="NAME", help=f"a pinned llama.cpp build ({names}); default: {build_default}")
    lib.add_argument("--lib", metavar="PATH", help="your own libllama build folder (its ABI is checked)")
    p.add_argument("--server", metavar="URL", help="a running llama-server (with --engine server)")
    p.add_argument("--slot-dir", metavar="DIR", help="that server's --slot-save-path folder")
    p.add_argument("--server-bin", metavar="PATH", help="start this llama-server binary (on 127.0.0.1, a temporary "
                   "slot folder) instead of the pinned build's")
