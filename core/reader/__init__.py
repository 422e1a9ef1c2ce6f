"""Tolerant readers for every llama.cpp state file kind and layout generation."""
