"""Run folders on disk, and the index over them.

* :mod:`~orchestrator.results.folders.run_folder` — a run folder's layout
  (:class:`~orchestrator.results.folders.run_folder.RunPaths`: every path under a results root)
  and the values in it (:class:`~orchestrator.results.folders.run_folder.CellResult`,
  :class:`~orchestrator.results.folders.run_folder.Status`), written atomically, read back
  without crashing;
* :mod:`~orchestrator.results.folders.safejson` — JSON in and out of run folders, within bounds;
* :mod:`~orchestrator.results.folders.folder_lock` — one sweep at a time in a run folder, one
  import at a time into a matrix's folder;
* :mod:`~orchestrator.results.folders.store` — the SQLite index over every run folder (a cache:
  the folders are the truth).

May import: errors, config, statistics.
"""
