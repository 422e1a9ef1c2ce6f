"""``kvscope llama-build``: build the pinned llama.cpp (libllama + llama-server) into the cache.

The options and the work are :mod:`kvscope.core.engine.builds`' own; this module only names the command.
Exit codes: 0 built (or already there), 2 the build failed or a usage error (one line on stderr).
"""

from __future__ import annotations

from typing import Any

COMMANDS = ("llama-build",)


def register(subparsers: Any) -> None:
    """Add ``llama-build`` to an argparse subparsers object."""
    from kvscope.core.engine import builds  # stdlib only

    p = subparsers.add_parser("llama-build", help="build the pinned llama.cpp libllama + llama-server (CPU) into the "
                              "cache", description=builds.__doc__.split("\n\n")[0] if builds.__doc__ else None)
    builds.add_arguments(p)
    p.set_defaults(func=builds.run)
