"""Moved to bench/kvharness/fake_server.py (temporary alias while the test imports move)."""
from kvharness.fake_server import *  # noqa: F403
from kvharness import fake_server as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
