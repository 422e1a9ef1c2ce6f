"""Real llama.cpp for kvscope: pinned source builds (``builds``), libllama in a child process
through llama-cpp-python (``llamacpp``) and llama-server over HTTP (``server``).

Nothing here is imported by the reader; the engine is an optional extra.
"""
