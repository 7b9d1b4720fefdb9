"""Two runs side by side: per configuration, both figures, the change and its interval, a verdict.

Configurations are matched by what they measure: the content hash of parameters and hardware
profile. A configuration whose parameters are equal but whose hardware profile changed between
the runs (another image tag in ``image_vars``, another wrapper) is matched by its parameters and
marked ``profile changed``. The figure is the headline images/s; each side's value is the
median over its ok repeats, and :func:`orchestrator.results.statistics.stats.compare_samples` gives
the change (B / A - 1), its bootstrap interval over the repeats and the verdict (faster / slower /
no significant change / too few repeats). ``missing``: the configuration is in one run only;
``failed``: a run has it but no ok repeat; ``no value``: ok repeats without the figure. The
runs' stacks are compared field by field.

**With a control** (a matrix's ``[control]``): when both runs have normalised figures for a
configuration (each cell's figure as a ratio to the control measured beside it,
:mod:`orchestrator.results.statistics.normalise`), the change, its interval and the verdict are
those of the ratios (``basis`` ``normalised``): the machine's drift between the two runs cancels.
The raw change is still shown and written (``raw_change``), and the control's own change between
the runs (the drift itself) is a table of its own, never a configuration. ``raw`` (``--raw``)
judges the raw figures.
"""

from __future__ import annotations

import io
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from orchestrator.results.folders.store import (
    CellRecord,
    RecordedStack,
    RunRecord,
    Store,
    stack_field_values,
)
from orchestrator.results.reports.csv_out import RowWriter
from orchestrator.results.reports.summary import varying_keys
from orchestrator.results.statistics.stats import (
    TOO_FEW_REPEATS,
    UNSTABLE_RULE,
    Change,
    compare_samples,
    repeats_needed,
    unstable,
)


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
    def unstable(self) -> bool | None:
        """Its ok repeats spread beyond the bound
        (:func:`orchestrator.results.statistics.stats.unstable`); None when there are too few to
        judge."""
        return unstable(self.values)

    @property
    def failed(self) -> list[CellRecord]:
        return [c for c in self.cells if not c.ok]

    @property
    def norms(self) -> list[float]:
        """The ok repeats' ratios to the control (empty: no control)."""
        return [c.norm for c in self.cells if c.ok and c.norm is not None]

    @property
    def norm_median(self) -> float | None:
        return statistics.median(self.norms) if self.norms else None


@dataclass
class Row:
    """One configuration in both runs."""

    config: str
    label: str
    params: dict[str, Any]
    a: Side
    b: Side
    profile_changed: bool = False
    change: Change | None = None  # on the judged basis
    verdict: str = ""
    basis: str = "raw"  # raw | normalised (ratios to the control)
    raw_change: Change | None = None
    norm_change: Change | None = None

    def to_json(self) -> dict[str, Any]:
        ch = self.change
        return {
            "config": self.config, "label": self.label, "params": self.params,
            "a_median": self.a.median, "b_median": self.b.median,
            "a_values": self.a.values, "b_values": self.b.values,
            "a_failed": len(self.a.failed), "b_failed": len(self.b.failed),
            "a_unstable": self.a.unstable, "b_unstable": self.b.unstable,
            "basis": self.basis,
            "change": ch.change if ch else None, "ci_low": ch.low if ch else None,
            "ci_high": ch.high if ch else None, "p": ch.p if ch else None,
            "verdict": self.verdict, "raw": _change_json(self.raw_change),
            "normalised": None if self.norm_change is None else {
                "a_median": self.a.norm_median, "b_median": self.b.norm_median,
                "a_values": self.a.norms, "b_values": self.b.norms,
                **_change_json(self.norm_change)},
            "profile_changed": self.profile_changed,
        }


def _change_json(ch: Change | None) -> dict[str, Any]:
    return {"change": ch.change if ch else None, "ci_low": ch.low if ch else None,
            "ci_high": ch.high if ch else None, "p": ch.p if ch else None,
            "verdict": ch.verdict if ch else None}


