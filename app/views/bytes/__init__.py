"""Byte-level views: the byte map (the file as coloured regions), the hex view and its data inspector."""
