"""Moved to bench/kvharness/fleet_tree.py (temporary alias while the test imports move)."""
from kvharness.fleet_tree import *  # noqa: F403
from kvharness import fleet_tree as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
