"""What a run folder becomes when it is published: plain values, read once, no network.

A :class:`RunDoc` (the sweep: its tags, summary files, status) holds a :class:`CellDoc` per cell
result on disk. A cell's figures are its ``result.json`` ``metrics``, flattened
(:func:`flatten_figures`):

* a number is a figure (a boolean is 1 or 0: ``telemetry.throttled``);
* a list of numbers is a step series, step 1, 2, ... (``iteration_times``: the per-iteration
  times); a table inside (``per_gpu.iteration_times`` = ``{"0": [...]}``) gives a name per
  entry, joined with ``.`` (``per_gpu.iteration_times.0``);
* text is a tag (``orchestrate.figure.<name>``); None (a NaN on disk) is left out.

``telemetry.csv`` (the workload's GPU samples), where recorded, adds one series per GPU and
field (``telemetry.gpu0.power_w``, ... ``telemetry.gpu0.throttled``), step 0, 1, ... with each
sample's own time. Names are made valid for MLflow (:func:`metric_name`: letters, digits and
``_ - . / : space``; anything else becomes ``_``).

A cell's params are its parameters (as ``result.json`` has them) and its recorded software
stack (``stack.torch``, ``stack.cuda``, ...:
:class:`~orchestrator.results.folders.store.RecordedStack`),
as text: strings as they are, anything else as JSON (``true``, ``null``, ``8``).

The fingerprint of a cell is a hash of everything published of it (params, figures, series,
tags, the artifacts' bytes): equal fingerprints mean nothing to send again.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.results.folders.run_folder import CellResult, RunPaths, Status
from orchestrator.results.folders.store import RecordedStack
from orchestrator.results.reports.summary import summarize_run

#: Prefix of every tag this package writes.
TAG = "orchestrate."
#: Lines of ``log.txt`` published as the cell's log tail, and their most bytes.
LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024
#: Files of a cell folder published as they are, where present (the cell's summary is the
#: workload's ``summary.json``).
CELL_FILES = (RunPaths.CELL_RESULT, RunPaths.CELL_SUMMARY)
#: Plot files of a cell folder or a run folder published as they are.
PLOT_SUFFIXES = (".png", ".svg")
#: Files of a run folder published with the sweep's parent run (regular files only, never
#: through a symbolic link, as every file published).
RUN_FILES = (RunPaths.RUN_META, RunPaths.MATRIX_FILE, RunPaths.SUMMARY_TXT,
             RunPaths.SUMMARY_CSV)
#: The longest tag value sent (MLflow keeps 8000 characters), and the parent's description.
MAX_TAG = 5000
MAX_NOTE = 7900
#: telemetry.csv's numeric columns (workload/telemetry.py), series per GPU.
TELEMETRY_FIELDS = ("power_w", "temp_c", "sm_clock_mhz", "util_pct", "mem_used_mib", "throttled")

_BAD_NAME = re.compile(r"[^\w.\- :/]", re.ASCII)


@dataclass(frozen=True)
class Point:
    """One value of a series."""

    step: int
    value: float
    timestamp_ms: int


@dataclass
class CellDoc:
    """One cell result, ready to publish."""

    cell_id: str
    group: str
    repeat: int
    status: str
    reason: str
    started_ms: int | None
    finished_ms: int | None
    params: dict[str, str]
    figures: dict[str, float]
    series: dict[str, list[Point]]
    tags: dict[str, str]
    #: name -> file to send as it is
    files: dict[str, Path]
    #: name -> text made here (the log's tail)
    texts: dict[str, str]
    #: the JSON document an HTTP collector gets (:func:`cell_document`)
    document: dict[str, Any]
    fingerprint: str = ""


@dataclass
class RunDoc:
    """One run folder, ready to publish."""

    matrix: str
    run_id: str
    root: Path
    status: str  # MLflow's: FINISHED, FAILED, KILLED, RUNNING
    started_ms: int | None
    finished_ms: int | None
    tags: dict[str, str]
    files: dict[str, Path]
    note: str
    cells: list[CellDoc] = field(default_factory=list)
    fingerprint: str = ""


def metric_name(name: str) -> str:
    """``name`` as MLflow accepts a metric, param or tag key: letters, digits, ``_ - . : /``
    and spaces (anything else becomes ``_``), no empty, ``.`` or ``..`` path part, at most 250
    characters."""
    text = _BAD_NAME.sub("_", name)
    parts = [p if p not in ("", ".", "..") else "_" for p in text.split("/")]
    return "/".join(parts)[:250] or "_"


def param_text(value: Any) -> str:
    """A parameter as MLflow keeps it (text): a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def flatten_figures(metrics: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, list[float]],
                                                         dict[str, str]]:
    """A result's ``metrics`` as (figures, series, texts): see the module docstring."""
    figures: dict[str, float] = {}
    series: dict[str, list[float]] = {}
    texts: dict[str, str] = {}

    def visit(key: str, value: Any) -> None:
        if isinstance(value, bool):
            figures[key] = 1.0 if value else 0.0
        elif isinstance(value, int | float):
            if math.isfinite(value):
                figures[key] = float(value)
        elif isinstance(value, list):
            numbers = [float(v) for v in value if isinstance(v, int | float)
                       and not isinstance(v, bool) and math.isfinite(v)]
            if numbers and len(numbers) == len(value):
                series[key] = numbers
        elif isinstance(value, dict):
            for sub, inner in value.items():
                visit(f"{key}.{sub}", inner)
        elif isinstance(value, str):
            texts[key] = value

    for key, value in metrics.items():
        visit(str(key), value)
    return figures, series, texts


