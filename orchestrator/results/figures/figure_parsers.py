"""Figures of merit: what a finished cell's output says, and whether the cell succeeded.

A cell leaves its log (everything the program printed) and its folder (files it wrote). A
:class:`FigureParser` reads them into :class:`Figures` (named numbers such as
``train.total_ips``); :func:`judge` decides whether a program that exited 0 really succeeded.
:func:`evaluate` does both: it is what a backend's run loop calls once per finished cell.

Parsers (``[figures] parser``):

``workload``
    our workload's JSON lines (``meta``, ``iter``, ``summary``, ``error``): the summary's ``data``
    are the figures. The default.
``dllogger``
    NVIDIA DLLogger output: the JSON raport (``JSONStreamBackend``: one ``DLLL {json}`` object per
    line, ``type`` LOG or METADATA), ``DLLL`` lines anywhere in the log, or else the
    ``StdOutBackend`` lines (``DLL <time> - <step> <metric> : <value> <unit> ...``). The
    per-iteration records (step ``[epoch, iteration]``, validation ``[epoch, iteration,
    val_iteration]``) after the warmup (dropped from the training and from the validation
    records alike: the cell's ``warmup``) are re-summarized by the rule of
    :mod:`workload.metrics` (totals: global batch x N / sum of iteration times; nearest-rank
    latency percentiles) under the usual names (``train.total_ips``, ``val.compute_latency_at99``
    ...). What the program itself reported in its run summary (step ``[]``) is kept beside them
    as ``dle.<name>`` (``dle.train.total_ips``: DLLogger's mean of per-iteration ips, warmup
    included).
``regex``
    only the ``[[figures.regex]]`` declarations: a named number captured from the log. The
    patterns are RE2's syntax (:mod:`orchestrator.config.user_regex`: matching is linear in
    the log's size, no pattern can hang the sweep; no backreferences or lookaround).

Regex figures may also be declared next to the ``workload`` or ``dllogger`` parser (extra
figures). Success criteria, for a program that exited 0: the end of its output was seen (our
summary line; DLLogger's run summary) unless ``require_end = false``; every required figure
(default: the mode's throughput, ``train.total_ips`` or ``val.total_ips``, and every regex
figure) is present and a finite number; every figure with ``[figures.bounds]`` is within them.

Declared as a ``[figures]`` table (:class:`~orchestrator.config.figures.FiguresConfig`): the file
``orchestrate import --figures`` reads, and in a matrix file ``[figures]`` (every cell),
``[hardware.NAME.figures]`` and ``[commands.NAME.figures]`` (the closest one a cell has wins: its
command's, its hardware profile's, the matrix's; else our workload's JSON lines)::

    [figures]
    parser = "dllogger"                  # workload | dllogger | regex
    raport = "raport.json"               # dllogger: the raport in the cell folder (default:
                                         # DLLL lines in the log, else its stdout lines)
    warmup = 20                          # dllogger: iterations dropped (default: cell's warmup)
    required = ["train.total_ips"]       # default: the mode's throughput + every regex figure
    require_end = true

    [figures.bounds]
    "train.total_ips" = { lower = 1.0 }
    "val.compute_latency_at99" = { upper = 0.5 }      # seconds

    [[figures.regex]]
    name = "gpu.power_w"
    pattern = 'power draw: (?P<value>[0-9.]+) W'     # the `value` group (or the only group)
    unit = "W"
    which = "median"                     # last | first | mean | median | all
    warmup = 5                           # matches dropped first
    scale = 1.0                          # multiplies the value
    file = "power.log"                   # default: the cell's log
"""

from __future__ import annotations

import logging
import math
import os
import re
import stat
import statistics
from abc import ABC, abstractmethod
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from orchestrator.config.figures import Bounds as Bounds  # re-exported: declared there
from orchestrator.config.figures import FiguresConfig, RegexFigure
from orchestrator.config.user_regex import compile_pattern
from orchestrator.errors import ConfigError, LogFormatError, Problem
from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.figures.dllogger import (
    DLLoggerLog,
    Point,
    drop_warmup,
    global_batch_of,
    has_dllogger_lines,
    iteration_series,
    read_dllogger,
    recompute,
)
from orchestrator.results.folders.run_folder import (
    RunPaths,
    gpus_of,
    parse_metric_lines,
    throughput_key,
)
from workload import metrics as wm

log = logging.getLogger(__name__)

