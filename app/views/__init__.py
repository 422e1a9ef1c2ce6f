"""The per-file views, one package per family; each reads a :class:`~kvscope.app.document.document.Document`
and follows its selection. ``row_model`` is the list-backed table model the findings and diff tables share.

Views import only ``kvscope.app.base``, ``kvscope.app.document`` and each other, never the Lab tab, the
reports or the window shell.
"""