def read_run(paths: RunPaths) -> RunDoc:
    """Everything published of the run folder ``paths``: its cells in plan order (a result
    that cannot be read is skipped with a warning, as every reader of a run does)."""
    meta = paths.meta_data()
    results = paths.results()
    rows, table = summarize_run(paths, results=results)
    unstable = {row.group: row.unstable for row in rows}
    rule = rows[0].rule if rows else (paths.plan_data() or {}).get("table_rule") or "median"
    matrix = paths.root.parent.name
    revision = str(meta.get("git_revision") or "")
    counts = _counts(results)
    status = _sweep_status(meta, results)
    tags = {
        f"{TAG}kind": "sweep", f"{TAG}matrix": matrix, f"{TAG}run_id": paths.run_id,
        f"{TAG}backend": str(meta.get("backend") or ""),
        f"{TAG}git_revision": revision, f"{TAG}table_rule": str(rule),
        f"{TAG}cells": str(len(results)),
        **{f"{TAG}cells_{name}": str(n) for name, n in sorted(counts.items())},
        f"{TAG}interrupted": json.dumps(bool(meta.get("interrupted"))),
        f"{TAG}orchestrate_version": str(meta.get("orchestrate_version") or ""),
        f"{TAG}controller_host": str(meta.get("controller_host") or ""),
        f"{TAG}imported": json.dumps(bool(meta.get("imported"))),
    }
    if revision:
        tags["mlflow.source.git.commit"] = revision
    files = {name: paths.root / name for name in RUN_FILES if _regular_file(paths.root / name)}
    files.update(_plots(paths.root))
    run = RunDoc(matrix=matrix, run_id=paths.run_id, root=paths.root, status=status,
                 started_ms=_ms(meta.get("started_at")), finished_ms=_ms(meta.get("finished_at")),
                 tags={k: _clip(v) for k, v in tags.items()}, files=files,
                 note=_note(matrix, paths.run_id, table))
    for result in results:
        run.cells.append(read_cell(paths, result, rule=str(rule), revision=revision,
                                   unstable=unstable.get(result.group), backend=tags[
                                       f"{TAG}backend"]))
    run.fingerprint = _hash({"tags": run.tags, "status": run.status, "note": run.note,
                             "start": run.started_ms, "end": run.finished_ms,
                             "files": _file_hashes(run.files),
                             "cells": [c.fingerprint for c in run.cells]})
    return run


def _note(matrix: str, run_id: str, table: str) -> str:
    """The parent run's description: the summary table, cut to what MLflow keeps of a tag
    (``summary.txt`` among the artifacts has all of it)."""
    head = f"{matrix} {run_id}\n\n```\n"
    tail = "\n```\n"
    room = MAX_NOTE - len(head) - len(tail)
    if len(table) > room:
        cut = table[: room - 80].rsplit("\n", 1)[0]
        table = f"{cut}\n... (cut: summary.txt among the artifacts has the whole table)"
    return head + table + tail


