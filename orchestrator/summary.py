"""Summaries of a run, built only from what is on disk.

One row per cell group (a cell without its repeat): the median over the repeats that ended ok,
the spread (min..max), and where the matrix has a ``gpus`` axis, speedup and scaling efficiency
against the 1-GPU group with otherwise equal parameters.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from orchestrator.results import CellResult, RunPaths, Status, read_json


def throughput_key(mode: str, kind: str = "total_ips") -> str:
    """The DLLogger metric name for a mode: ``train.total_ips`` or ``val.total_ips``."""
    return f"{'train' if mode == 'train' else 'val'}.{kind}"


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.median(vals) if vals else None


@dataclass
class GroupRow:
    """The summary of one cell group."""

    group: str
    params: dict[str, Any]
    runs: int = 0
    ok: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    ips: float | None = None
    ips_min: float | None = None
    ips_max: float | None = None
    compute_ips: float | None = None
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    loss: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    ratio: float | None = None  # vs the --baseline row (e.g. Bitfusion / native)

    def csv_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"group": self.group, **self.params}
        row.update(
            runs=self.runs, ok=self.ok,
            statuses=";".join(f"{k}={v}" for k, v in sorted(self.statuses.items())),
            images_per_s=self.ips, images_per_s_min=self.ips_min, images_per_s_max=self.ips_max,
            compute_images_per_s=self.compute_ips, latency_p50_ms=self.latency_p50_ms,
            latency_p99_ms=self.latency_p99_ms, loss=self.loss, speedup=self.speedup,
            efficiency=self.efficiency, ratio_vs_baseline=self.ratio,
        )
        return row


def summarize(results: Sequence[CellResult]) -> list[GroupRow]:
    """Group results by cell group (plan order) and compute medians, speedup, efficiency."""
    rows: dict[str, GroupRow] = {}
    ok_by_group: dict[str, list[CellResult]] = {}
    for res in results:
        row = rows.setdefault(res.group, GroupRow(res.group, dict(res.params)))
        row.runs += 1
        row.statuses[res.status.value] = row.statuses.get(res.status.value, 0) + 1
        if res.status is Status.OK:
            ok_by_group.setdefault(res.group, []).append(res)
    for row in rows.values():
        ok = ok_by_group.get(row.group, [])
        row.ok = len(ok)
        mode = row.params.get("mode", "train")
        ips = [r.metrics.get(throughput_key(mode)) for r in ok]
        ips = [float(v) for v in ips if isinstance(v, int | float)]
        if ips:
            row.ips, row.ips_min, row.ips_max = statistics.median(ips), min(ips), max(ips)
        row.compute_ips = _median(r.metrics.get(throughput_key(mode, "compute_ips")) for r in ok)
        if mode != "train":
            for pct, attr in ((50, "latency_p50_ms"), (99, "latency_p99_ms")):
                sec = _median(r.metrics.get(f"val.compute_latency_at{pct}") for r in ok)
                setattr(row, attr, None if sec is None else sec * 1000.0)
        else:
            row.loss = _median(r.metrics.get("train.loss") for r in ok)
    _scaling(list(rows.values()))
    return list(rows.values())


def _baselines(rows: Sequence[GroupRow], key: str, value: str
               ) -> list[tuple[GroupRow, GroupRow]]:
    """(row, its baseline): the row with ``key = value`` and otherwise equal parameters, both
    with a throughput."""
    def others(row: GroupRow) -> str:
        return repr(sorted((k, v) for k, v in row.params.items() if k != key))

    base = {others(r): r for r in rows if str(r.params.get(key)) == value and r.ips}
    return [(row, base[others(row)]) for row in rows
            if row.ips is not None and others(row) in base]


def _scaling(rows: list[GroupRow]) -> None:
    """Speedup and efficiency vs the 1-GPU row with otherwise equal parameters."""
    if len({r.params.get("gpus") for r in rows}) < 2:
        return
    for row, ref in _baselines(rows, "gpus", "1"):
        row.speedup = row.ips / ref.ips
        row.efficiency = row.speedup / row.params["gpus"]


def add_ratios(rows: Sequence[GroupRow], key: str, value: str) -> int:
    """Ratio of each row's images/s to the row with ``key = value`` and otherwise equal params.

    E.g. ``hardware=v100`` gives Bitfusion/native. Returns how many rows got a ratio.
    """
    pairs = _baselines(rows, key, value)
    for row, ref in pairs:
        row.ratio = row.ips / ref.ips
    return len(pairs)


#: Column order of tables: the order of cell ids, then the rest in model order.
_LEADING = ("hardware", "arch", "mode", "gpus", "batch_size", "precision")


def column_order(keys: Sequence[str]) -> list[str]:
    """Parameters in table order: hardware, arch, mode, gpus, batch_size, precision, others."""
    return [k for k in _LEADING if k in keys] + [k for k in keys if k not in _LEADING]


def varying_keys(params: Sequence[dict[str, Any]], always: Sequence[str] = (),
                 exclude: Sequence[str] = ()) -> list[str]:
    """The parameters that differ between ``params`` (plus ``always``), in table order."""
    keys = list(params[0]) if params else []
    return column_order([
        k for k in keys if k not in exclude
        and (k in always or len({repr(p.get(k)) for p in params}) > 1)
    ])


def varying_params(rows: Sequence[GroupRow], plan_varying: Sequence[str] = ()) -> list[str]:
    """Parameters shown as table columns: hardware, then those that differ between rows."""
    return varying_keys([r.params for r in rows], always=("hardware", *plan_varying))


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def table_cells(
    rows: Sequence[GroupRow], plan_varying: Sequence[str] = (), baseline: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the summary table (the text and HTML tables share them)."""
    cols = varying_params(rows, plan_varying)
    infer = any(r.params.get("mode") == "infer" for r in rows)
    scaling = any(r.speedup is not None for r in rows)
    headers = [*cols, "ok", "images/s (median)", "min..max"]
    if scaling:
        headers += ["speedup", "efficiency"]
    if infer:
        headers += ["p50 ms", "p99 ms"]
    ratios = baseline is not None and any(r.ratio is not None for r in rows)
    if ratios:
        headers.append(f"vs {baseline}")
    table = []
    for r in rows:
        line = [str(r.params.get(c, "")) for c in cols]
        line += [f"{r.ok}/{r.runs}", _fmt(r.ips),
                 f"{_fmt(r.ips_min)}..{_fmt(r.ips_max)}" if r.ips is not None else ""]
        if scaling:
            line += [_fmt(r.speedup, 2), "" if r.efficiency is None else f"{r.efficiency:.0%}"]
        if infer:
            line += [_fmt(r.latency_p50_ms, 2), _fmt(r.latency_p99_ms, 2)]
        if ratios:
            line.append("" if r.ratio is None else f"{r.ratio:.2f}x")
        table.append(line)
    return headers, table


