"""The ``kvscope`` command line (:mod:`kvscope.core.cli.main.main` is the entry point)."""