@dataclass
class ControlRow:
    """A control in both runs: the machine's drift between them (shown, never judged)."""

    group: str
    config: str
    a: list[float]
    b: list[float]
    a_failed: int = 0
    b_failed: int = 0

    @property
    def change(self) -> float | None:
        if not self.a or not self.b:
            return None
        return statistics.median(self.b) / statistics.median(self.a) - 1.0

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "config": self.config, "a_values": self.a, "b_values": self.b,
                "a_median": statistics.median(self.a) if self.a else None,
                "b_median": statistics.median(self.b) if self.b else None,
                "change": self.change, "a_failed": self.a_failed, "b_failed": self.b_failed}


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
    controls: list[ControlRow] = field(default_factory=list)

    @property
    def normalised(self) -> bool:
        """Whether any configuration was judged on its ratio to the control."""
        return any(r.basis == "normalised" for r in self.rows)

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
            "method": METHOD,
            "stack_differences": {k: {"a": a, "b": b} for k, (a, b) in self.stacks.items()},
            "counts": self.counts(), "rows": [row.to_json() for row in self.rows],
            "controls": [c.to_json() for c in self.controls],
        }


#: How compare judges, in words (``--json``'s ``method``; the text's last line says the same).
METHOD = ("change = median(B)/median(A) - 1; percentile interval of the exact bootstrap of both "
          "medians over their repeats; faster/slower when the interval excludes 0, the change "
          "is beyond the threshold and the exact two-sided rank-sum (permutation) test of the "
          "repeats has p at most 1 - confidence; too few repeats when no outcome of that many "
          "repeats could reach it")


def stack_values(cells: Sequence[CellRecord]) -> dict[str, list[str]]:
    """Per stack field, the distinct values a run's cells recorded (sorted)."""
    return stack_field_values(cell.stack for cell in cells)


def _param_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def compare_runs(store: Store, a: RunRecord, b: RunRecord, confidence: float = 0.95,
                 threshold: float = 0.0, metric: str | None = None, raw: bool = False
                 ) -> Comparison:
    """Compare run ``b`` with run ``a`` (the baseline) on the headline images/s, or on
    ``metric`` (a throughput figure: higher is better); on their ratios to the runs' control
    where both have one, unless ``raw``."""
    with store.snapshot():
        every_a = store.cells([a.pk], metric=metric)
        every_b = store.cells([b.pk], metric=metric)
    cells_a = [c for c in every_a if not c.is_control]
    cells_b = [c for c in every_b if not c.is_control]
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
        _judge(row, confidence, threshold, raw)
    va, vb = stack_values(cells_a), stack_values(cells_b)
    stacks = {name: (va[name], vb[name]) for name in RecordedStack.names() if va[name] != vb[name]}
    return Comparison(a, b, rows, stacks, confidence, threshold, metric,
                      _control_rows(every_a, every_b))


def _control_rows(cells_a: Sequence[CellRecord], cells_b: Sequence[CellRecord]
                  ) -> list[ControlRow]:
    """Each control (by configuration) in both runs."""
    out: dict[str, ControlRow] = {}
    for index, cells in ((0, cells_a), (1, cells_b)):
        for cell in cells:
            if not cell.is_control:
                continue
            row = out.setdefault(cell.config, ControlRow(cell.group, cell.config, [], []))
            values, failed = (row.a, "a_failed") if index == 0 else (row.b, "b_failed")
            if cell.ok and cell.value is not None:
                values.append(cell.value)
            elif not cell.ok:
                setattr(row, failed, getattr(row, failed) + 1)
    return list(out.values())


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


