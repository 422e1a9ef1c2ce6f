"""kvscope's Qt application layer: presents what ``kvscope.core`` computes."""