def load_figures_file(path: Path) -> FiguresConfig:
    """A TOML file holding a ``[figures]`` table, exactly as in a matrix file."""
    from pydantic import ValidationError

    from orchestrator.config.files import problems_from_validation, read_toml

    raw = read_toml(path)
    unknown = sorted(set(raw) - {"figures"})
    if unknown or not isinstance(raw.get("figures"), dict):
        raise ConfigError(
            "expected one [figures] table (as in a matrix file)"
            + (f"; unknown tables: {', '.join(unknown)}" if unknown else ""),
            file=str(path), field=unknown[0] if unknown else "figures",
        )
    try:
        return FiguresConfig.model_validate(raw["figures"])
    except ValidationError as exc:
        problems = problems_from_validation(str(path), exc)
        raise ConfigError([replace(p, field=f"figures.{p.field}".rstrip(".")) for p in problems]
                          ) from None


# --- what a cell left, what it says --------------------------------------------------------


#: The most of a cell's log, or of a file of its folder, that its figures are read from: its
#: last 256 MiB (where the program's summary is); what comes before is left out, with a note.
READ_BYTES = 256 * 2**20


def read_end(path: Path, start: int = 0, label: str | None = None) -> tuple[str, int]:
    """The text of the regular file ``path`` from byte ``start`` on, at most its last
    :data:`READ_BYTES`; and how many bytes were left out before them. A FIFO or a device
    (a program's own file, a copied run) is a LogFormatError naming it, found without
    blocking; OSError as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno())
        if not stat.S_ISREG(size.st_mode):
            raise LogFormatError("not a regular file: figures are read from files only",
                                 file=label or path.name)
        begin = max(start, size.st_size - READ_BYTES)
        fh.seek(begin)
        data = fh.read(READ_BYTES)
    return data.decode("utf-8", errors="replace"), begin - start


@dataclass(frozen=True)
class CellOutput:
    """A finished cell's captured output: its log text, its folder, its parameters."""

    log_text: str
    log_name: str = RunPaths.CELL_LOG
    cell_dir: Path | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    #: The log already read as DLLogger output (an import streams a large raport once; its
    #: text is then not kept): the dllogger parser takes it instead of reading the text.
    dllogger: DLLoggerLog | None = None
    #: Bytes of the log left out before ``log_text`` (:data:`READ_BYTES`).
    log_cut: int = 0

    @classmethod
    def from_cell_dir(
        cls, cell_dir: Path, params: Mapping[str, Any] | None = None, log_offset: int = 0,
        log_name: str = RunPaths.CELL_LOG,
    ) -> CellOutput:
        """The cell folder's log from byte ``log_offset`` (this attempt's output) on (its last
        :data:`READ_BYTES` at most)."""
        try:
            text, cut = read_end(Path(cell_dir) / log_name, log_offset, log_name)
        except FileNotFoundError:
            text, cut = "", 0
        return cls(text, log_name, Path(cell_dir), dict(params or {}), log_cut=cut)

    @property
    def mode(self) -> str:
        return str(self.params.get("mode", "train"))

    def text_of(self, name: str | None) -> tuple[str, str]:
        """(text, label) of the log (``None``) or of a file of the cell folder."""
        if name is None:
            return self.log_text, self.log_name
        if self.cell_dir is None:
            raise LogFormatError(f"no cell folder to read {name} from", file=name)
        try:
            text, cut = read_end(self.cell_dir / name, label=name)
        except FileNotFoundError:
            raise LogFormatError(
                "not found in the cell folder (did the program write it there?)", file=name
            ) from None
        except OSError as exc:
            raise LogFormatError(f"cannot be read: {exc.strerror or exc}", file=name) from None
        if cut:
            log.info("%s: %d bytes left out before its last %d", name, cut, READ_BYTES)
        return text, name


