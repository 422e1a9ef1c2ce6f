"""Moved to bench/kvharness/states.py (temporary alias while the test imports move)."""
from kvharness.states import *  # noqa: F403
from kvharness import states as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
