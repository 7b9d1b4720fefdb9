"""DLLogger output: reading raports and logs, and re-summarizing their per-iteration records.

NVIDIA DLLogger (v1.1) writes, through its backends:

``JSONStreamBackend`` (DLE's ``--raport-file``)
    one ``DLLL {json}`` object per line: ``{"timestamp": "<epoch s>", "datetime": ...,
    "elapsedtime": ..., "type": "LOG", "step": ..., "data": {...}}`` or ``"type": "METADATA"``
    with ``metric`` and ``metadata`` (unit, format). Non-finite floats are written as ``NaN``
    / ``Infinity``.
``StdOutBackend``
    ``DLL <local time> - <step> <metric> : <value> <unit> ...`` with the step as the program's
    ``step_format`` prints it (DLE: ``Epoch: 0 Iteration: 10``, ``Summary:``; default:
    ``str(step)``), values in the metric's ``format``. It logs at DEFAULT verbosity, so DLE's
    VERBOSE metrics (``data_time``, ``compute_time``, latency quantiles) are not on stdout.

Steps: ``"PARAMETER"`` (the program's arguments), ``[epoch, iteration]`` (training),
``[epoch, iteration, val_iteration]`` (validation), ``[epoch]`` (epoch means) and ``[]`` (the
run summary, DLE's ``logger.end()``). DLE numbers iterations from 1 and with ``--print-freq N``
logs every Nth iteration with the mean of the N since the previous record; it logs each step
once per verbosity level, back to back (merged here into one record).

Re-summarizing follows :mod:`workload.metrics` (one definition of the figures): warmup
iterations dropped, throughput by totals, nearest-rank percentiles; see :func:`recompute`.
Limits: the iterations after an epoch's last record (a ``--print-freq`` remainder) are only in
DLLogger's epoch means and are not counted; under DDP only rank 0 logs, so its times stand for
the step (our workload keeps the slowest rank's).
"""

from __future__ import annotations

import io
import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import LogFormatError, Problem
from orchestrator.results.folders import safejson
from workload import metrics as wm

Step = str | tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class DLLRecord:
    """One DLLogger LOG record (records of one step logged back to back are merged)."""

    line: int
    step: Step
    data: dict[str, Any]
    time: float | None = None


@dataclass
class DLLoggerLog:
    """A DLLogger log as read: parameters, metric metadata and LOG records in order."""

    file: str
    form: Literal["json", "stdout"]
    parameters: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: list[DLLRecord] = field(default_factory=list)
    last_line: int = 0

    @property
    def summary(self) -> DLLRecord | None:
        """The run summary (step ``[]``: DLE's ``logger.end()``), the last one logged."""
        return next((r for r in reversed(self.records) if r.step == ()), None)

    @property
    def times(self) -> list[float]:
        return [r.time for r in self.records if r.time is not None]


_DLLL = "DLLL "
_DLL_LINE = re.compile(r"^DLL (\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?) - (.*)$")
_DLL_KEY = re.compile(r"(?:^|(?<=\s))([^\s:]+) : ")
#: A step's numbers (epoch, iteration) have at most 18 digits: longer is no step (and Python
#: refuses to read an integer of more than 4300 digits at all).
_STEP_DIGITS = 18
_EPOCH_STEP = re.compile(
    r"Epoch: (\d{1,18})(?: Iteration: (\d{1,18}))?(?: Validation Iteration: (\d{1,18}))?")
_TUPLE_STEP = re.compile(r"[(\[]\s*((?:-?\d{1,18}\s*,\s*)*-?\d{1,18})?\s*,?\s*[)\]]")
_NAMED_STEP = re.compile(r"(\S+) Iteration: (\d{1,18})")
_LONG_NUMBER = re.compile(r"\d{19,}")


#: Where a DLLogger line starts, in a whole text (after a newline or a ``\\r``).
_ANY_DLL = re.compile(r"(?:^|(?<=\r))(?:DLLL |DLL \d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"
                      r"(?:\.\d+)? - )", re.MULTILINE)


def looks_like_raport(text: str) -> bool:
    """True when the first non-empty line is a ``DLLL`` record (a JSONStreamBackend file)."""
    first = next((ln for ln in io.StringIO(text) if ln.strip()), "")
    return first.startswith(_DLLL)


