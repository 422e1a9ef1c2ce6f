"""Special files to point an output at, safely: a character device that is not the system's /dev/null.

The output tests (issue 31) check that ``-o /dev/null`` is refused. Run as root, a regression there
replaces the machine's ``/dev/null`` with a regular file (the code before the fix did exactly that), so
where this process could replace ``/dev/null`` the tests use a private node of the same device (1, 3)
in their own folder: the same kind of file to the guard, and a regression harms only the test's node.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

NULL_DEVICE = (1, 3)  # Linux's /dev/null


def null_node(folder: Path) -> str:
    """``/dev/null`` where this process cannot replace it, else a private character device (1, 3) in ``folder``."""
    if not os.access("/dev", os.W_OK):
        return "/dev/null"
    path = folder / "null"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
    return str(path)


def system_null_intact() -> bool:
    """The machine's /dev/null is still the character device (1, 3)."""
    st = os.lstat("/dev/null")
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == NULL_DEVICE
