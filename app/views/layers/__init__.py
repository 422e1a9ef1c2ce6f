"""The layer view: one K/V/r/s record as a heatmap (cells × channels) and per-layer statistics plots."""
