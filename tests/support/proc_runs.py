"""Moved to bench/kvharness/proc_runs.py (temporary alias while the test imports move)."""
from kvharness.proc_runs import *  # noqa: F403
from kvharness import proc_runs as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