def _judge(row: Row, confidence: float, threshold: float, raw: bool = False) -> None:
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
    row.raw_change = compare_samples(row.a.values, row.b.values, confidence, threshold)
    if row.a.norms and row.b.norms:
        row.norm_change = compare_samples(row.a.norms, row.b.norms, confidence, threshold)
    if row.norm_change is not None and not raw:
        row.change, row.basis = row.norm_change, "normalised"
    else:
        row.change = row.raw_change
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
    normalised = comp.normalised
    extra = ["raw change", "A ÷control", "B ÷control"] if normalised else []
    headers = [*keys, "A images/s", "B images/s", *extra, "change", level, "n A/B", "verdict"]
    rows = []
    for r in comp.rows:
        ch = r.change
        ci = f"{_pct(ch.low)}..{_pct(ch.high)}" if ch and ch.low is not None else ""
        verdict = r.verdict + (" (profile changed)" if r.profile_changed else "")
        if normalised:
            verdict += " (÷control)" if r.basis == "normalised" else " (raw)"
        shown = [_pct(r.raw_change.change if r.raw_change else None),
                 _ratio(r.a.norm_median), _ratio(r.b.norm_median)] if normalised else []
        rows.append([*[str(r.params.get(k, "")) for k in keys], _fmt(r.a.median) + _mark(r.a),
                     _fmt(r.b.median) + _mark(r.b), *shown, _pct(ch.change if ch else None), ci,
                     f"{len(r.a.values)}/{len(r.b.values)}", verdict])
    return headers, rows


def _mark(side: Side) -> str:
    return "?" if side.unstable else ""


#: The footnote of a side whose repeats spread beyond the bound (``?`` after its images/s).
UNSTABLE_NOTE = (f"? unstable: that run's ok repeats spread too far ({UNSTABLE_RULE}): its "
                 "machine was not steady (each cell's result.json machine says how); the "
                 "change and its interval are less to be trusted")


def too_few_note(comp: Comparison) -> str:
    """What a ``too few repeats`` verdict means and what to do about it."""
    need = repeats_needed(comp.confidence)
    fewest = min((min(len(r.a.values), len(r.b.values)) for r in comp.rows
                  if r.verdict == TOO_FEW_REPEATS), default=1)
    lower = next((c for c in (0.90, 0.80) if c < comp.confidence and fewest >= 2
                  and repeats_needed(c) <= fewest), None)
    ask_less = f", or --confidence {lower:.0%}" if lower else ""
    return (f"too few repeats: those rows' ok repeats (n A/B) cannot show a change at "
            f"{comp.confidence:.0%} whatever their values (a verdict needs the exact rank-sum "
            f"test of the repeats as well as the interval, and with so few its smallest "
            f"possible p is above {1 - comp.confidence:.0%}): run {need} repeats a side "
            f"([matrix] repeats){ask_less}")


def compare_notes(comp: Comparison) -> list[str]:
    """The footnotes of the marks :func:`table_rows` puts after a side's images/s, and of a
    ``too few repeats`` verdict."""
    notes = [UNSTABLE_NOTE] if any(r.a.unstable or r.b.unstable for r in comp.rows) else []
    if any(r.verdict == TOO_FEW_REPEATS for r in comp.rows):
        notes.append(too_few_note(comp))
    return notes


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def control_table(comp: Comparison) -> str:
    """The controls of both runs: the machine's drift from A to B (not judged)."""
    rows = [[c.group, _fmt(statistics.median(c.a)) if c.a else "",
             _fmt(statistics.median(c.b)) if c.b else "", _pct(c.change),
             f"{len(c.a)}/{len(c.b)}" + (f" ({c.a_failed}/{c.b_failed} FAILED)"
                                        if c.a_failed or c.b_failed else "")]
            for c in comp.controls]
    return ("control: the machine's drift from A to B (images/s of the pinned control; not "
            "judged)\n" + tabulate(rows, headers=["control", "A images/s", "B images/s",
                                                  "change", "n A/B"],
                                   tablefmt="github", disable_numparse=True))