def _counts(results: Iterable[CellResult]) -> dict[str, int]:
    """How many configuration cells (control measurements apart) ended in each status."""
    counts: dict[str, int] = {}
    for res in results:
        if res.role != "control":
            counts[res.status.value] = counts.get(res.status.value, 0) + 1
    return counts


def read_cell(paths: RunPaths, result: CellResult, *, rule: str, revision: str,
              unstable: bool | None, backend: str) -> CellDoc:
    """One cell result of the run ``paths``, ready to publish."""
    folder = paths.cell_dir(result.cell_id)
    figures, lists, texts = flatten_figures(result.metrics)
    start = _ms(result.started_at)
    stamp = start if start is not None else _ms(result.finished_at) or 0
    series = {metric_name(k): [Point(i, v, stamp) for i, v in enumerate(values, start=1)]
              for k, values in lists.items()}
    series.update(telemetry_series(folder / "telemetry.csv"))
    stack = RecordedStack.from_result(result.env, result.provenance)
    params = {metric_name(k): _clip(param_text(v)) for k, v in result.params.items()}
    stack_values = {k: v for k, v in (stack.as_dict() if stack else {}).items() if v is not None}
    params.update({metric_name(f"stack.{k}"): _clip(v) for k, v in stack_values.items()})
    cell_revision = str(result.provenance.get("git_revision") or revision)
    tags = {
        f"{TAG}kind": "cell", f"{TAG}matrix": paths.root.parent.name,
        f"{TAG}run_id": paths.run_id, f"{TAG}cell_id": result.cell_id,
        f"{TAG}group": result.group, f"{TAG}repeat": str(result.repeat),
        f"{TAG}role": result.role, f"{TAG}config_hash": result.config_hash,
        f"{TAG}status": result.status.value, f"{TAG}reason": result.reason,
        f"{TAG}table_rule": rule, f"{TAG}git_revision": cell_revision,
        f"{TAG}unstable": "unknown" if unstable is None else json.dumps(unstable),
        f"{TAG}attempts": str(result.attempts),
        f"{TAG}started_at": "" if result.started_at is None else repr(float(result.started_at)),
        f"{TAG}backend": str(result.provenance.get("backend") or backend),
        f"{TAG}host": str(result.provenance.get("host") or ""),
        **{f"{TAG}figure.{metric_name(k)}": v for k, v in texts.items()},
    }
    if cell_revision:
        tags["mlflow.source.git.commit"] = cell_revision
    files = {name: folder / name for name in CELL_FILES if _regular_file(folder / name)}
    files.update(_plots(folder))
    tail = log_tail(paths.cell_log(result.cell_id), result.log_tail)
    doc = CellDoc(
        cell_id=result.cell_id, group=result.group, repeat=result.repeat,
        status=result.status.value, reason=result.reason, started_ms=start,
        finished_ms=_ms(result.finished_at), params=params, figures={
            metric_name(k): v for k, v in figures.items()}, series=series,
        tags={k: _clip(v) for k, v in tags.items()}, files=files,
        texts={"log_tail.txt": tail} if tail else {}, document={})
    doc.document = cell_document(paths, result, doc, stack_values, unstable)
    doc.fingerprint = _hash({
        "params": doc.params, "figures": doc.figures, "tags": doc.tags,
        "series": {k: [(p.step, p.value, p.timestamp_ms) for p in v]
                   for k, v in sorted(doc.series.items())},
        "status": doc.status, "times": [doc.started_ms, doc.finished_ms],
        "files": _file_hashes(doc.files), "texts": doc.texts})
    return doc


def cell_document(paths: RunPaths, result: CellResult, doc: CellDoc, stack: Mapping[str, str],
                  unstable: bool | None) -> dict[str, Any]:
    """The JSON document of one cell for an HTTP collector: flat enough for Elastic, Loki or
    a Grafana data source (parameters and figures keep their JSON types)."""
    from orchestrator.results.reports.export import iso

    when = result.finished_at or result.started_at
    return {
        "schema": "orchestrate.cell/1",
        "id": f"{paths.root.parent.name}/{paths.run_id}/{result.cell_id}",
        "@timestamp": iso(when) if when else "",
        "matrix": paths.root.parent.name, "run_id": paths.run_id, "cell_id": result.cell_id,
        "group": result.group, "repeat": result.repeat, "role": result.role,
        "status": result.status.value, "reason": result.reason,
        "config_hash": result.config_hash, "table_rule": doc.tags[f"{TAG}table_rule"],
        "unstable": unstable, "git_revision": doc.tags[f"{TAG}git_revision"],
        "backend": doc.tags[f"{TAG}backend"], "host": doc.tags[f"{TAG}host"],
        "started_at": iso(result.started_at), "finished_at": iso(result.finished_at),
        "duration_s": result.duration_s, "attempts": result.attempts,
        "params": dict(result.params), "stack": dict(stack), "figures": dict(doc.figures),
    }


