"""One open state file: its parse, statistics and diff (loaded off the GUI thread), the offset index the
views select through, the shared selection, and the model-file choice with its banner."""