def has_dllogger_lines(text: str) -> bool:
    """True when ``text`` holds DLLogger JSON (``DLLL``) or stdout (``DLL <time> -``) lines."""
    return _ANY_DLL.search(text) is not None


def read_dllogger(text: str, file: str) -> DLLoggerLog:
    """Read DLLogger output: ``DLLL`` JSON lines when there are any, else the stdout lines.

    A raport (its first line a ``DLLL`` record) must hold nothing else; in a log, other
    lines are the program's own output and are skipped. Raises :class:`LogFormatError` listing
    every malformed record with its line.
    """
    lines = text.splitlines()
    if any(ln.startswith(_DLLL) for ln in lines):
        return _read_json_lines(lines, file, strict=looks_like_raport(text))
    return _read_stdout_lines(lines, file)


@dataclass(frozen=True)
class FileForm:
    """What a pass over a file found: its form, and whether it is a raport (strict)."""

    json: bool
    raport: bool
    any_records: bool


def read_dllogger_file(path: Path, file: str, form: FileForm) -> DLLoggerLog:
    """:func:`read_dllogger` of a file, read line by line (a raport of hundreds of MB is never
    held whole as text); ``form`` from a first pass over it (:func:`scan_form`)."""
    with path.open("r", encoding="utf-8", newline=None) as fh:
        lines = (line.rstrip("\n") for line in fh)
        if form.json:
            return _read_json_lines(lines, file, strict=form.raport)
        return _read_stdout_lines(lines, file)


def scan_form(lines: Iterable[str]) -> FileForm:
    """The :class:`FileForm` of these lines (one pass)."""
    first: str | None = None
    json_lines = any_records = False
    for line in lines:
        if first is None and line.strip():
            first = line
        if line.startswith(_DLLL):
            json_lines = any_records = True
            break  # a DLLL line decides it (and first is known by then)
        if not any_records and _DLL_LINE.match(line.rstrip("\r\n")):
            any_records = True
    return FileForm(json_lines, (first or "").startswith(_DLLL), any_records)


_TRUNCATED = " (the file ends here: a crashed or unfinished run?)"


def _read_json_lines(lines: Iterable[str], file: str, strict: bool) -> DLLoggerLog:
    out = DLLoggerLog(file, "json")
    problems: list[Problem] = []
    raw: list[DLLRecord] = []
    number = 0
    malformed_at = 0  # the line of the last malformed record (a truncated last line?)
    for number, line in enumerate(lines, start=1):
        if not line.startswith(_DLLL):
            if strict and line.strip():
                problems.append(Problem(file, f"line {number}", "not a DLLogger record (every "
                                        "line of a raport starts with 'DLLL ')"))
            continue
        try:  # NaN and Infinity kept: DLLogger writes them, and a figure's judge sees them
            obj = safejson.loads(line[len(_DLLL):], finite=False)
        except json.JSONDecodeError as exc:
            problems.append(Problem(file, f"line {number}",
                                    f"malformed DLLogger record: {exc.msg} at column "
                                    f"{exc.colno + len(_DLLL)}"))
            malformed_at = number
            continue
        except safejson.JSONLimitError as exc:
            problems.append(Problem(file, f"line {number}", f"not a DLLogger record: {exc}"))
            continue
        problem = _json_record(obj, number, out, raw)
        if problem:
            problems.append(Problem(file, f"line {number}", problem))
    out.last_line = number
    if problems:
        if malformed_at and malformed_at == number and problems[-1].field == f"line {number}":
            last = problems[-1]
            problems[-1] = Problem(last.file, last.field, last.message + _TRUNCATED)
        raise LogFormatError(problems)
    out.records = _merge(raw)
    return out


