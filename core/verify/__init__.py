"""``kvscope verify``: does a saved state restore in a real llama.cpp build, and is what it restores
what the model computes for the file's own tokens?

The steps (``run.verify``): the context parameters from the file (``params``), the restore in the
engine, a fresh prefill of the file's tokens in the same context (``prefill`` plans it), a
record-by-record, cell-by-cell comparison of the two states (``compare``), the next token's
logits after each, and a verdict: ``ok``, ``damaged``, ``stale`` or ``incompatible``
(``result``). The engines (``engines``) are libllama in a child process, a llama-server over
HTTP, and the torch memory core (restore only). ``cli`` is the command line.
"""
