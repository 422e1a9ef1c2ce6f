"""The diff view: this file against a second state file, as a list of differences and per-layer plots."""