def _json_record(obj: Any, number: int, out: DLLoggerLog, raw: list[DLLRecord]) -> str | None:
    """Add one decoded DLLL object to ``out``/``raw``; return a problem or None."""
    if not isinstance(obj, dict):
        return "a DLLogger record is a JSON object"
    kind = obj.get("type")
    if kind == "METADATA":
        if not isinstance(obj.get("metric"), str) or not isinstance(obj.get("metadata"), dict):
            return "a METADATA record needs 'metric' (text) and 'metadata' (object)"
        out.metadata.setdefault(obj["metric"], {}).update(obj["metadata"])
        return None
    if kind != "LOG":
        return f"unknown record type {kind!r} (DLLogger writes LOG and METADATA)"
    step, data = obj.get("step"), obj.get("data")
    if not isinstance(data, dict) or not isinstance(step, str | list):
        return "a LOG record needs 'step' (text or list) and 'data' (object)"
    if step == "PARAMETER":
        out.parameters.update(data)
        return None
    try:
        when = float(obj["timestamp"]) if "timestamp" in obj else None
    except (TypeError, ValueError, OverflowError):
        return f"timestamp {_short(obj.get('timestamp'))} is not a number of seconds"
    if when is not None and not is_plausible_time(when):
        return f"timestamp {_short(obj.get('timestamp'))} is not a time {_TIME_RANGE}"
    raw.append(DLLRecord(number, step if isinstance(step, str) else tuple(step), data, when))
    return None


def _read_stdout_lines(lines: Iterable[str], file: str) -> DLLoggerLog:
    out = DLLoggerLog(file, "stdout")
    problems: list[Problem] = []
    raw: list[DLLRecord] = []
    number = 0
    for number, line in enumerate(lines, start=1):
        match = _DLL_LINE.match(line.rstrip("\r"))
        if not match:
            continue
        try:
            when = datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC).timestamp()
        except (ValueError, OverflowError) as exc:  # 2024-13-45, year 0
            problems.append(Problem(file, f"line {number}", f"date {match.group(1)!r} is not "
                                    f"a date ({exc})"))
            continue
        if not is_plausible_time(when):
            problems.append(Problem(file, f"line {number}", f"date {match.group(1)!r} is not "
                                    f"a time {_TIME_RANGE}"))
            continue
        body = match.group(2)
        keys = list(_DLL_KEY.finditer(body))
        head = body[: keys[0].start()] if keys else body
        step = _stdout_step(head)
        if step is None:
            long = _LONG_NUMBER.search(head)
            problems.append(Problem(file, f"line {number}", (
                f"a step number of {len(long.group())} digits (an epoch or iteration has at "
                f"most {_STEP_DIGITS})" if long else
                f"unrecognised DLLogger step {_short(head.strip())}")))
            continue
        values: dict[str, str] = {}
        for i, found in enumerate(keys):
            end = keys[i + 1].start() if i + 1 < len(keys) else len(body)
            values[found.group(1)] = body[found.end():end].strip()
        if step == "PARAMETER":
            out.parameters.update({k: _literal(v) for k, v in values.items()})
            continue
        data: dict[str, Any] = {}
        for key, text in values.items():
            number_text = text.split(" ", 1)[0] if text else ""
            value = _number(number_text)
            if value is _BAD:
                problems.append(Problem(file, f"line {number}",
                                        f"{key}: {number_text!r} is not a number"))
                continue
            data[key] = value
        raw.append(DLLRecord(number, step, data, when))
    out.last_line = number
    if problems:
        raise LogFormatError(problems)
    out.records = _merge(raw)
    return out


def _stdout_step(head: str) -> Step | None:
    """The step of a StdOutBackend line from its printed form (DLE's or DLLogger's default)."""
    text = head.strip()
    if text == "PARAMETER":
        return "PARAMETER"
    if text in ("Summary:", ""):
        return ()
    if m := _EPOCH_STEP.fullmatch(text):
        return tuple(int(g) for g in m.groups() if g is not None)
    if m := _TUPLE_STEP.fullmatch(text):
        return tuple(int(v) for v in m.group(1).split(",")) if m.group(1) else ()
    if m := _NAMED_STEP.fullmatch(text):
        return (m.group(1), int(m.group(2)))
    return None


_BAD = object()

#: Times a log may state, in seconds since the epoch: 1970 up to (not including) 2100. Beyond
#: them a clock or a file is broken, and a run id made from one would sort wrong for good.
EARLIEST_TIME, LATEST_TIME = 0.0, 4102444800.0
_TIME_RANGE = "from 1970 to 2099"


