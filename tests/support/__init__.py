"""Helpers only the tests use: builds, trained slots, damaged copies, Qt and X set-up (what the benches share
with the tests, fixture paths, real-process helpers, the fake server, the mutations, is bench/kvharness)."""
