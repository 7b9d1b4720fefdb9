"""What a cell's output says: its figures, whether it succeeded, whether it runs again.

* :mod:`~orchestrator.results.figures.figure_parsers` — the figures parsers (``[figures]
  parser``: our JSON lines, DLLogger, a regex, the seeds' formats) and the judgement of a cell
  that exited 0 (:func:`~orchestrator.results.figures.figure_parsers.evaluate`);
* :mod:`~orchestrator.results.figures.dllogger` — NVIDIA DLLogger raports and logs, re-summarized;
* :mod:`~orchestrator.results.figures.foreign_logs` — the seed experiments' own output formats,
  read by their authors' rules;
* :mod:`~orchestrator.results.figures.profiler_figures` — figures from the CSV files a profiler
  left in the cell folder;
* :mod:`~orchestrator.results.figures.rerun` — whether a throttled cell runs again.

May import: errors, config, folders.
"""
