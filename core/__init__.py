"""kvscope's core: parsing, checking and (later) re-implementing llama.cpp saved state.

Nothing under this package imports Qt or pyqtgraph; ``kvscope.app`` is the only Qt layer.
"""
