"""The conversion layer: rewriting a state into another layout generation or memory layout."""
