"""Statistics of repeated measurements. Pure: numbers in, numbers out, no I/O.

* :mod:`~orchestrator.results.statistics.stats` — exact bootstrap intervals of medians, the
  comparison of two runs, the regression test of the nightly check, the unstable-repeats rule;
* :mod:`~orchestrator.results.statistics.normalise` — a configuration's figure as a ratio to
  the control measured beside it.

May import: nothing.
"""
