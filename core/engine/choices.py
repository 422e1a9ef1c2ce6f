"""The engines a user can choose, by command: the one list each CLI, the app and the runners share.

``llama.cpp`` is libllama in a child process, ``server`` a llama-server, ``torch`` kvscope's memory
core (:mod:`kvscope.core.memory`) and, for the lab, ``both`` the core beside llama.cpp. This module
imports nothing, so the app and the argument parsers can name the choices without loading an engine.
"""

from __future__ import annotations

VERIFY_ENGINES = ("llama.cpp", "server", "torch")  # kvscope verify --engine (the first is the default)
LAB_ENGINES = ("torch", "llama.cpp", "server", "both")  # kvscope lab --engine (the first is the default)
LAB_LLAMA_ENGINES = tuple(e for e in LAB_ENGINES if e != "torch")  # the lab runs that drive llama.cpp
