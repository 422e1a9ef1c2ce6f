"""The findings view: the reader's findings as a table that selects the bytes each one is about."""
