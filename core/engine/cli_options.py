"""The command-line options that say which llama.cpp to run (``kvscope verify`` and ``kvscope lab``)."""

from __future__ import annotations

import argparse

from kvscope.core.engine.builds import BUILDS


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