@dataclass
class Figures:
    """What a parser read: figures plus what explains them."""

    parser: str
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    #: Structured records worth keeping as the cell's metrics.jsonl (our JSON lines).
    records: list[dict[str, Any]] = field(default_factory=list)
    #: The program's own account of its failure (our ``error`` line), for the failure reason.
    program_error: str | None = None
    #: Why the output looks unfinished (no summary line / run summary), with its file and line.
    incomplete: Problem | None = None
    #: Per missing figure: where the parser looked (for the failure reason).
    missing: dict[str, str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = ""
    #: The program's own parameter record (DLLogger's PARAMETER), if any.
    parameters: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        """How the figures were read: for the result's provenance (``provenance.figures``)."""
        out: dict[str, Any] = {"parser": self.parser, "source": self.source}
        if self.units:
            out["units"] = dict(self.units)
        if self.details:
            out.update(self.details)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


#: A seed file name that states the batch size (TBD's ``core_util_batch_32.csv``,
#: ``throughput_32.log``).
_BATCH_IN_NAME = re.compile(r"(?:batch_|throughput_)([0-9]+)\.(?:csv|log|txt)$")


class FigureParser(ABC):
    """Reads a cell's output into :class:`Figures`. Raise :class:`LogFormatError` for a
    malformed log (every bad line at once, each with its file and line)."""

    name: ClassVar[str]
    #: For a foreign format that ``orchestrate import`` tells by its content (:meth:`detect`):
    #: the format its imported cells record (``provenance.imported.format``) and the table rule
    #: of a matrix written from such logs. None: not one (our workload's JSON lines, DLLogger and
    #: regex logs the importer tells apart itself).
    import_kind: ClassVar[str | None] = None
    table_rule: ClassVar[str] = "median"
    #: What a file in this format has somewhere (the default :meth:`detect`).
    signature: ClassVar[re.Pattern[str] | None] = None
    #: Its files' names state the batch size (``core_util_batch_32.csv``, ``throughput_32.log``).
    batch_in_file_name: ClassVar[bool] = False

    def __init__(self, config: FiguresConfig):
        self.config = config

    @classmethod
    def detect(cls, text: str) -> bool:
        """Whether a file's ``text`` is in this format (for an ``import_kind`` format)."""
        return bool(cls.signature and cls.signature.search(text))

    @classmethod
    def stated_params(cls, text: str, path: Path) -> dict[str, Any]:
        """The cell parameters a log of this format states, by its text or its file's name."""
        match = _BATCH_IN_NAME.search(path.name) if cls.batch_in_file_name else None
        return {"batch_size": int(match[1])} if match else {}

    @abstractmethod
    def parse(self, output: CellOutput) -> Figures:
        """The figures of ``output``."""

    def required(self, params: Mapping[str, Any]) -> list[str]:
        """Figures a cell must produce: the declaration's, else the mode's throughput plus
        every regex figure."""
        if self.config.required is not None:
            return list(self.config.required)
        mode = str(params.get("mode", "train"))
        return [throughput_key(mode), *(f.name for f in self.config.regex)]


# --- our workload's JSON lines -------------------------------------------------------------


class WorkloadParser(FigureParser):
    """Our workload: the last ``summary`` line's ``data`` (and ``iteration_times``)."""

    name = "workload"

    def parse(self, output: CellOutput) -> Figures:
        lines = parse_metric_lines(output.log_text)
        figures = Figures(self.name, records=lines, source=output.log_name)
        summary = next((o for o in reversed(lines) if o["type"] == "summary"), None)
        meta = next((o for o in lines if o["type"] == "meta"), None)
        error = next((o for o in reversed(lines) if o["type"] == "error"), None)
        if summary:
            figures.metrics = dict(summary.get("data") or {})
            if "iteration_times" in summary:
                figures.metrics["iteration_times"] = summary["iteration_times"]
        else:
            figures.incomplete = Problem(
                "", "", "the workload exited 0 but printed no summary line")
            figures.missing = {throughput_key(output.mode): "no summary line"}
        figures.env = dict((summary or meta or {}).get("env") or {})
        if error and error.get("message"):
            figures.program_error = str(error["message"])
        return figures


# --- DLLogger --------------------------------------------------------------------------------


class DLLoggerParser(FigureParser):
    """DLLogger raport or log: recomputed figures by our rule plus the program's own
    (``dle.*``)."""

    name = "dllogger"

    def parse(self, output: CellOutput) -> Figures:
        warmup = self.config.warmup
        if warmup is None:
            warmup = int(output.params.get("warmup", 0) or 0)
        if self.config.raport is None and output.dllogger is not None:
            return self.figures_of(output.dllogger, output.mode, warmup,
                                   Figures(self.name, source=output.log_name))
        if self.config.raport is not None:
            text, label = output.text_of(self.config.raport)
        else:
            text, label = output.text_of(None)
        figures = Figures(self.name, source=label)
        if not has_dllogger_lines(text):
            figures.incomplete = Problem(label, "", "no DLLogger records (no DLLL or DLL lines)")
            figures.missing = {throughput_key(output.mode): f"no DLLogger records in {label}"}
            return figures
        dll = read_dllogger(text, label)
        return self.figures_of(dll, output.mode, warmup, figures)

    def figures_of(self, dll: DLLoggerLog, mode: str, warmup: int, figures: Figures) -> Figures:
        """Fill ``figures`` from a read log."""
        figures.source = f"{dll.file} ({'DLLL JSON lines' if dll.form == 'json' else 'stdout'})"
        figures.parameters = dict(dll.parameters)
        figures.units = {k: str(m["unit"]) for k, m in dll.metadata.items() if m.get("unit")}
        times = dll.times
        figures.started_at, figures.finished_at = (min(times), max(times)) if times else (
            None, None)
        series = {p: iteration_series(dll.records, p) for p in ("train", "val")}
        batch, how = global_batch_of(dll.parameters, [*series["train"], *series["val"]])
        details: dict[str, Any] = {"global_batch": batch, "global_batch_from": how}
        head = wm.figure_prefix(mode)
        for prefix, points in series.items():
            if points:
                details[prefix] = _series_figures(prefix, points, warmup, batch, figures,
                                                  prefix == head, dll.file)
        figures.details = details
        if not series[head]:
            figures.missing.setdefault(
                throughput_key(mode), f"no per-iteration {head} records in {dll.file}")
        summary = dll.summary
        if summary is None:
            figures.incomplete = Problem(
                dll.file, f"line {dll.last_line}", "the log ends without DLLogger's run summary "
                "(step []): the program did not finish")
        else:
            figures.metrics.update({
                f"dle.{k}": v for k, v in summary.data.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            })
        return figures


def _series_figures(prefix: str, points: list[Point], warmup: int, batch: int | None,
                    figures: Figures, head: bool, file: str) -> dict[str, Any]:
    """Add one series' figures (``train``/``val``) to ``figures``; return how they were made.
    ``head``: the cell's mode's series (its throughput is required; iterations, warmup and
    global batch are reported as ours are)."""
    kept, dropped = drop_warmup(points, warmup)
    info: dict[str, Any] = {"records": len(points), "warmup_dropped": dropped,
                            "iterations": sum(p.k for p in kept)}
    if not kept:
        why = f"all {dropped} {prefix} iterations in {file} are warmup ({warmup})"
        if head:
            figures.missing[f"{prefix}.total_ips"] = why
        else:
            figures.notes.append(f"no {prefix} figures: {why}")
        return info
    values, info["rule"], notes = recompute(prefix, kept, batch)
    figures.metrics.update(values)
    figures.notes += notes
    loss = kept[-1].data.get("loss")
    if prefix == "train" and isinstance(loss, int | float) and not isinstance(loss, bool):
        figures.metrics["train.loss"] = float(loss)
    if head:
        figures.metrics.update(iterations=info["iterations"], warmup=dropped)
        if batch:
            figures.metrics["global_batch_size"] = batch
    return info


# --- regular expressions ---------------------------------------------------------------------


#: Matches one regex figure reads at most: a pattern that matches more fails its figure
#: (missing, saying so) instead of holding the sweep. 1,000,000 matches take about 5 s.
MATCHES_READ = 1_000_000
#: Matches that are not numbers reported per figure; its log is not read further after them.
NOT_NUMBERS_SHOWN = 5


class _Lines:
    """Line numbers of increasing offsets into a text, counted in one pass."""

    def __init__(self, text: str):
        self.text, self.offset, self.line = text, 0, 1

    def at(self, offset: int) -> int:
        if offset < self.offset:  # not increasing (never, for finditer): count from the start
            self.offset, self.line = 0, 1
        self.line += self.text.count("\n", self.offset, offset)
        self.offset = offset
        return self.line


def _pick(which: str, values: list[float]) -> float | list[float]:
    """The match a regex figure keeps: last, first, mean, median or all."""
    if which == "all":
        return values
    if which == "mean":
        return wm.mean(values)
    if which == "median":
        return float(statistics.median(values))
    return values[0] if which == "first" else values[-1]


def regex_figures(figs: Sequence[RegexFigure], output: CellOutput, figures: Figures) -> None:
    """Add each regex figure's value to ``figures`` (or why it is missing).

    Linear in the text whatever the pattern: RE2 finds the matches, line numbers come from
    one pass, a figure reads at most :data:`MATCHES_READ` matches and stops at the
    :data:`NOT_NUMBERS_SHOWN`-th match that is not a number (a pattern that also matches the
    empty string, or words, would otherwise report every position of the log)."""
    problems: list[Problem] = []
    for fig in figs:
        text, label = output.text_of(fig.file)
        rx = compile_pattern(fig.pattern, multiline=True)  # RE2: linear in the text
        group = "value" if "value" in rx.groupindex else 1
        values = array("d")
        lines = _Lines(text)
        matches = not_numbers = 0
        for match in rx.finditer(text):
            matches += 1
            if matches > MATCHES_READ:
                break
            raw = match.group(group)
            if raw is None:
                continue
            try:
                values.append(float(raw))
            except ValueError:
                not_numbers += 1
                problems.append(Problem(
                    label, f"line {lines.at(match.start())}",
                    f"figure {fig.name}: {raw[:80]!r} is not a number (make the pattern's "
                    "group capture only the number)"
                    + (f"; {label} not read further for it" if not_numbers == NOT_NUMBERS_SHOWN
                       else "")))
                if not_numbers == NOT_NUMBERS_SHOWN:
                    break
        if fig.unit:
            figures.units[fig.name] = fig.unit
        if matches > MATCHES_READ:
            why = (f"its pattern matches more than {MATCHES_READ:,} times in {label}, the most "
                   "a figure reads: make it match only the lines that state the figure")
            figures.missing[fig.name] = why
            figures.notes.append(f"{fig.name}: {why}")
            continue
        kept = values[fig.warmup:]
        if not kept:
            figures.missing[fig.name] = (
                f"{len(values)} matches of its pattern in {label}"
                + (f", {fig.warmup} dropped as warmup" if fig.warmup else ""))
            continue
        value = _pick(fig.which, [v * fig.scale for v in kept])
        if fig.name in figures.metrics:
            figures.notes.append(f"{fig.name}: the regex figure replaces the parser's")
        figures.metrics[fig.name] = value
    if problems:
        raise LogFormatError(problems)


class RegexParser(FigureParser):
    """Only the declared regex figures."""

    name = "regex"

    def parse(self, output: CellOutput) -> Figures:
        figures = Figures(self.name, source=output.log_name)
        regex_figures(self.config.regex, output, figures)
        return figures

    def required(self, params: Mapping[str, Any]) -> list[str]:
        if self.config.required is not None:
            return list(self.config.required)
        return [f.name for f in self.config.regex]


# --- the seeds' own formats (orchestrator/results/figures/foreign_logs.py)
# ------------------------------


def _int_param(params: Mapping[str, Any], key: str, default: int) -> int:
    value = params.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class DLPerfParser(FigureParser):
    """DLE's text log, one run, by DLPerf's rule: ``dlperf.total_ips`` (also
    ``train.total_ips``), rounded to 2 decimals as DLPerf rounds it."""

    name = "dlperf"
    import_kind = "dlperf-log"
    table_rule = "dlperf"

    @classmethod
    def detect(cls, text: str) -> bool:
        """pytorch/examples-style lines (old DLE main.py): DLPerf reads them."""
        return any("Epoch: " in ln and fl.DLPERF_INDEX.search(ln) and fl.DLPERF_TIME.search(ln)
                   for ln in text.splitlines())

    def parse(self, output: CellOutput) -> Figures:
        text, label = output.text_of(self.config.file)
        params = output.params
        warmup = self.config.warmup
        if warmup is None:
            warmup = _int_param(params, "warmup", 20)
        train = warmup + _int_param(params, "iterations", 100)
        batch = wm.global_batch(_int_param(params, "batch_size", 1), gpus_of(params) or 1)
        speed = fl.dlperf_speed(text, batch, warmup=warmup, train=train,
                                variant=self.config.variant, file=label)
        figures = Figures(self.name, source=label)
        figures.details = {"rule": f"DLPerf extract_pytorch_logs_time.py ({speed.variant})",
                           "warmup_lines": warmup, "train_lines": train, "global_batch": batch,
                           "lines": speed.lines, **speed.detail}
        if speed.ips is None:
            figures.incomplete = Problem(label, "", (
                f"{speed.lines} DLPerf lines ({speed.variant}); its rule needs {train}"))
            figures.missing = {"train.total_ips": f"the log ends before DLPerf's line {train}"}
            return figures
        figures.metrics.update({"dlperf.total_ips": speed.ips, "train.total_ips": speed.ips,
                                "global_batch_size": batch})
        figures.units = {"dlperf.total_ips": "images/s"}
        return figures

    def required(self, params: Mapping[str, Any]) -> list[str]:
        return list(self.config.required) if self.config.required is not None else [
            "dlperf.total_ips"]


class TbdNcuParser(FigureParser):
    """Nsight Compute CSV by TBD's coreutil.py rule: ``tbd.<unit>_pct`` for fma, fp16, tensor
    and sfu (elapsed pipe metrics weighted by ``gpc__cycles_elapsed.max``)."""

    name = "tbd-ncu"
    import_kind = "tbd-ncu"
    table_rule = "tbd"

    batch_in_file_name = True

    @classmethod
    def detect(cls, text: str) -> bool:
        return fl.details_header(text.splitlines()[:200]) is not None

    def parse(self, output: CellOutput) -> Figures:
        text, label = output.text_of(self.config.file)
        result = fl.coreutil(fl.parse_ncu_long_csv(text, label))
        figures = Figures(self.name, source=label)
        for unit, value in result.pct.items():
            figures.metrics[f"tbd.{unit}_pct"] = value
            figures.units[f"tbd.{unit}_pct"] = "%"
        figures.metrics["tbd.kernels"] = float(result.kernels)
        figures.details = {"rule": "TBD coreutil.py: sum(cycles x pct) / sum(cycles), cycles = "
                           f"{fl.TBD_CYCLES}", "launches_in_csv": result.launches,
                           "printed": fl.coreutil_lines(result)}
        figures.notes += result.notes
        if not result.pct:
            figures.missing = {f"tbd.{u}_pct": "no kernel with its metrics" for u in fl.TBD_FIELDS}
        return figures

    def required(self, params: Mapping[str, Any]) -> list[str]:
        return list(self.config.required) if self.config.required is not None else [
            f"tbd.{u}_pct" for u in fl.TBD_FIELDS]


class TimeHistoryParser(FigureParser):
    """TensorFlow's TimeHistory lines: ``train.total_ips`` = the mean examples/second of the
    windows after the first ``warmup`` (default 1)."""

    name = "tf-timehistory"
    import_kind = "tf-timehistory"
    table_rule = "tbd"
    signature = fl.TIME_HISTORY
    batch_in_file_name = True

    def parse(self, output: CellOutput) -> Figures:
        text, label = output.text_of(self.config.file)
        windows = fl.time_history(text)
        skip = 1 if self.config.warmup is None else self.config.warmup
        kept = windows[skip:]
        figures = Figures(self.name, source=label)
        figures.details = {"rule": "mean examples/second of the TimeHistory windows after the "
                           f"first {skip}", "windows": len(windows)}
        if kept:
            figures.metrics["train.total_ips"] = wm.mean([w[1] for w in kept])
            figures.metrics["tf.windows"] = float(len(kept))
        else:
            figures.missing = {"train.total_ips": f"{len(windows)} TimeHistory lines in {label}, "
                               f"{skip} dropped"}
        return figures


class IterationDurationsParser(FigureParser):
    """Seed 002's per-GPU iteration durations: every GPU's series kept
    (``per_gpu.iteration_times``), per GPU ``gpu<N>.iteration_median_s`` / ``_mean_s``, the
    spread of the medians across GPUs (``per_gpu.spread_pct``), and per GPU clock, power and
    temperature from nvprof's system-profiling CSV files (``telemetry``)."""

    name = "iteration-durations"
    import_kind = "iteration-durations"
    table_rule = "per-gpu"
    signature = fl.ITERATION_DURATION

    @classmethod
    def stated_params(cls, text: str, path: Path) -> dict[str, Any]:
        """Every rank prints its own series: their count is the cell's gpus."""
        gpus = len(fl.iteration_durations(text))
        return {"gpus": gpus} if gpus else {}

    def parse(self, output: CellOutput) -> Figures:
        text, label = output.text_of(self.config.file)
        series = fl.per_gpu(fl.iteration_durations(text))
        figures = Figures(self.name, source=label)
        figures.metrics["per_gpu.iteration_times"] = {str(s.gpu): s.times for s in series}
        for s in series:
            for what, value in (("median", s.median_s), ("mean", s.mean_s), ("max", s.max_s),
                                ("min", s.min_s)):
                if value is not None:
                    figures.metrics[f"gpu{s.gpu}.iteration_{what}_s"] = value
            figures.metrics[f"gpu{s.gpu}.iterations"] = float(len(s.times))
        spread = fl.spread_pct([s.median_s for s in series if s.median_s is not None])
        if spread is not None:
            figures.metrics["per_gpu.spread_pct"] = spread
        figures.metrics["per_gpu.gpus"] = float(len(series))
        figures.details = {"rule": "per GPU: median and mean iteration time with the first "
                           "iteration dropped; spread = (max - min) / min of the medians"}
        if not series:
            figures.missing = {"per_gpu.gpus": f"no 'Iteration Duration' line in {label}"}
        self._telemetry(output, figures)
        return figures

    def _telemetry(self, output: CellOutput, figures: Figures) -> None:
        pattern = self.config.telemetry
        if pattern is None or output.cell_dir is None:
            return
        files = sorted(output.cell_dir.glob(pattern))
        samples: dict[int, dict[str, list[float]]] = {}
        for path in files:
            try:
                found = fl.nvprof_system(path.read_text(encoding="utf-8", errors="replace"),
                                         path.name)
            except LogFormatError as exc:
                figures.notes += [str(p) for p in exc.problems]
                continue
            for gpu, values in found.items():
                for key, vals in values.items():
                    samples.setdefault(gpu, {}).setdefault(key, []).extend(vals)
        for gpu, values in sorted(samples.items()):
            for key, vals in values.items():
                figures.metrics[f"gpu{gpu}.{key}_mean"] = wm.mean(vals)
                figures.metrics[f"gpu{gpu}.{key}_max"] = max(vals)
        figures.details["telemetry_files"] = [p.name for p in files]
        if pattern and not files:
            figures.notes.append(f"no cell file matches telemetry {pattern!r}")

    def required(self, params: Mapping[str, Any]) -> list[str]:
        return list(self.config.required) if self.config.required is not None else [
            "per_gpu.gpus"]


class HabanaParser(FigureParser):
    """Model-References ResNet train.py: the main process's per-card ``img/s`` lines;
    ``habana.img_per_s_card`` = their mean after the first ``warmup`` lines, and
    ``train.total_ips`` = that x the cell's cards."""

    name = "habana"
    import_kind = "habana-log"
    table_rule = "habana"
    signature = fl.HABANA_LINE

    def parse(self, output: CellOutput) -> Figures:
        text, label = output.text_of(self.config.file)
        lines = fl.habana_img_per_s(text)
        warmup = self.config.warmup
        if warmup is None:
            warmup = _int_param(output.params, "warmup", 0)
        kept = [v for _, _, v in lines[warmup:]]
        cards = gpus_of(output.params) or 1
        figures = Figures(self.name, source=label)
        figures.details = {"rule": f"mean of the printed img/s (one card) after {warmup} lines",
                           "lines": len(lines), "cards": cards}
        if kept:
            per_card = wm.mean(kept)
            figures.metrics.update({"habana.img_per_s_card": per_card,
                                    "train.total_ips": per_card * cards})
        else:
            figures.missing = {"train.total_ips": f"{len(lines)} img/s lines in {label}, "
                               f"{warmup} dropped as warmup"}
        return figures


#: Every figures parser by name (``[figures] parser``); the foreign formats among them in the
#: order ``orchestrate import`` tries them on a file's content (the most particular first).
PARSERS: dict[str, type[FigureParser]] = {
    p.name: p for p in (WorkloadParser, DLLoggerParser, RegexParser, TbdNcuParser,
                        IterationDurationsParser, HabanaParser, TimeHistoryParser, DLPerfParser)
}


def foreign_formats() -> dict[str, type[FigureParser]]:
    """The formats ``orchestrate import`` tells by their content, by ``import_kind``, in the
    order it tries them."""
    return {p.import_kind: p for p in PARSERS.values() if p.import_kind}

DEFAULT = FiguresConfig()


def parser_for(config: FiguresConfig | None = None) -> FigureParser:
    """The parser a declaration names (default: our workload's JSON lines)."""
    config = config or DEFAULT
    return PARSERS[config.parser](config)


def parse_figures(output: CellOutput, config: FiguresConfig | None = None) -> Figures:
    """Read ``output`` with the declared parser, then the declared regex figures on top.
    Raises :class:`LogFormatError` for a malformed log."""
    parser = parser_for(config)
    figures = parser.parse(output)
    if parser.config.regex and parser.name != "regex":
        regex_figures(parser.config.regex, output, figures)
    if output.log_cut:
        figures.notes.append(f"figures read from the last {READ_BYTES // 2**20} MiB of "
                             f"{output.log_name}: {output.log_cut} bytes before them left out")
    keep_values(figures)
    return figures


#: Numbers a cell's result keeps of its figures (a list or table counts each number in it:
#: ``which = "all"``, ``iteration_times``, ``per_gpu.iteration_times``): a pattern that
#: matches every line of a long log must not make a result.json of tens of MB. What is left
#: out is said in the result (``provenance.figures``: ``notes`` and ``values_left_out``).
VALUES_KEPT = 100_000


def _numbers(value: Any) -> int:
    if isinstance(value, list):
        return sum(_numbers(v) for v in value)
    if isinstance(value, dict):
        return sum(_numbers(v) for v in value.values())
    return 1


def keep_values(figures: Figures) -> None:
    """Bound ``figures.metrics`` to :data:`VALUES_KEPT` numbers, in their order: a list of
    numbers is cut to the room left, any other figure beyond it is left out; what was left
    out is noted."""
    room, cut, dropped = VALUES_KEPT, 0, []
    for name, value in list(figures.metrics.items()):
        size = _numbers(value)
        if size <= room:
            room -= size
            continue
        if isinstance(value, list) and room > 0 and size == len(value):
            figures.metrics[name] = value[:room]
            figures.notes.append(f"{name}: its first {room:,} of {size:,} values kept")
            cut += size - room
        else:
            del figures.metrics[name]
            dropped.append(name)
            cut += size
        room = 0
    if cut:
        figures.details["values_left_out"] = cut
        shown = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5
                                          else "")
        figures.notes.append(f"{cut:,} values left out (a result keeps at most "
                             f"{VALUES_KEPT:,})" + (f"; figures left out: {shown}" if shown
                                                    else ""))


