"""Reports built from what is on disk: tables, comparisons, history, exports, plots, HTML.

* :mod:`~orchestrator.results.reports.summary` — a run's table (one row per cell group) and
  summary.csv / summary.txt;
* :mod:`~orchestrator.results.reports.table_rules` — how a table's numbers are made (ours, or a
  seed's rule named by the matrix);
* :mod:`~orchestrator.results.reports.compare` — two runs side by side;
* :mod:`~orchestrator.results.reports.history` — a matrix across runs and the regression check;
* :mod:`~orchestrator.results.reports.export` — the long-format export of any runs;
* :mod:`~orchestrator.results.reports.plots`, :mod:`~orchestrator.results.reports.report_html`
  — plots and the self-contained HTML report.

May import: errors, config, statistics, folders, figures.
"""
