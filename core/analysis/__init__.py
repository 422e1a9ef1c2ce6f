"""The analysis layer, above the reader: what a parsed state means.

Its verdict, which builds load it, the overview, the statistics of its values and the diff of two states.
"""
