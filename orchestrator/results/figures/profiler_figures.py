"""Per-cell figures from the CSV files a profiler left in the cell folder.

A post-processing step next to :mod:`orchestrator.results.figures.figure_parsers`: fom reads what
the program printed,
this reads what the profiler wrote (``workload/profile_run.py`` exports it in the image, right
after the run). :func:`figures_of_cell` returns the figures and how they were made; the sweep
adds them to the cell's ``result.json`` (``metrics`` and ``provenance.profiler``) once the cell
has ended. Pure parsers over text, plus that one function reading the cell folder.

Files and figures:

``ncu.csv`` (``ncu --import profile.ncu-rep --csv --page raw``: one row per profiled kernel
launch, a units row under the header)
    ``ncu.fma_pct``, ``ncu.fp16_pct``, ``ncu.tensor_pct``, ``ncu.sfu_pct``: the FMA, FP16,
    Tensor Core and XU (special function unit) pipe utilisation, % of peak sustained over the
    SM's active cycles, averaged over the kernels weighted by each kernel's
    ``gpu__time_duration.sum`` (a plain mean, noted, when durations were not collected);
    ``ncu.kernels`` (launches profiled), ``ncu.kernel_time_ms`` (their summed duration), and
    ``ncu.<metric>`` for every other metric named explicitly (not by ``regex:``) in the
    profile's ncu ``metrics``. Which metric fed each figure is in ``provenance.profiler``.
    A profile asking for the ``.pct_of_peak_sustained_elapsed`` forms and
    ``gpc__cycles_elapsed.max`` (seed 001's metrics) gets its figures from those, weighted by the
    elapsed cycles, as TBD's coreutil.py weights them (``provenance.profiler.weighting`` per
    pipe); coreutil.py's own table, with its kernel set, is the ``tbd`` table rule
    (:mod:`orchestrator.results.reports.table_rules`).
``nsys_kern_sum.csv`` / ``nsys_gpu_trace.csv`` (``nsys stats --report cuda_gpu_kern_sum`` /
``cuda_gpu_trace``, or ``gpukernsum`` / ``gputrace`` of nsys before 2023)
    ``nsys.kernel_time_ms``, ``nsys.kernels``, ``nsys.top_kernel_pct`` (share of kernel time of
    the most expensive kernel; the top five by time, with names, in ``provenance.profiler``),
    ``nsys.gpu_busy_pct``: per GPU, the union of its kernels' intervals over the span from its
    first kernel's start to its last kernel's end (concurrent kernels counted once), averaged
    over the GPUs.
``nvprof.<pid>.csv`` (``nvprof --csv --metrics ...``: one row per kernel and metric)
    ``nvprof.fma_pct``, ``nvprof.fp16_pct``, ``nvprof.tensor_pct``, ``nvprof.sfu_pct`` from the
    single/half/tensor precision and special function unit utilisation *levels* (0 idle .. 10
    max, shown x10 as %), weighted by invocations (nvprof's metric summary has no kernel
    durations); ``nvprof.kernels`` (invocations).

Architectures (ncu): Volta, Turing and GA100 have an FP16 pipe (``pipe_fp16``); on GA10x and
Hopper FP16x2 runs on the FMA pipes (FMAheavy/FMAlite), so there may be no FP16 figure: the FMA
figure counts it. The Tensor pipe is ``pipe_tensor`` on Volta/Turing/Ampere; on Hopper that
metric counts HMMA alone and misses the warpgroup MMA (wgmma) the sm90 cuDNN/cuBLAS kernels run,
so Hopper's per-type ``pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active`` is
preferred where the profile has it (both read off a real H100 profile, ncu 2025.3.1, 2026-11-25:
no ``pipe_tensor_op_gmma_cycles_active`` exists there). ``sm__`` names are preferred to
``smsp__`` ones.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.matrix_file import NcuOptions, NsysOptions, NvprofOptions
from orchestrator.errors import LogFormatError, Problem

log = logging.getLogger(__name__)

_PCT = ".avg.pct_of_peak_sustained_active"
#: The same metrics over the elapsed cycles: what seed 001 (TBD's coreutil.py) asked for.
_ELAPSED = ".avg.pct_of_peak_sustained_elapsed"
#: Per figure, the metrics that can feed it, preferred first. A tuple inside the list: metrics
#: added up per kernel (the Tensor pipe split by instruction from Ampere on). The ``_elapsed``
#: forms come last: a profile that asks for them (TBD's metrics) gets its figures from them.
#: Hopper's Tensor pipe over every instruction type, warpgroup MMA included (ncu 2025.3 on
#: an H100; no such metric before Hopper).
HOPPER_TENSOR = "pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active"
PIPE_METRICS: Mapping[str, list[str | tuple[str, ...]]] = {
    "fma": [f"sm__inst_executed_pipe_fma{_PCT}", f"smsp__inst_executed_pipe_fma{_PCT}",
            f"sm__pipe_fma_cycles_active{_PCT}", f"smsp__pipe_fma_cycles_active{_PCT}",
            f"sm__inst_executed_pipe_fma{_ELAPSED}"],
    "fp16": [f"sm__inst_executed_pipe_fp16{_PCT}", f"smsp__inst_executed_pipe_fp16{_PCT}",
             f"sm__pipe_fp16_cycles_active{_PCT}", f"smsp__pipe_fp16_cycles_active{_PCT}",
             # Hopper: FP16 runs on the FMA pipe, counted as its fp16 instruction type
             f"sm__inst_executed_pipe_fma_type_fp16{_PCT}",
             f"smsp__inst_executed_pipe_fma_type_fp16{_PCT}",
             f"sm__inst_executed_pipe_fp16{_ELAPSED}"],
    # Hopper: pipe_tensor_cycles_active counts HMMA alone (equal to pipe_tensor_op_hmma, per
    # kernel, in a real H100 profile); the warpgroup MMA (wgmma, "gmma") that cuDNN's sm90 and
    # cuBLAS's nvjet kernels issue is only in the per-type metric, preferred where it exists.
    "tensor": [f"sm__{HOPPER_TENSOR}{_PCT}", f"smsp__{HOPPER_TENSOR}{_PCT}",
               f"sm__pipe_tensor_cycles_active{_PCT}", f"smsp__pipe_tensor_cycles_active{_PCT}",
               f"sm__pipe_tensor_op_hmma_cycles_active{_PCT}",
               f"smsp__pipe_tensor_op_hmma_cycles_active{_PCT}",
               f"sm__inst_executed_pipe_tensor{_ELAPSED}"],
    "sfu": [f"sm__inst_executed_pipe_xu{_PCT}", f"smsp__inst_executed_pipe_xu{_PCT}",
            f"sm__inst_executed_pipe_xu{_ELAPSED}"],
}
DURATION = "gpu__time_duration.sum"
#: Elapsed cycles: the weights of the ``_elapsed`` metrics (TBD's coreutil.py weights by it).
CYCLES = "gpc__cycles_elapsed.max"
#: nvprof's utilisation metrics (levels 0..10) of the same pipes.
NVPROF_PIPES: Mapping[str, str] = {
    "fma": "single_precision_fu_utilization", "fp16": "half_precision_fu_utilization",
    "tensor": "tensor_precision_fu_utilization", "sfu": "special_fu_utilization",
}
#: The identifying columns of ncu's raw page (everything else is a metric).
NCU_ID_COLUMNS = frozenset({
    "ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Function Name", "Context",
    "Stream", "Block Size", "Grid Size", "Device", "CC", "Section Name", "Demangled Name",
    "Mangled Name", "Kernel Time",
})
_TIME_UNITS = {"": 1.0, "ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6,
               "msecond": 1e6, "s": 1e9, "second": 1e9}
TOP_KERNELS = 5


@dataclass
class ProfilerFigures:
    """What the profiler's files say: figures for ``metrics``, and how they were made."""

    tool: str
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def provenance(self) -> dict[str, Any]:
        """``provenance.profiler`` of the result."""
        out = {"tool": self.tool, **self.info}
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# --- CSV basics ------------------------------------------------------------------------------


