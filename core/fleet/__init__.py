"""The slot store of a fleet: scan, check and migrate many state files, on one machine or a Dask cluster.

- :mod:`.source`: SOURCE (a folder or an fsspec URL) walked as a stream of :class:`~.source.Entry`.
- :mod:`.scanfile`: the pure per-file functions (``scan_file``, ``scan_entry``) every executor runs.
- :mod:`.executors`: the executor interface; :mod:`.localpool` (worker processes on this machine) and
  :mod:`.daskpool` (a ``dask.distributed`` cluster) run a per-file function over the entries with
  a bounded number in flight, stream results as they complete, and turn a worker's death into
  an error result for the file it was reading.
- :mod:`.summary`: counts and the worst files, kept as results stream past (bounded memory).
- :mod:`.progress`: files done, rate and ETA on a terminal's stderr.
- :mod:`.migrate`: ``kvscope migrate``: every file into a destination in another layout
  generation, restartable through a manifest.
- :mod:`.cli`: the ``scan`` and ``migrate`` commands.
"""
