"""Moved to bench/kvharness/engine_fuzz.py (temporary alias while the test imports move)."""
from kvharness.engine_fuzz import *  # noqa: F403
from kvharness import engine_fuzz as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
