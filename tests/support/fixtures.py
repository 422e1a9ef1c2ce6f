"""Moved to bench/kvharness/fixtures.py (temporary alias while the test imports move)."""
from kvharness.fixtures import *  # noqa: F403
from kvharness import fixtures as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
