"""The window shell: the ``kvscope gui`` command, the main window with its menus and settings, the
per-file tab that assembles the views, and the ``--screenshot`` posing.

The top layer of the app: it may import every other app package; none of them imports it.
"""