def number(text: str | None) -> float | None:
    """A number as the tools print it (``1,234.5``, ``"12.5"``, ``55.3%``); None for n/a."""
    if text is None:
        return None
    t = text.strip().strip('"').replace(",", "").rstrip("%").strip()
    try:
        value = float(t)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def table(text: str, file: str, *required: str) -> tuple[list[str], list[list[str]]]:
    """The CSV table in a tool's output: from the first row holding every ``required`` column
    name (what the tool printed before it, and its ``==PROF==``/``==PID==`` lines, skipped) to
    the end. :class:`LogFormatError` when no such header is there."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("==")]
    for i, line in enumerate(lines):
        if not all(col in line for col in required):
            continue
        rows = list(csv.reader(io.StringIO("\n".join(lines[i:]))))
        header = [h.strip() for h in rows[0]]
        if all(any(col in h for h in header) for col in required):
            return header, [r for r in rows[1:] if r and any(cell.strip() for cell in r)]
    raise LogFormatError([Problem(file, "", f"no CSV header with {', '.join(required)}: not "
                                  "the expected tool output (see the cell's log)")])


def _weighted(values: Iterable[tuple[float, float]]) -> float | None:
    pairs = list(values)
    total = math.fsum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    return math.fsum(v * w for v, w in pairs) / total


# --- ncu -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kernel:
    """One profiled kernel launch of ncu's raw page."""

    name: str
    duration_ns: float | None
    metrics: Mapping[str, float]


