"""History of a matrix across runs: the nightly sweep's trend and its regressions.

Built only from the run folders on disk. For each cell group, the median images/s of each run;
the newest run is compared with a reference, the median of the previous runs' medians (up to
``window`` of them), and flagged when it dropped by more than ``threshold``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from orchestrator.results import RunPaths
from orchestrator.summary import summarize, varying_keys


@dataclass
class Trend:
    group: str
    params: dict[str, Any]
    values: dict[str, float | None] = field(default_factory=dict)  # run id -> median images/s
    reference: float | None = None
    change: float | None = None  # latest / reference - 1
    regression: bool = False


def trends(runs: Sequence[RunPaths], window: int = 5, threshold: float = 0.05) -> list[Trend]:
    """Per group: each run's median; the newest vs the median of up to ``window`` before it."""
    out: dict[str, Trend] = {}
    for run in runs:
        for row in summarize(run.results()):
            trend = out.setdefault(row.group, Trend(row.group, row.params))
            trend.values[run.run_id] = row.ips
    if not runs:
        return []
    latest = runs[-1].run_id
    for trend in out.values():
        prior = [trend.values.get(r.run_id) for r in runs[:-1]][-window:]
        prior_vals = [v for v in prior if v is not None]
        now = trend.values.get(latest)
        if prior_vals and now is not None:
            trend.reference = statistics.median(prior_vals)
            trend.change = now / trend.reference - 1.0
            trend.regression = trend.change < -threshold
    return list(out.values())


def render_history(runs: Sequence[RunPaths], items: Sequence[Trend]) -> str:
    """A table: group params, one column per run, the change of the newest, the flag."""
    if not items:
        return "(no runs)"
    keys = varying_keys([t.params for t in items], always=("hardware",))
    headers = [*keys, *[r.run_id[:15] for r in runs], "vs reference", ""]
    rows = []
    for t in items:
        line = [t.params.get(k, "") for k in keys]
        line += ["" if t.values.get(r.run_id) is None else f"{t.values[r.run_id]:,.1f}"
                 for r in runs]
        line.append("" if t.change is None else f"{t.change:+.1%}")
        line.append("REGRESSION" if t.regression else "")
        rows.append(line)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)
