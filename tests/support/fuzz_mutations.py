"""Moved to bench/kvharness/fuzz_mutations.py (temporary alias while the test imports move)."""
from kvharness.fuzz_mutations import *  # noqa: F403
from kvharness import fuzz_mutations as _m

globals().update({k: v for k, v in vars(_m).items() if not k.startswith("__")})