def render_table(
    rows: Sequence[GroupRow], plan_varying: Sequence[str] = (), baseline: str | None = None
) -> str:
    """The human table (tabulate): one row per group."""
    if not rows:
        return "(no results)"
    headers, table = table_cells(rows, plan_varying, baseline)
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def render_csv(rows: Sequence[GroupRow]) -> str:
    out = io.StringIO()
    dicts = [r.csv_row() for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields += [k for k in d if k not in fields]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for d in dicts:
        writer.writerow({k: "" if v is None else v for k, v in d.items()})
    return out.getvalue()


def parse_baseline(text: str | None) -> tuple[str, str] | None:
    """``KEY=VALUE`` of ``--baseline`` (e.g. ``hardware=v100``)."""
    if not text:
        return None
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        from orchestrator.errors import ConfigError

        raise ConfigError("expected KEY=VALUE, e.g. --baseline hardware=v100", field="--baseline")
    return key.strip(), value.strip()


def write_summary(
    paths: RunPaths, baseline: str | None = None, results: list[CellResult] | None = None
) -> tuple[list[GroupRow], str]:
    """Summarize a run folder; write summary.csv and summary.txt; return the table.

    ``baseline`` (``KEY=VALUE``) adds each row's images/s ratio to the matching baseline row.
    ``results``: the run's results when the caller has just read them (else read from disk).
    """
    rows = summarize(paths.results() if results is None else results)
    plan_varying: list[str] = []
    if paths.plan.exists():
        plan = read_json(paths.plan)
        plan_varying = plan.get("varying", [])
        baseline = baseline or plan.get("baseline")
    base = parse_baseline(baseline)
    if base:
        add_ratios(rows, *base)
    table = render_table(rows, plan_varying, baseline=baseline)
    paths.summary_csv.write_text(render_csv(rows), encoding="utf-8")
    paths.summary_txt.write_text(table + "\n", encoding="utf-8")
    return rows, table
