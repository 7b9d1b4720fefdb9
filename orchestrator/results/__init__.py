"""Run folders and everything read back from them: figures, tables, history, reports.

Tables and reports are built only from what is on disk, so any old run can be re-reported.

* :mod:`~orchestrator.results.run_folder` — a run folder's layout
  (:class:`~orchestrator.results.run_folder.RunPaths`) and the values in it
  (:class:`~orchestrator.results.run_folder.CellResult`,
  :class:`~orchestrator.results.run_folder.Status`);
* :mod:`~orchestrator.results.figure_parsers`, :mod:`~orchestrator.results.dllogger`,
  :mod:`~orchestrator.results.profiler_figures`, :mod:`~orchestrator.results.foreign_logs` —
  figures read from a program's output (our JSON lines, DLLogger, a regex, the seeds' own
  formats by their own rules) and from profiler CSV;
* :mod:`~orchestrator.results.table_rules` — how a table's numbers are made (ours, or a seed's
  rule named by the matrix);
* :mod:`~orchestrator.results.store` — the SQLite index over every run folder;
* :mod:`~orchestrator.results.summary`, :mod:`~orchestrator.results.compare`,
  :mod:`~orchestrator.results.history`, :mod:`~orchestrator.results.export`,
  :mod:`~orchestrator.results.plots`, :mod:`~orchestrator.results.report_html` — tables, trends,
  the regression check, exports, plots and the HTML report; :mod:`~orchestrator.results.stats`
  the statistics under them;
* :mod:`~orchestrator.results.rerun` — when a throttled cell is run again;
* :mod:`~orchestrator.results.importer` — logs made elsewhere turned into a run folder.

The reports never see a matrix: only the importer expands one (the matrix an import joins), so
only it imports :mod:`orchestrator.plan`.

May import: errors, config, catalog, plan (the importer only).
"""
