"""Qt building blocks every other app package uses: the QApplication, background tasks, palettes, small widgets.

Imports no other ``kvscope.app`` package (the bottom layer of the app).
"""