def render_compare(comp: Comparison) -> str:
    """The comparison as text: a header, the table, the stack differences."""
    head = [f"A: {comp.a.label} ({comp.a.status})", f"B: {comp.b.label} ({comp.b.status})"]
    headers, rows = table_rows(comp)
    out = ["\n".join(head), tabulate(rows, headers=headers, tablefmt="github",
                                     disable_numparse=True), *compare_notes(comp)]
    if comp.controls:
        out.append(control_table(comp))
    if comp.stacks:
        lines = ["stack differences:"]
        for name, (a, b) in comp.stacks.items():
            lines.append(f"  {name}: {', '.join(a) or '-'} -> {', '.join(b) or '-'}")
        out.append("\n".join(lines))
    else:
        out.append("stacks: identical")
    counts = ", ".join(f"{n} {v}" for v, n in sorted(comp.counts().items()))
    note = (f"{len(comp.rows)} configurations: {counts}. change = B/A - 1 of the medians "
            f"over ok repeats; interval: exact bootstrap over repeats; significant when it "
            f"excludes 0, the change is beyond {comp.threshold:.1%} and the exact rank-sum "
            f"test of the repeats agrees (p <= {1 - comp.confidence:.0%})")
    if comp.normalised:
        note += ("; ÷control: each cell's figure / the control measured just before and after "
                 "it on the same host and GPUs (the machine's drift cancels); --raw judges "
                 "images/s")
    out.append(note)
    return "\n\n".join(out)


def render_compare_csv(comp: Comparison) -> str:
    """One row per configuration, plain numbers (fractions, not percentages)."""
    out = io.StringIO()
    keys = sorted({k for r in comp.rows for k in r.params})
    fields = ["config", "label", *keys, "a_run", "b_run", "a_median", "b_median", "a_n", "b_n",
              "a_failed", "b_failed", "change", "ci_low", "ci_high", "verdict",
              "profile_changed", "role", "basis", "raw_change", "a_norm_median",
              "b_norm_median", "norm_change", "a_unstable", "b_unstable"]
    writer = RowWriter(out, fields)
    writer.writeheader()
    for r in comp.rows:
        ch = r.change
        writer.writerow({
            "config": r.config, "label": r.label, **{k: r.params.get(k, "") for k in keys},
            "a_run": comp.a.label, "b_run": comp.b.label,
            "a_median": _blank(r.a.median), "b_median": _blank(r.b.median),
            "a_n": len(r.a.values), "b_n": len(r.b.values), "a_failed": len(r.a.failed),
            "b_failed": len(r.b.failed), "a_unstable": _blank(r.a.unstable),
            "b_unstable": _blank(r.b.unstable), "change": _blank(ch.change if ch else None),
            "ci_low": _blank(ch.low if ch else None), "ci_high": _blank(ch.high if ch else None),
            "verdict": r.verdict, "profile_changed": r.profile_changed, "role": "config",
            "basis": r.basis,
            "raw_change": _blank(r.raw_change.change if r.raw_change else None),
            "a_norm_median": _blank(r.a.norm_median), "b_norm_median": _blank(r.b.norm_median),
            "norm_change": _blank(r.norm_change.change if r.norm_change else None),
        })
    for c in comp.controls:  # the machine's drift: a row of its own kind, never judged
        writer.writerow({
            "config": c.config, "label": c.group, "a_run": comp.a.label, "b_run": comp.b.label,
            "a_median": _blank(statistics.median(c.a) if c.a else None),
            "b_median": _blank(statistics.median(c.b) if c.b else None),
            "a_n": len(c.a), "b_n": len(c.b), "a_failed": c.a_failed, "b_failed": c.b_failed,
            "change": _blank(c.change), "verdict": "", "profile_changed": "",
            "role": "control", "basis": "raw", "raw_change": _blank(c.change),
        })
    return out.getvalue()


def _blank(value: float | None) -> Any:
    return "" if value is None else value