def parse_ncu_raw(text: str, file: str = "ncu.csv") -> list[Kernel]:
    """Kernels of ``ncu --csv --page raw`` output (the units row under the header is read, so
    durations in any time unit become ns)."""
    header, rows = table(text, file, "Kernel Name")
    units: dict[str, str] = {}
    if rows and "ID" in header and not rows[0][header.index("ID")].strip():
        units = dict(zip(header, (u.strip() for u in rows[0]), strict=False))
        rows = rows[1:]
    metric_cols = [(i, h) for i, h in enumerate(header) if h not in NCU_ID_COLUMNS]
    name_col = header.index("Kernel Name")
    kernels = []
    for row in rows:
        values = {}
        for i, name in metric_cols:
            value = number(row[i]) if i < len(row) else None
            if value is not None:
                values[name] = value
        duration = values.get(DURATION)
        if duration is not None:
            duration *= _TIME_UNITS.get(units.get(DURATION, "").lower(), 1.0)
        kernels.append(Kernel(row[name_col] if name_col < len(row) else "?", duration, values))
    return kernels


def _pick(kernels: Sequence[Kernel], candidates: Sequence[str | tuple[str, ...]]
          ) -> tuple[str, list[tuple[Kernel, float]]] | None:
    """The first candidate any kernel has, and each kernel's value of it (a tuple: the sum of
    those its kernel has, capped at 100 %)."""
    for cand in candidates:
        names = cand if isinstance(cand, tuple) else (cand,)
        found = [(k, [k.metrics[n] for n in names if n in k.metrics]) for k in kernels]
        values = [(k, min(100.0, math.fsum(v))) for k, v in found if v]
        if values:
            label = " + ".join(n for n in names if any(n in k.metrics for k in kernels))
            return label, values
    return None


def ncu_figures(kernels: Sequence[Kernel], options: NcuOptions | None = None) -> ProfilerFigures:
    """The ``ncu.*`` figures of profiled ``kernels``."""
    figs = ProfilerFigures("ncu")
    figs.metrics["ncu.kernels"] = float(len(kernels))
    if not kernels:
        figs.notes.append("ncu profiled no kernel (did the program reach its profile window?)")
        return figs
    timed = all(k.duration_ns is not None for k in kernels)
    if timed:
        figs.metrics["ncu.kernel_time_ms"] = math.fsum(k.duration_ns or 0.0 for k in kernels) / 1e6
    else:
        figs.notes.append(f"{DURATION} missing for some kernels: plain means, not weighted by "
                          "kernel time")

    def weight(k: Kernel) -> float:
        return (k.duration_ns or 0.0) if timed else 1.0

    cycles = all(CYCLES in k.metrics for k in kernels)
    sources: dict[str, str] = {}
    weights: dict[str, str] = {}
    for pipe, candidates in PIPE_METRICS.items():
        picked = _pick(kernels, candidates)
        if picked is None:
            figs.notes.append(f"no {pipe} pipe metric in ncu.csv" + (
                " (GA10x and Hopper run FP16x2 on the FMA pipes: see ncu.fma_pct)"
                if pipe == "fp16" else ""))
            continue
        label, values = picked
        if label.endswith(_ELAPSED) and cycles:  # seed 001's rule: % of elapsed x cycles
            value = _weighted((v, k.metrics[CYCLES]) for k, v in values)
            weights[pipe] = CYCLES
        else:
            value = _weighted((v, weight(k)) for k, v in values)
            weights[pipe] = DURATION if timed else "none (plain mean)"
        if value is not None:
            figs.metrics[f"ncu.{pipe}_pct"] = value
            sources[pipe] = label
    for name in _explicit_metrics(options):
        value = _weighted((k.metrics[name], weight(k)) for k in kernels if name in k.metrics)
        if value is None:
            figs.notes.append(f"metric {name} not in ncu.csv")
        else:
            figs.metrics[f"ncu.{name}"] = value
    figs.info = {"weighting": "gpu__time_duration.sum" if timed else "none (plain mean)",
                 "metrics_from": sources}
    if any(w == CYCLES for w in weights.values()):
        figs.info["weighting"] = weights  # per pipe: which weights made its figure
    return figs


