"""Long-format export of any selection of runs: one row per cell result and figure.

Every row carries the run (matrix, run id, start time in UTC ISO 8601, status, backend, git
revision), the cell (id, group, configuration hash, repeat, status, reason, duration, role:
``config`` or ``control``, a measurement of the matrix's ``[control]``), every
parameter as a ``param.NAME`` column, the stack as ``stack.FIELD`` columns, and one figure:
``figure`` (its name) and ``value``; a cell measured beside a control also has its
normalised figures (``norm.train.total_ips``: the ratio to the control). A cell with no
figure (it failed) has one row with both empty, so failures are in the data too. When any of
the runs ran Slurm jobs, every row also carries Slurm's accounting of its cell's job as
``slurm.FIELD`` columns (job id, state, exit code, elapsed seconds, node list).
``pandas.read_csv`` / ``pandas.read_json`` read either format as is; a wide table is one
``pivot_table(index=..., columns="figure", values="value")`` away.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from orchestrator.results.folders import safejson
from orchestrator.results.folders.store import (
    SLURM_FIELDS,
    CellRecord,
    RecordedStack,
    RunRecord,
    Store,
)
from orchestrator.results.reports.csv_out import RowWriter

RUN_COLUMNS = ("matrix", "run_id", "run_started", "run_status", "backend", "git_revision")
CELL_COLUMNS = ("cell_id", "group", "config", "repeat", "status", "reason", "duration_s",
                "role")


@dataclass(frozen=True)
class Selection:
    """Which cells and figures to export (empty: no restriction)."""

    where: tuple[tuple[str, tuple[str, ...]], ...] = ()  # parameter -> accepted values (text)
    figures: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()  # cell statuses

    def keeps(self, cell: CellRecord) -> bool:
        if self.statuses and cell.status not in self.statuses:
            return False
        return all(_text(cell.params.get(key)) in values for key, values in self.where)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def iso(timestamp: float | None) -> str:
    """UTC ISO 8601 with a Z, or empty."""
    if timestamp is None:
        return ""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows(store: Store, runs: Sequence[RunRecord], selection: Selection = Selection(),
         param_names: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """The long-format rows of ``runs`` (oldest first), filtered by ``selection``;
    ``param_names``: their parameter names when the caller has already looked them up."""
    by_pk = {r.pk: r for r in runs}
    if param_names is None:
        param_names = _param_names(store, runs)
    slurm = _any_slurm(runs)
    for chunk in _chunks([r.pk for r in runs], 200):
        for cell in store.cells(chunk, figures=True):
            if not selection.keeps(cell):
                continue
            run = by_pk[cell.run_pk]
            base: dict[str, Any] = {
                "matrix": run.matrix, "run_id": run.run_id, "run_started": iso(run.started_at),
                "run_status": run.status, "backend": run.backend or "",
                "git_revision": run.git_revision or "", "cell_id": cell.cell_id,
                "group": cell.group, "config": cell.config, "repeat": cell.repeat,
                "status": cell.status, "reason": cell.reason, "duration_s": cell.duration_s,
                "role": cell.role,
            }
            base.update({f"param.{k}": cell.params.get(k) for k in param_names})
            stack = cell.stack.as_dict() if cell.stack else {}
            base.update({f"stack.{k}": stack.get(k) for k in RecordedStack.names()})
            if slurm:
                base.update({f"slurm.{k}": cell.slurm.get(k) for k in SLURM_FIELDS})
            figures = sorted(cell.figures.items())
            if selection.figures:
                figures = [(k, v) for k, v in figures if k in selection.figures]
            if not figures and (not cell.ok or not selection.figures):
                yield {**base, "figure": None, "value": None}
            for name, value in figures:
                yield {**base, "figure": name, "value": value}


def columns(store: Store, runs: Sequence[RunRecord], param_names: Sequence[str] | None = None
            ) -> list[str]:
    """Column order of the export (``param_names``: as for :func:`rows`)."""
    if param_names is None:
        param_names = _param_names(store, runs)
    slurm = [f"slurm.{k}" for k in SLURM_FIELDS] if _any_slurm(runs) else []
    return [*RUN_COLUMNS, *CELL_COLUMNS, *[f"param.{k}" for k in param_names],
            *[f"stack.{k}" for k in RecordedStack.names()], *slurm, "figure", "value"]


def _any_slurm(runs: Sequence[RunRecord]) -> bool:
    """Whether any of ``runs`` ran Slurm jobs (then rows carry ``slurm.*`` columns)."""
    return any(r.slurm_jobs for r in runs)


def _param_names(store: Store, runs: Sequence[RunRecord]) -> list[str]:
    if not runs:
        return []
    names: list[str] = []
    for chunk in _chunks([r.pk for r in runs], 500):
        marks = ",".join("?" * len(chunk))
        for (key,) in store.conn.execute(
            "SELECT DISTINCT p.key FROM params p JOIN cells c ON c.cell_pk = p.cell_pk "
            f"WHERE c.run_pk IN ({marks}) ORDER BY p.key", chunk):
            if key not in names:
                names.append(key)
    return names


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def write_csv(store: Store, runs: Sequence[RunRecord], selection: Selection, out: TextIO
              ) -> int:
    """Write CSV to ``out``; returns the rows written."""
    names = _param_names(store, runs)  # one query for the header and the rows
    writer = RowWriter(out, columns(store, runs, names))
    writer.writeheader()
    n = 0
    for row in rows(store, runs, selection, names):
        writer.writerow({k: _csv_value(v) for k, v in row.items()})
        n += 1
    return n


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def write_json(store: Store, runs: Sequence[RunRecord], selection: Selection,
               out: TextIO) -> int:
    """Write a JSON list of records to ``out`` (streamed); returns the rows written. Standard
    JSON: a NaN or infinite figure (an old run's) is null."""
    out.write("[")
    n = 0
    for row in rows(store, runs, selection):
        out.write(("\n" if n == 0 else ",\n") + safejson.dumps(row, default=str))
        n += 1
    out.write("\n]\n" if n else "]\n")
    return n
