"""Two runs side by side: per configuration, both figures, the change and its interval, a verdict.

Configurations are matched by what they measure: the content hash of parameters and hardware
profile. A configuration whose parameters are equal but whose hardware profile changed between
the runs (another image tag in ``image_vars``, another wrapper) is matched by its parameters and
marked ``profile changed``. The figure is the headline images/s; each side's value is the
median over its ok repeats, and :func:`orchestrator.results.stats.compare_samples` gives the change
(B / A - 1), its bootstrap interval over the repeats and the verdict (faster / slower / no
significant change / no repeats). ``missing``: the configuration is in one run only;
``failed``: a run has it but no ok repeat; ``no value``: ok repeats without the figure. The
runs' stacks are compared field by field.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from orchestrator.results.stats import Change, compare_samples
from orchestrator.results.store import (
    CellRecord,
    RecordedStack,
    RunRecord,
    Store,
    stack_field_values,
)
from orchestrator.results.summary import varying_keys


@dataclass
class Side:
    """One run's cells of one configuration."""

    cells: list[CellRecord] = field(default_factory=list)

    @property
    def values(self) -> list[float]:
        return [c.value for c in self.cells if c.ok and c.value is not None]

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def failed(self) -> list[CellRecord]:
        return [c for c in self.cells if not c.ok]


@dataclass
class Row:
    """One configuration in both runs."""

    config: str
    label: str
    params: dict[str, Any]
    a: Side
    b: Side
    profile_changed: bool = False
    change: Change | None = None
    verdict: str = ""

    def to_json(self) -> dict[str, Any]:
        ch = self.change
        return {
            "config": self.config, "label": self.label, "params": self.params,
            "a_median": self.a.median, "b_median": self.b.median,
            "a_values": self.a.values, "b_values": self.b.values,
            "a_failed": len(self.a.failed), "b_failed": len(self.b.failed),
            "change": ch.change if ch else None, "ci_low": ch.low if ch else None,
            "ci_high": ch.high if ch else None, "verdict": self.verdict,
            "profile_changed": self.profile_changed,
        }


@dataclass
class Comparison:
    """Run B against run A."""

    a: RunRecord
    b: RunRecord
    rows: list[Row]
    stacks: dict[str, tuple[list[str], list[str]]]  # field -> (A's values, B's values)
    confidence: float
    threshold: float
    metric: str | None = None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for row in self.rows:
            out[row.verdict] += 1
        return dict(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a.to_json(), "b": self.b.to_json(),
            "confidence": self.confidence, "threshold": self.threshold,
            "metric": self.metric or "headline images/s (train.total_ips / val.total_ips)",
            "method": "change = median(B)/median(A) - 1; percentile interval of the exact "
                      "bootstrap of both medians over their repeats",
            "stack_differences": {k: {"a": a, "b": b} for k, (a, b) in self.stacks.items()},
            "counts": self.counts(), "rows": [row.to_json() for row in self.rows],
        }


def stack_values(cells: Sequence[CellRecord]) -> dict[str, list[str]]:
    """Per stack field, the distinct values a run's cells recorded (sorted)."""
    return stack_field_values(cell.stack for cell in cells)


def _param_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def compare_runs(store: Store, a: RunRecord, b: RunRecord, confidence: float = 0.95,
                 threshold: float = 0.0, metric: str | None = None) -> Comparison:
    """Compare run ``b`` with run ``a`` (the baseline) on the headline images/s, or on
    ``metric`` (a throughput figure: higher is better)."""
    with store.snapshot():
        cells_a = store.cells([a.pk], metric=metric)
        cells_b = store.cells([b.pk], metric=metric)
    sides: dict[str, list[Side]] = {}
    info: dict[str, CellRecord] = {}
    for index, cells in ((0, cells_a), (1, cells_b)):
        for cell in cells:
            pair = sides.setdefault(cell.config, [Side(), Side()])
            pair[index].cells.append(cell)
            info.setdefault(cell.config, cell)
    rows = [Row(config, info[config].group, info[config].params, pa, pb)
            for config, (pa, pb) in sides.items()]
    rows = _match_by_params(rows)
    for row in rows:
        _judge(row, confidence, threshold)
    va, vb = stack_values(cells_a), stack_values(cells_b)
    stacks = {name: (va[name], vb[name]) for name in RecordedStack.names() if va[name] != vb[name]}
    return Comparison(a, b, rows, stacks, confidence, threshold, metric)