def telemetry_series(path: Path) -> dict[str, list[Point]]:
    """``telemetry.csv`` as series per GPU and field, step 0, 1, ... per GPU, each sample at
    its own time; rows that cannot be read are skipped; no file: none."""
    if not _regular_file(path):  # none recorded (or a link: not followed)
        return {}
    try:
        text = _read_text(path)
    except OSError:  # unreadable: the figures still go
        return {}
    out: dict[str, list[Point]] = {}
    steps: dict[str, int] = {}
    for row in csv.DictReader(io.StringIO(text)):
        try:
            stamp = int(round(float(row["timestamp"]) * 1000))
            gpu = int(row["gpu"])
        except (KeyError, TypeError, ValueError):
            continue
        step = steps.get(str(gpu), 0)
        steps[str(gpu)] = step + 1
        for name in TELEMETRY_FIELDS:
            value = _number(row.get(name))
            if value is not None:
                out.setdefault(f"telemetry.gpu{gpu}.{name}", []).append(
                    Point(step, value, stamp))
    return out


def log_tail(path: Path, fallback: Iterable[str] = ()) -> str:
    """The last :data:`LOG_TAIL_LINES` lines of a cell's ``log.txt`` (at most
    :data:`LOG_TAIL_BYTES`; the output was scrubbed of secrets when it was written), else the
    result's own log tail."""
    try:  # never through a link: a log.txt linked out of the run folder is not sent
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return "\n".join(fallback) + ("\n" if fallback else "")
    with os.fdopen(fd, "rb") as fh:
        if not _regular(fh.fileno()):
            return ""
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - LOG_TAIL_BYTES))
        data = fh.read(LOG_TAIL_BYTES)
    lines = data.decode("utf-8", "replace").splitlines()
    if size > LOG_TAIL_BYTES and lines:
        lines = lines[1:]  # the first line read is cut
    return "\n".join(lines[-LOG_TAIL_LINES:]) + ("\n" if lines else "")


def mlflow_status(status: str) -> str:
    """A cell's status as MLflow's run status."""
    if status == Status.OK.value:
        return "FINISHED"
    return "KILLED" if status == Status.CANCELLED.value else "FAILED"


def _sweep_status(meta: Mapping[str, Any], results: list[CellResult]) -> str:
    if meta.get("interrupted"):
        return "KILLED"
    if not meta.get("finished_at"):
        return "RUNNING"
    return "FINISHED" if results and all(r.status is Status.OK for r in results) else "FAILED"


def _plots(folder: Path) -> dict[str, Path]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return {}
    return {e.name: Path(e.path) for e in entries
            if e.name.endswith(PLOT_SUFFIXES) and e.is_file(follow_symlinks=False)}


def _regular_file(path: Path) -> bool:
    """A regular file itself, not a link to one: what a run folder holds of its own (a link
    planted in a shared results folder must not send a file from elsewhere)."""
    import stat

    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_text(path: Path) -> str:
    from orchestrator.results.folders.run_folder import read_regular

    try:
        return read_regular(path).decode("utf-8", "replace")
    except ConfigError:
        return ""


def _regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


def _number(text: Any) -> float | None:
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _ms(seconds: Any) -> int | None:
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and math.isfinite(
            seconds):
        return int(round(seconds * 1000))
    return None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TAG else text[: MAX_TAG - 1] + "…"


def _file_hashes(files: Mapping[str, Path]) -> dict[str, str]:
    out = {}
    for name, path in sorted(files.items()):
        digest = hashlib.sha256()
        try:
            with path.open("rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
        except OSError:
            continue
        out[name] = digest.hexdigest()
    return out


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
