"""The cell map: each cell table as cells × sequences with positions (a numpy picture) and sliding-window masks."""
