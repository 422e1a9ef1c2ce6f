"""The corrupt-and-restore lab: corruption catalog, restore policies, probes and the result matrix."""
