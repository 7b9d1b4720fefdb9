"""Run folders and everything read back from them: figures, statistics, tables, reports.

Tables and reports are built only from what is on disk, so any old run can be re-reported.
One layer in five parts, each a sub-package, lowest first; a part imports only the parts below
it that its docstring's ``May import:`` line names (``tests/test_layers.py`` checks it):

* :mod:`~orchestrator.results.statistics` — statistics of repeated measurements: bootstrap
  intervals, the regression test, the unstable-repeats rule, figures normalised by a control.
  Pure: no I/O;
* :mod:`~orchestrator.results.folders` — run folders on disk: their layout
  (:class:`~orchestrator.results.folders.run_folder.RunPaths`), the values in them
  (:class:`~orchestrator.results.folders.run_folder.CellResult`), JSON within bounds, the locks
  on them, and the SQLite store that indexes them;
* :mod:`~orchestrator.results.figures` — what a cell's output says: figures read from a
  program's output (our JSON lines, DLLogger, a regex, the seeds' own formats by their own
  rules) and from profiler CSV, whether the cell succeeded, whether it runs again;
* :mod:`~orchestrator.results.reports` — tables (and the table rules that make their numbers),
  comparisons, history and the regression check, exports, plots and the HTML report;
* :mod:`~orchestrator.results.importer` — logs and run folders made elsewhere turned into a run
  folder.

The reports never see a matrix: only the importer expands one (the matrix an import joins), so
only it imports :mod:`orchestrator.plan`.

May import: errors, config, catalog, plan (the importer only).
"""