def _explicit_metrics(options: NcuOptions | None) -> list[str]:
    if options is None:
        return []
    pipe_names = {n for cands in PIPE_METRICS.values() for c in cands
                  for n in (c if isinstance(c, tuple) else (c,))}
    return [m for m in options.metrics if not m.startswith(("regex:", "group:", "breakdown:"))
            and m not in (DURATION, CYCLES) and m not in pipe_names]


# --- nsys ------------------------------------------------------------------------------------


def _col(header: Sequence[str], *names: str) -> int | None:
    """Index of the first column whose name (spaces dropped, lower case) is one of ``names``."""
    norm = [re.sub(r"\s+", "", h).lower() for h in header]
    for name in names:
        if name in norm:
            return norm.index(name)
    return None


@dataclass(frozen=True)
class KernelSum:
    """One row of nsys's kernel summary."""

    name: str
    total_ns: float
    instances: int


def parse_nsys_kern_sum(text: str, file: str = "nsys_kern_sum.csv") -> list[KernelSum]:
    """Rows of ``nsys stats --report cuda_gpu_kern_sum`` (or ``gpukernsum``) as CSV."""
    header, rows = table(text, file, "Total Time", "Name")
    total = _col(header, "totaltime(ns)", "totaltime")
    count = _col(header, "instances", "count", "calls")
    name = _col(header, "name")
    if total is None or name is None:
        raise LogFormatError([Problem(file, "", "no Total Time (ns) / Name column")])
    out = []
    for row in rows:
        t = number(row[total]) if total < len(row) else None
        if t is None:
            continue
        n = number(row[count]) if count is not None and count < len(row) else None
        out.append(KernelSum(row[name] if name < len(row) else "?", t, int(n or 0)))
    return out


@dataclass(frozen=True)
class Activity:
    """One kernel of nsys's GPU trace."""

    device: str
    start_ns: float
    duration_ns: float


def parse_nsys_gpu_trace(text: str, file: str = "nsys_gpu_trace.csv") -> list[Activity]:
    """Kernels of ``nsys stats --report cuda_gpu_trace`` (or ``gputrace``) as CSV: the rows with
    a grid size (memory copies and sets have none)."""
    header, rows = table(text, file, "Start", "Duration")
    start = _col(header, "start(ns)", "start")
    dur = _col(header, "duration(ns)", "duration")
    grid = _col(header, "grdx")
    device = _col(header, "device")
    if start is None or dur is None:
        raise LogFormatError([Problem(file, "", "no Start (ns) / Duration (ns) column")])
    out = []
    for row in rows:
        if grid is not None and (grid >= len(row) or not row[grid].strip()):
            continue
        s, d = number(row[start]), number(row[dur])
        if s is None or d is None:
            continue
        dev = row[device] if device is not None and device < len(row) else ""
        out.append(Activity(dev, s, d))
    return out


def busy_fraction(activities: Sequence[Activity]) -> float | None:
    """Mean over GPUs of (union of kernel intervals) / (first start .. last end)."""
    by_device: dict[str, list[tuple[float, float]]] = {}
    for a in activities:
        by_device.setdefault(a.device, []).append((a.start_ns, a.start_ns + a.duration_ns))
    fractions = []
    for spans in by_device.values():
        spans.sort()
        busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_end:
                busy += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        busy += cur_end - cur_start
        span = max(e for _, e in spans) - spans[0][0]
        if span > 0:
            fractions.append(busy / span)
    return math.fsum(fractions) / len(fractions) if fractions else None


def nsys_figures(kern_sum: Sequence[KernelSum] | None, trace: Sequence[Activity] | None
                 ) -> ProfilerFigures:
    """The ``nsys.*`` figures (either input may be missing: None)."""
    figs = ProfilerFigures("nsys")
    if kern_sum is not None:
        total = math.fsum(k.total_ns for k in kern_sum)
        figs.metrics["nsys.kernel_time_ms"] = total / 1e6
        figs.metrics["nsys.kernels"] = float(sum(k.instances for k in kern_sum))
        top = sorted(kern_sum, key=lambda k: k.total_ns, reverse=True)[:TOP_KERNELS]
        if top and total > 0:
            figs.metrics["nsys.top_kernel_pct"] = 100.0 * top[0].total_ns / total
        figs.info["top_kernels"] = [
            {"name": k.name, "time_pct": 100.0 * k.total_ns / total if total else None,
             "total_ms": k.total_ns / 1e6, "instances": k.instances} for k in top]
    if trace is not None:
        busy = busy_fraction(trace)
        if busy is not None:
            figs.metrics["nsys.gpu_busy_pct"] = 100.0 * busy
            figs.info["gpu_busy"] = ("union of kernel intervals / first kernel start .. last "
                                     "kernel end, per GPU, mean over GPUs")
    return figs