def is_plausible_time(when: float) -> bool:
    """Whether ``when`` (seconds since the epoch) can be a log's time (:data:`LATEST_TIME`)."""
    return math.isfinite(when) and EARLIEST_TIME <= when < LATEST_TIME


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _number(text: str) -> Any:
    if text == "None":
        return None
    try:
        return int(text) if re.fullmatch(r"-?\d{1,300}", text) else float(text)
    except ValueError:
        return _BAD


def _literal(text: str) -> Any:
    """A PARAMETER value as printed (``str(value)``): bool, None, number, else the text."""
    if text in ("True", "False"):
        return text == "True"
    value = _number(text)
    return text if value is _BAD else value


def _merge(records: list[DLLRecord]) -> list[DLLRecord]:
    """Join records of one step logged back to back (DLE logs each verbosity level apart)."""
    out: list[DLLRecord] = []
    for rec in records:
        prev = out[-1] if out else None
        if prev is not None and prev.step == rec.step and not prev.data.keys() & rec.data.keys():
            out[-1] = replace(prev, data={**prev.data, **rec.data})
        else:
            out.append(rec)
    return out


class Prefixed(Mapping[str, Any]):
    """The entries of a record's data under ``prefix`` (``train.``), by their names without
    it: a view, not a copy."""

    __slots__ = ("data", "prefix")

    def __init__(self, data: Mapping[str, Any], prefix: str):
        self.data, self.prefix = data, prefix

    def __getitem__(self, key: str) -> Any:
        return self.data[self.prefix + key]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.prefix + key in self.data

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.data if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass(frozen=True, slots=True)
class Point:
    """A per-iteration record of one prefix: it covers ``k`` iterations (DLE's print
    frequency averages the iterations between two records)."""

    line: int
    k: int
    data: Mapping[str, Any]


def iteration_series(records: Sequence[DLLRecord], prefix: str) -> list[Point]:
    """The per-iteration records of ``prefix`` (``train``/``val``), in log order.

    A record counts the iterations since the previous record of its step group (the step
    without its last number), the first of a group ``max(1, its number)``: DLE numbers
    iterations from 1 and, with ``--print-freq N``, logs every Nth with the mean of N.
    """
    points: list[Point] = []
    last: dict[tuple[Any, ...], int] = {}
    lead = prefix + "."
    for rec in records:
        step = rec.step
        if not (isinstance(step, tuple) and len(step) >= 2
                and all(isinstance(s, int) and not isinstance(s, bool) for s in step)):
            continue
        if not any(k.startswith(lead) for k in rec.data):
            continue
        data = Prefixed(rec.data, lead)  # a view: a long log's records are not copied
        group, pos = step[:-1], step[-1]
        prev = last.get(group)
        k = pos - prev if prev is not None and pos > prev else (
            max(1, pos) if prev is None else 1)
        last[group] = pos
        points.append(Point(rec.line, k, data))
    return points


def drop_warmup(points: Sequence[Point], warmup: int) -> tuple[list[Point], int]:
    """Drop every record that starts within the first ``warmup`` iterations; return the kept
    records and how many iterations were dropped (more than ``warmup`` when a record straddles
    the boundary: it holds a warmup iteration's time)."""
    seen = 0
    kept: list[Point] = []
    for point in points:
        if seen < warmup:
            seen += point.k
            continue
        kept.append(point)
    return kept, min(seen, sum(p.k for p in points))


def _num(value: Any) -> float | None:
    """A number as a float; None for anything else (bools, text, None)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _nums(points: Sequence[Point], *keys: str) -> list[float] | None:
    """Every record's value of the first of ``keys`` it has; None unless all records have one."""
    out = []
    for point in points:
        value = _num(next((point.data[k] for k in keys if k in point.data), None))
        if value is None:
            return None
        out.append(value)
    return out


def _expand(values: Sequence[float], counts: Sequence[int]) -> list[float]:
    return [v for v, k in zip(values, counts, strict=True) for _ in range(k)]


