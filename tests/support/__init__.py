"""Helpers the tests share: fixture paths, generated states, builds, trees, mutations, Qt and X set-up."""