# --- nvprof ----------------------------------------------------------------------------------

_LEVEL = re.compile(r"\((\d+)\)\s*$")


def nvprof_value(text: str) -> float | None:
    """A metric value of nvprof's CSV: a number, or a utilisation level ``Low (3)`` -> 3."""
    match = _LEVEL.search(text.strip())
    if match:
        return float(match.group(1))
    return number(text)


def parse_nvprof_metrics(text: str, file: str = "nvprof.csv"
                         ) -> list[tuple[str, int, str, float]]:
    """``(kernel, invocations, metric, avg)`` rows of ``nvprof --csv --metrics ...`` output."""
    header, rows = table(text, file, "Invocations", "Metric Name")
    kernel, inv = header.index("Kernel"), header.index("Invocations")
    metric, avg = header.index("Metric Name"), header.index("Avg")
    out = []
    for row in rows:
        if len(row) <= max(kernel, inv, metric, avg):
            continue
        value, count = nvprof_value(row[avg]), number(row[inv])
        if value is not None and count is not None:
            out.append((row[kernel], int(count), row[metric], value))
    return out


def nvprof_figures(rows: Sequence[tuple[str, int, str, float]],
                   options: NvprofOptions | None = None) -> ProfilerFigures:
    """The ``nvprof.*`` figures: pipe levels x10 as %, invocation-weighted."""
    figs = ProfilerFigures("nvprof")
    kernels: dict[str, int] = {}
    for k, n, _, _ in rows:
        kernels[k] = max(kernels.get(k, 0), n)
    figs.metrics["nvprof.kernels"] = float(sum(kernels.values()))
    for pipe, metric in NVPROF_PIPES.items():
        value = _weighted((10.0 * v, float(n)) for _, n, m, v in rows if m == metric)
        if value is not None:
            figs.metrics[f"nvprof.{pipe}_pct"] = value
    figs.info = {"weighting": "invocations (nvprof's metric summary has no durations)",
                 "scale": "utilisation level 0..10 x 10"}
    return figs


# --- a cell folder ---------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None


def figures_of_cell(cell_dir: Path, tool: str,
                    options: NsysOptions | NcuOptions | NvprofOptions | None = None
                    ) -> ProfilerFigures:
    """The profiler figures of a finished cell. Never raises for a missing or malformed file:
    what could not be read is a note."""
    cell_dir = Path(cell_dir)
    try:
        if tool == "ncu":
            text = _read(cell_dir / "ncu.csv")
            if text is None:
                return _missing(tool, "ncu.csv")
            figs = ncu_figures(parse_ncu_raw(text),
                               options if isinstance(options, NcuOptions) else None)
            figs.info["files"] = ["ncu.csv"]
            return figs
        if tool == "nsys":
            kern = _read(cell_dir / "nsys_kern_sum.csv")
            trace = _read(cell_dir / "nsys_gpu_trace.csv")
            if kern is None and trace is None:
                return _missing(tool, "nsys_kern_sum.csv")
            figs = nsys_figures(None if kern is None else parse_nsys_kern_sum(kern),
                                None if trace is None else parse_nsys_gpu_trace(trace))
            figs.info["files"] = [n for n, t in (("nsys_kern_sum.csv", kern),
                                                 ("nsys_gpu_trace.csv", trace)) if t is not None]
            return figs
        if tool == "nvprof":
            files = sorted(cell_dir.glob("nvprof.*.csv"))
            rows = []
            for path in files:
                text = _read(path) or ""
                if "Metric Name" in text:  # the launcher process's log has no metric table
                    rows += parse_nvprof_metrics(text, path.name)
            if not rows:
                return _missing(tool, "nvprof.<pid>.csv with a metric table")
            figs = nvprof_figures(rows, options if isinstance(options, NvprofOptions) else None)
            figs.info["files"] = [p.name for p in files]
            return figs
    except LogFormatError as exc:
        return ProfilerFigures(tool, notes=[str(p) for p in exc.problems])
    return ProfilerFigures(tool, notes=[f"no figures for profiler {tool!r}"])


def _missing(tool: str, file: str) -> ProfilerFigures:
    return ProfilerFigures(tool, notes=[
        f"no {file} in the cell folder: the tool recorded nothing (did the program reach its "
        "capture range?) or its export failed (see profile_run.json and the log)"])
