"""The Lab tab: restore the file, as is and corrupted, into a live context and show the outcome matrix.

The matrix runs through ``kvscope.core.lab``; this package holds the tab's controls, jobs, table model
and detail pane.
"""
