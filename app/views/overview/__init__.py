"""The overview: the first view of every file (what it is, the verdict, which llama.cpp builds load it)."""