# --- success criteria ------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """Why a cell whose program exited 0 did not succeed."""

    kind: Literal["format", "incomplete", "missing", "nonfinite", "bounds"]
    message: str
    problem: Problem | None = None

    def __str__(self) -> str:
        return self.message


def _finite(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_finite(v) for v in value)
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def judge(figures: Figures, required: Sequence[str], config: FiguresConfig | None = None,
          allow_incomplete: bool = False) -> list[Failure]:
    """Every reason the figures fail the success criteria (empty: success)."""
    config = config or DEFAULT
    failures: list[Failure] = []
    if figures.incomplete and config.require_end and not allow_incomplete:
        failures.append(Failure("incomplete", str(figures.incomplete), figures.incomplete))
    checked = dict.fromkeys([*required, *config.bounds, *(f.name for f in config.regex)])
    for name in checked:
        if name not in figures.metrics:
            if name in required and not failures:  # an unfinished output explains it
                where = figures.missing.get(name)
                failures.append(Failure(
                    "missing", f"the program exited 0 but produced no figure {name}"
                    + (f" ({where})" if where else "")))
            continue
        value = figures.metrics[name]
        if not _finite(value):
            shown = "null (NaN or infinite in the program's output)" if value is None \
                else repr(value)
            failures.append(Failure("nonfinite", f"figure {name} is {shown}, not a finite "
                                    "number"))
            continue
        bounds = config.bounds.get(name)
        if bounds is None:
            continue
        for v in value if isinstance(value, list) else [value]:
            if bounds.lower is not None and v < bounds.lower:
                failures.append(Failure("bounds", f"figure {name} = {_fmt(v)} is below its "
                                        f"declared lower bound {_fmt(bounds.lower)}"))
                break
            if bounds.upper is not None and v > bounds.upper:
                failures.append(Failure("bounds", f"figure {name} = {_fmt(v)} is above its "
                                        f"declared upper bound {_fmt(bounds.upper)}"))
                break
    return failures


@dataclass
class Evaluation:
    """A finished cell's figures and verdict."""

    figures: Figures
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> str:
        """Why the cell failed, in one line ('' when it succeeded)."""
        return "; ".join(str(f) for f in self.failures)


def evaluate(output: CellOutput, config: FiguresConfig | None = None, exited_ok: bool = True
             ) -> Evaluation:
    """Read a finished cell's figures and judge them. Never raises for a bad log: a malformed
    log is a failure with its file and line. ``exited_ok`` False (the program failed anyway):
    figures are read for the record (and the program's error line), not judged."""
    config = config or DEFAULT
    parser = parser_for(config)
    try:
        figures = parse_figures(output, config)
    except LogFormatError as exc:
        figures = Figures(parser.name, source=output.log_name)
        failures = [Failure("format", str(p), p) for p in exc.problems]
        return Evaluation(figures, failures if exited_ok else [])
    if not exited_ok:
        return Evaluation(figures)
    return Evaluation(figures, judge(figures, parser.required(output.params), config))
