"""Moved to bench/kvharness/page_cache.py (temporary alias while the test imports move)."""
from kvharness.page_cache import *  # noqa: F403
from kvharness import page_cache as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
