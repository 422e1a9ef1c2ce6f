"""The harness the test suite and the benches share: where the real fixtures are, real-process helpers,
the misbehaving llama-server proxy, the fuzz mutations and the engine fuzz's cases.

It lives beside the benches (``bench/`` is on pytest's ``pythonpath``), so a bench imports it as
``kvharness.X`` from any folder and never imports from ``tests/``.
"""
