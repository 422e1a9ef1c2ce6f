"""What each worker process of kvscope's own Dask cluster imports as it starts (dask's ``preload``).

The per-file deadline's clock starts as a file begins (:func:`kvscope.core.fleet.daskpool.run_marked`);
without this, a fresh worker (the first, or one started again after a death) spent its first file's
seconds importing the reader and the analysis, and under a short ``--file-timeout`` on a loaded machine a
small file was charged ``timed out`` for kvscope's imports (the long fuzz's stopped-worker family).
The local executor preloads its fork server the same way (``localpool.PRELOAD``).
"""

from __future__ import annotations

import importlib
from typing import Any

from kvscope.core.fleet.localpool import PRELOAD

WARM = (*PRELOAD, "kvscope.core.analysis.inspection", "kvscope.core.analysis.compat",
        "kvscope.core.analysis.reuse", "kvscope.core.model.profile", "kvscope.core.fleet.migrate")

for _name in WARM:
    importlib.import_module(_name)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook: nothing to set up, importing this module did the work."""
