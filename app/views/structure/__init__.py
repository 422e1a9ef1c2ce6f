"""The structure view: the parse tree of the file as a Qt item model and its tree widget with Find."""
