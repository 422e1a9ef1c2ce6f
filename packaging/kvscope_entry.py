"""Entry point of the desktop bundle: the ``kvscope`` command line (``kvscope gui`` opens the window).

The bundle leaves torch out (see packaging/README.md): a command that needs the memory core
(``rewrite``, ``lab``, ``report --lab``) says so in one line instead of failing with a traceback.
"""

from __future__ import annotations

import multiprocessing
import sys

NEEDS_MEMORY_CORE = ("kvscope: this command needs kvscope's memory core (torch), which this bundle leaves out "
                     "to stay small; install kvscope with pip install 'kvscope[memory]' to use it")


def main() -> int:
    """Run the core CLI; its plugin commands (gui, report) come from the bundled entry-point metadata."""
    multiprocessing.freeze_support()  # kvscope scan --jobs starts worker processes from this executable
    from kvscope.core.cli.main import main as cli_main

    try:
        return cli_main()
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "torch":
            print(NEEDS_MEMORY_CORE, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
