"""Work-arounds for the Qt binding in use.

PySide6 6.12.0 on CPython 3.11 returns ``None`` (from every void method and every empty
QVariant) and ``True``/``False`` (from signal emits) without taking a reference, as if those
objects were immortal, which they only became in CPython 3.12 (PEP 683). Each call then drops
their reference count by one until CPython aborts with "deallocating None" after a few thousand
calls. PySide6 6.11 does not do this. When the drift is measured at start-up, these three
singletons get a huge extra reference count (what 3.12 does by design), so the application can
run; the proper fix is PySide6 != 6.12.0 or CPython >= 3.12.
"""

from __future__ import annotations

import ctypes
import sys

_EXTRA = 1 << 40
_applied = False


def singleton_refs_drift() -> bool:
    """True when calling a void Qt method loses a reference to None (the PySide6 6.12 / 3.11 bug)."""
    from PySide6.QtCore import QObject

    probe = QObject()
    before = sys.getrefcount(None)
    for _ in range(16):
        probe.setObjectName("probe")
    return sys.getrefcount(None) < before


def immortalize_singletons() -> bool:
    """Apply the work-around once when needed; True when it was (or had been) applied."""
    global _applied
    if _applied:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython" or not singleton_refs_drift():
        return False
    for obj in (None, True, False):
        ref = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt is the first field of every object
        ref.value += _EXTRA
    _applied = True
    return True
