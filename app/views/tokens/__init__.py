"""The tokens view: the token ids a session file carries, with their text when a model is known."""
