"""The command-line options that say which llama.cpp to run and with what (``kvscope verify`` and ``kvscope lab``):
the engine's location, and :func:`parse_pairs`, the one parser of ``KEY=VALUE`` options (``--ctx-param``,
``--live-seq``; :mod:`kvscope.core.cli.plumbing` exports it to every command)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

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


MAX_SECONDS = 10_000_000.0  # about 115 days: longer is no limit a clock or a poll() can take


def seconds(zero_means: str | None = None) -> Callable[[str], float]:
    """The argparse ``type=`` of every option in seconds (``--timeout``, ``--file-timeout``): a finite number
    above 0 and at most :data:`MAX_SECONDS`, or 0 too where ``zero_means`` says what 0 does (``"no limit"``).
    ``nan``, ``inf``, negatives and words are a usage error (one line, exit 2), not an internal error later."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and (value > 0 or (value == 0 and zero_means is not None)) and value <= MAX_SECONDS:
            return value
        zero = f" (or 0: {zero_means})" if zero_means is not None else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds: give one above 0 and at most "
                                         f"{MAX_SECONDS:.0f}{zero}")

    parse.__name__ = "seconds"
    return parse


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