def recompute(prefix: str, points: Sequence[Point], global_batch: int | None
              ) -> tuple[dict[str, float], str, list[str]]:
    """Throughput and latency of the kept records by the rule of :mod:`workload.metrics`.

    With per-iteration times (``data_time`` + ``compute_time``/``compute_latency``) and the
    global batch: exactly :func:`workload.metrics.summarize` (records averaging k iterations
    count k times; percentiles then cannot be recomputed). Without times: each iteration's
    ``total_ips`` is global_batch / t, so global_batch x N / sum(t) = N / sum(1 / ips) — the
    totals rule needing no batch size; exact when every record is one iteration, else an
    approximation (DLLogger averaged ips within each record). Returns (figures, rule, notes).
    """
    counts = [p.k for p in points]
    single = all(k == 1 for k in counts)
    data_t = _nums(points, "data_time")
    comp_t = _nums(points, "compute_time", "compute_latency")
    notes: list[str] = []
    if data_t is not None and comp_t is not None and global_batch:
        if single:
            return wm.summarize(prefix, data_t, comp_t, global_batch), "times", notes
        d, c = _expand(data_t, counts), _expand(comp_t, counts)
        expanded = {
            f"{prefix}.total_ips": wm.images_per_second(global_batch,
                                                        [a + b for a, b in zip(d, c, strict=True)]),
            f"{prefix}.compute_ips": wm.images_per_second(global_batch, c),
            f"{prefix}.data_time": wm.mean(d), f"{prefix}.compute_time": wm.mean(c),
        }
        notes.append(f"{prefix}: records average up to {max(counts)} iterations: latency "
                     "percentiles not recomputed (log every iteration for them)")
        return expanded, "times", notes
    out: dict[str, float] = {}
    rule = "none"
    for kind in ("total_ips", "compute_ips"):
        ips = _nums(points, kind)
        if ips is None:
            continue
        if any(not math.isfinite(v) or v <= 0 for v in ips):
            out[f"{prefix}.{kind}"] = math.nan
            notes.append(f"{prefix}.{kind}: a record's value is not a positive number")
            continue
        out[f"{prefix}.{kind}"] = wm.images_per_second(1, _expand([1 / v for v in ips], counts))
        rule = "ips" if single else "ips-approximate"
    if rule == "ips-approximate":
        notes.append(f"{prefix}: records average up to {max(counts)} iterations and carry no "
                     "times: throughput from the records' mean ips (an upper bound)")
    for name, values in (("data_time", data_t), ("compute_time", comp_t)):
        if values is not None:
            out[f"{prefix}.{name}"] = wm.mean(_expand(values, counts))
    if single and comp_t is not None:
        for q in wm.LATENCY_PERCENTILES:
            out[f"{prefix}.compute_latency_at{q}"] = wm.percentile(comp_t, q)
        if data_t is not None:
            totals = [a + b for a, b in zip(data_t, comp_t, strict=True)]
            for q in wm.LATENCY_PERCENTILES:
                out[f"{prefix}.total_latency_at{q}"] = wm.percentile(totals, q)
    elif comp_t is not None:
        notes.append(f"{prefix}: records average up to {max(counts)} iterations: latency "
                     "percentiles not recomputed")
    return out, rule, notes


def global_batch_of(parameters: Mapping[str, Any], points: Sequence[Point]
                    ) -> tuple[int | None, str]:
    """The global batch: PARAMETER ``batch_size`` x ``world_size`` (as DLE logs them), else
    the one-iteration records' ``total_ips`` x (``data_time`` + ``compute_time``) when they
    agree within 1 %."""
    bs, ws = _num(parameters.get("batch_size")), _num(parameters.get("world_size"))
    if bs and ws and bs == int(bs) > 0 and ws == int(ws) > 0:
        return wm.global_batch(int(bs), int(ws)), "PARAMETER batch_size x world_size"
    seen = []
    for p in points:
        ips, d = _num(p.data.get("total_ips")), _num(p.data.get("data_time"))
        c = _num(p.data.get("compute_time", p.data.get("compute_latency")))
        if p.k == 1 and ips is not None and d is not None and c is not None and ips > 0:
            seen.append(ips * (d + c))
    if seen:
        mid = statistics.median(seen)
        if mid >= 0.5 and all(abs(v - mid) <= 0.01 * mid for v in seen):
            return round(mid), "records (total_ips x iteration time)"
    return None, "unknown"