def _match_by_params(rows: list[Row]) -> list[Row]:
    """Join an A-only and a B-only row with equal parameters (the profile changed)."""
    only_a = {_param_key(r.params): r for r in rows if r.a.cells and not r.b.cells}
    out = []
    for row in rows:
        if row.b.cells and not row.a.cells:
            partner = only_a.pop(_param_key(row.params), None)
            if partner is not None:
                out.append(Row(f"{partner.config}->{row.config}", row.label, row.params,
                               partner.a, row.b, profile_changed=True))
                continue
        out.append(row)
    joined = {r.config.split("->")[0] for r in out if r.profile_changed}
    return [r for r in out if r.config not in joined]


def _judge(row: Row, confidence: float, threshold: float) -> None:
    if not row.a.cells or not row.b.cells:
        row.verdict = "missing in " + ("A" if not row.a.cells else "B")
        return
    if row.a.failed and not row.a.values or row.b.failed and not row.b.values:
        side = " and ".join(s for s, sd in (("A", row.a), ("B", row.b))
                            if sd.failed and not sd.values)
        row.verdict = f"failed in {side}"
        return
    if not row.a.values or not row.b.values:
        row.verdict = "no value"
        return
    row.change = compare_samples(row.a.values, row.b.values, confidence, threshold)
    row.verdict = row.change.verdict


# --- rendering -------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def table_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the comparison table (text and HTML share them)."""
    keys = varying_keys([r.params for r in comp.rows], always=("hardware",))
    level = f"{comp.confidence:.0%} CI"
    headers = [*keys, "A images/s", "B images/s", "change", level, "n A/B", "verdict"]
    rows = []
    for r in comp.rows:
        ch = r.change
        ci = f"{_pct(ch.low)}..{_pct(ch.high)}" if ch and ch.low is not None else ""
        verdict = r.verdict + (" (profile changed)" if r.profile_changed else "")
        rows.append([*[str(r.params.get(k, "")) for k in keys], _fmt(r.a.median),
                     _fmt(r.b.median), _pct(ch.change if ch else None), ci,
                     f"{len(r.a.values)}/{len(r.b.values)}", verdict])
    return headers, rows


def render_compare(comp: Comparison) -> str:
    """The comparison as text: a header, the table, the stack differences."""
    head = [f"A: {comp.a.label} ({comp.a.status})", f"B: {comp.b.label} ({comp.b.status})"]
    headers, rows = table_rows(comp)
    out = ["\n".join(head), tabulate(rows, headers=headers, tablefmt="github",
                                     disable_numparse=True)]
    if comp.stacks:
        lines = ["stack differences:"]
        for name, (a, b) in comp.stacks.items():
            lines.append(f"  {name}: {', '.join(a) or '-'} -> {', '.join(b) or '-'}")
        out.append("\n".join(lines))
    else:
        out.append("stacks: identical")
    counts = ", ".join(f"{n} {v}" for v, n in sorted(comp.counts().items()))
    out.append(f"{len(comp.rows)} configurations: {counts}. change = B/A - 1 of the medians "
               f"over ok repeats; interval: exact bootstrap over repeats; significant when it "
               f"excludes 0 and the change is beyond {comp.threshold:.1%}")
    return "\n\n".join(out)


def render_compare_csv(comp: Comparison) -> str:
    """One row per configuration, plain numbers (fractions, not percentages)."""
    out = io.StringIO()
    keys = sorted({k for r in comp.rows for k in r.params})
    fields = ["config", "label", *keys, "a_run", "b_run", "a_median", "b_median", "a_n", "b_n",
              "a_failed", "b_failed", "change", "ci_low", "ci_high", "verdict",
              "profile_changed"]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in comp.rows:
        ch = r.change
        writer.writerow({
            "config": r.config, "label": r.label, **{k: r.params.get(k, "") for k in keys},
            "a_run": comp.a.label, "b_run": comp.b.label,
            "a_median": _blank(r.a.median), "b_median": _blank(r.b.median),
            "a_n": len(r.a.values), "b_n": len(r.b.values), "a_failed": len(r.a.failed),
            "b_failed": len(r.b.failed), "change": _blank(ch.change if ch else None),
            "ci_low": _blank(ch.low if ch else None), "ci_high": _blank(ch.high if ch else None),
            "verdict": r.verdict, "profile_changed": r.profile_changed,
        })
    return out.getvalue()


def _blank(value: float | None) -> Any:
    return "" if value is None else value
