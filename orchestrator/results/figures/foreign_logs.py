"""The seed experiments' own output formats, read by the rules their authors computed them with.

Pure functions over text (no I/O). :mod:`orchestrator.results.figures.figure_parsers` wraps each
into a figures parser (``[figures] parser = "dlperf"`` ...), so the same rule reads a cell the sweep
just ran and a log ``orchestrate import`` brings in; :mod:`orchestrator.results.reports.table_rules`
combines the per-cell figures into the seeds' tables.

``dlperf`` (seed 003: DeepLearningExamples' ``main.py`` logs as DLPerf's
``extract_pytorch_logs_time.py`` reads them), one log per run; two variants, as DLPerf wrote two:

* ``timestamps`` (the seed's own, Oneflow-Inc/DLPerf @ 183b8d1,
  ``NVIDIADeepLearningExamples/PyTorch/resnet50v1.5``): DLLogger's stdout lines ``DLL <date time>
  - Epoch: 0 Iteration: 7 ...``; the lines holding ``"Iteration: "`` are counted from 1, the
  timestamp of line ``warmup`` (20) and of line ``warmup + iterations`` (120) are taken, and
  throughput = global batch / ((t120 - t20) / 100), rounded to 2 decimals;
* ``time-values`` (the script in ``../shared/peers/dlperf``, DLPerf @ c89430ba,
  ``PyTorch/resnet50v1.5``, for pytorch/examples-style lines ``Epoch: [0][ 6/53]  Time  0.403 (
  2.123) ...``, also the format of old DLE ``main.py``): lines holding ``"Epoch: "`` whose
  iteration index (``[e][i/n]``) is above 5 are counted; after the first ``warmup`` (20) of them,
  the next ``iterations`` (100) ``Time`` values are summed and throughput = global batch / (sum
  / 100), rounded to 2 decimals.

  Both take the first match of DLPerf's own patterns on a line, with their quirks kept: the
  ``Time`` pattern ``\\d.\\d{1,3}\\s`` reads one digit before the point (a 12.403 s iteration is
  read as 2.403), and a log that never reaches line 120 gives DLPerf's 0 (here: no figure).

``tbd-ncu`` (seed 001: TBD's ``coreutil.py``, tbd-ai/tbd-suite @ ad48842): Nsight Compute's
``--csv`` output, one row per kernel launch and metric (``"ID","Process ID",...,"Metric
Name","Metric Unit","Metric Value"``), read from the row holding that header. Per unit (FMA,
FP16, Tensor, XU = SFU): sum over kernels of ``gpc__cycles_elapsed.max`` x
``sm__inst_executed_pipe_<unit>.avg.pct_of_peak_sustained_elapsed`` / 100, over the sum of the
cycles; printed by coreutil as ``%.5f %``. As coreutil computes it, the kernels are IDs
``0 .. max(ID) - 1`` (its ``range(max(ID))`` leaves the last launch out); a kernel without one of
the metrics stops coreutil with an error, and is reported here.

``tf-timehistory`` (seed 001's throughput runs): TensorFlow's ``TimeHistory: 12.34 seconds,
1234.56 examples/second between steps 0 and 100`` lines; TBD's scripts keep them and compute
nothing, so the figure is ours, stated: the mean examples/second of the windows after the
first (the first holds tf.function tracing and autotuning).

``iteration-durations`` (seed 002: hal-uw/gpu_variability_sc22_artifact @ 7961513,
``cnn_utils/engine.py`` prints ``Iteration Duration <n> <device> : <seconds>`` from every rank
into one file): one series per GPU, kept whole. Per GPU the median and mean with the first
iteration dropped (as the artifact's later ``extract_data.py`` does); across GPUs the spread of
the medians, (max - min) / min. nvprof's ``--system-profiling on`` CSV (one file per process)
gives per-GPU SM clock, power and temperature where present.

``habana`` (seed 004: HabanaAI Model-References ResNet ``train.py``): the ``Epoch: [0]  [
10/5005]  ...  img/s: 612.34 ...`` lines of the main process (one card's images/s: the program
prints per card); the figure is the mean of the printed values after the first ``warmup`` lines.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.errors import LogFormatError, Problem

# --- DLPerf -------------------------------------------------------------------------------------

#: DLPerf's patterns, as its scripts compile them.
DLPERF_TIMESTAMP = re.compile(r"(\d{4}-\d{1,2}-\d{1,2}\s\d{1,2}:\d{1,2}:\d{1,2}.\d{1,6})", re.S)
DLPERF_INDEX = re.compile(r"\[.*\]\[(.*)\]")
DLPERF_TIME = re.compile(r"(\d{1}.\d{1,3}\s)", re.S)
#: The iteration index DLPerf's ``time-values`` script skips up to (``if skip_time > 5``).
DLPERF_SKIP = 5
DLPERF_VARIANTS = ("timestamps", "time-values")


@dataclass
class DLPerfSpeed:
    """One log's throughput by DLPerf's rule, and how it was found."""

    variant: str
    ips: float | None
    lines: int
    warmup: int
    train: int
    detail: dict[str, Any] = field(default_factory=dict)


def dlperf_variant(text: str) -> str:
    """Which DLPerf rule a log is for: DLLogger stdout lines (``Iteration: ``) -> timestamps,
    pytorch/examples-style ``Epoch: [e][i/n]`` lines -> time-values."""
    for line in text.splitlines():
        if "Iteration: " in line and DLPERF_TIMESTAMP.search(line):
            return "timestamps"
        if "Epoch: " in line and DLPERF_INDEX.search(line):
            return "time-values"
    return "timestamps"


def dlperf_speed(text: str, global_batch: int, *, warmup: int = 20, train: int = 120,
                 variant: str | None = None, file: str = "log") -> DLPerfSpeed:
    """Throughput of one log by DLPerf's rule (``warmup``/``train``: its ``--warmup_batches`` and
    ``--train_batches``). ``ips`` None where the log ends before line ``train`` (DLPerf: 0).
    :class:`LogFormatError` where a line the rule reads lacks its number."""
    variant = variant or dlperf_variant(text)
    if variant not in DLPERF_VARIANTS:
        raise ValueError(f"unknown DLPerf variant {variant!r}")
    reader = _dlperf_timestamps if variant == "timestamps" else _dlperf_time_values
    return reader(text, global_batch, warmup, train, file)


def _dlperf_timestamps(text: str, batch: int, warmup: int, train: int, file: str
                       ) -> DLPerfSpeed:
    out = DLPerfSpeed("timestamps", None, 0, warmup, train)
    start: str | None = None
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if "Iteration: " not in line:
            continue
        out.lines += 1
        if out.lines not in (warmup, train):
            continue
        found = DLPERF_TIMESTAMP.findall(line)
        if not found:
            raise LogFormatError([Problem(file, f"line {number}", "DLPerf's rule reads this "
                                          "line's timestamp, and it has none")])
        if out.lines == warmup:
            start = found[0]
            out.detail["start"] = {"line": number, "time": start}
            continue
        end = found[0]
        out.detail["end"] = {"line": number, "time": end}
        if start is None:  # warmup >= train: DLPerf would fail on an empty start time
            raise LogFormatError([Problem(file, f"line {number}", "no start timestamp before "
                                          f"line {train} (warmup {warmup})")])
        cost = (_dlperf_time(end) - _dlperf_time(start)).total_seconds()
        out.ips = round(float(batch) / (cost / (train - warmup)), 2) if cost > 0 else None
        break
    return out


def _dlperf_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")


def _dlperf_time_values(text: str, batch: int, warmup: int, train: int, file: str
                        ) -> DLPerfSpeed:
    out = DLPerfSpeed("time-values", None, 0, warmup, train)
    cost = 0.0
    values: list[float] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if "Epoch: " not in line:
            continue
        index = DLPERF_INDEX.findall(line)
        try:
            skip = int(index[0].split("/")[0]) if index else None
        except ValueError:
            skip = None
        if skip is None:
            raise LogFormatError([Problem(file, f"line {number}", "an 'Epoch: ' line without "
                                          "DLPerf's [epoch][i/n] index")])
        if skip <= DLPERF_SKIP:
            continue
        out.lines += 1
        if out.lines > warmup:
            found = DLPERF_TIME.findall(line)
            if not found:
                raise LogFormatError([Problem(file, f"line {number}", "DLPerf's rule reads "
                                              "this line's Time value, and it has none")])
            value = float(found[0].strip())
            values.append(value)
            cost += value
        if out.lines == train:
            iterations = train - warmup
            out.ips = round(float(batch / (cost / iterations)), 2) if cost > 0 else None
            break
    out.detail["time_values"] = len(values)
    return out


#: DLPerf's model names in its file names -> the architecture (cell parameter ``arch``).
DLPERF_MODELS = {"r50": "resnet50", "rn50": "resnet50", "resnet50": "resnet50"}
#: DLPerf's precision words -> the cell parameter ``precision`` (its scripts call amp "fp16" too).
DLPERF_PRECISIONS = {"fp32": "fp32", "amp": "amp", "fp16": "amp"}
#: DLPerf's folder layout: ``<nodes>n<gpus>g/<model>_b<batch>_<precision>_<run>.log``.
DLPERF_LAYOUT = (
    r"(?:.*/)?(?P<nodes>[0-9]+)n(?P<gpus>[0-9]+)g/(?P<model>[a-z][a-z0-9]*)_b(?P<batch_size>"
    r"[0-9]+)_(?P<precision>fp32|amp|fp16)_(?P<repeat>[0-9]+)\.log"
)


def dlperf_median(values: Sequence[float]) -> float:
    """DLPerf's ``compute_median`` (the median of the runs' speeds, rounded to 2 decimals)."""
    return round(statistics.median(values), 2)


def dlperf_average(values: Sequence[float]) -> float:
    """DLPerf's ``compute_average`` (the mean of the runs' speeds, rounded to 2 decimals)."""
    return round(math.fsum(values) / len(values), 2)


# --- TBD: Nsight Compute CSV (coreutil.py) -------------------------------------------------------

TBD_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time",'
              '"Context","Stream","Section Name","Metric Name","Metric Unit","Metric Value"')
TBD_CYCLES = "gpc__cycles_elapsed.max"
#: coreutil.py's units and the metric of each.
TBD_FIELDS: Mapping[str, str] = {
    "fma": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_elapsed",
    "fp16": "sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_elapsed",
    "tensor": "sm__inst_executed_pipe_tensor.avg.pct_of_peak_sustained_elapsed",
    "sfu": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed",
}


@dataclass
class CoreUtil:
    """Per-unit utilisation (%) by coreutil.py's rule, and what it was computed over."""

    pct: dict[str, float]
    kernels: int
    cycles: float
    launches: int
    notes: list[str] = field(default_factory=list)


def _number(text: str) -> float | None:
    t = text.strip().strip('"').replace(",", "")
    try:
        value = float(t)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def details_header(lines: Sequence[str]) -> int | None:
    """The index of the header row of ncu's details page (``ncu --csv``), or None: TBD's
    :data:`TBD_HEADER` (ncu 2019-2020) or today's, which puts NVTX, block/grid size, device
    and CC columns where that had "Kernel Time" (ncu 2025.3.1 on an H100, 2026-11-25); what
    the rows need is the ID, Metric Name and Metric Value columns."""
    for i, line in enumerate(lines):
        if TBD_HEADER in line or (line.startswith('"ID",') and all(
                f'"{col}"' in line for col in ("Metric Name", "Metric Unit", "Metric Value"))):
            return i
    return None


def parse_ncu_long_csv(text: str, file: str = "ncu.csv") -> dict[int, dict[str, float]]:
    """``ID -> {metric name: value}`` of ``ncu --csv`` output (the details page, one row per
    kernel and metric), from its header row (what precedes it skipped, as coreutil does; see
    :func:`details_header`). Values may carry thousands separators."""
    lines = text.splitlines()
    start = details_header(lines)
    if start is None:
        raise LogFormatError([Problem(file, "", "no Nsight Compute CSV header (\"ID\",\"Process "
                                      "ID\",...,\"Metric Value\"): not ncu --csv output")])
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = [h.strip() for h in next(reader)]
    col = {name: header.index(name) for name in ("ID", "Metric Name", "Metric Value")}
    kernels: dict[int, dict[str, float]] = {}
    problems = []
    for offset, row in enumerate(reader, start=start + 2):
        if not row or len(row) < len(header):
            continue  # the program's own output after the table, a blank line
        try:
            ident = int(row[col["ID"]])
        except ValueError:
            continue
        value = _number(row[col["Metric Value"]])
        if value is None:
            problems.append(Problem(file, f"line {offset}", f"metric value "
                                    f"{row[col['Metric Value']]!r} is not a number"))
            continue
        kernels.setdefault(ident, {})[row[col["Metric Name"]].strip()] = value
    if problems:
        raise LogFormatError(problems)
    return kernels


def coreutil(kernels: Mapping[int, Mapping[str, float]]) -> CoreUtil:
    """coreutil.py's utilisation per unit: cycle-weighted means of the elapsed pipe metrics over
    the kernels ``0 .. max(ID) - 1``."""
    if not kernels:
        return CoreUtil({}, 0, 0.0, 0, ["no kernel in the CSV"])
    last = max(kernels)
    # A unit whose metric no kernel has (Hopper has no FP16 pipe: ncu knows no
    # sm__inst_executed_pipe_fp16 there) gets no figure; coreutil.py stops with an error.
    fields = {unit: m for unit, m in TBD_FIELDS.items()
              if any(m in metrics for metrics in kernels.values())}
    notes: list[str] = [f"{unit}: {m} in no kernel (no such pipe on this GPU?): no figure; "
                        "coreutil.py stops with an error here"
                        for unit, m in TBD_FIELDS.items() if unit not in fields]
    total = 0.0
    weighted = dict.fromkeys(fields, 0.0)
    used = 0
    for ident in range(last):  # coreutil: for cur_id in range(max_id)
        metrics = kernels.get(ident)
        missing = [] if metrics is None else [
            m for m in (TBD_CYCLES, *fields.values()) if m not in metrics]
        if metrics is None or missing:
            notes.append(f"kernel ID {ident}: " + ("absent" if metrics is None else
                         f"no {', '.join(missing)}") + " (coreutil.py stops with an error here; "
                         "left out)")
            continue
        cycles = float(int(metrics[TBD_CYCLES]))
        total += cycles
        used += 1
        for unit, metric in fields.items():
            weighted[unit] += cycles * metrics[metric] / 100
    notes.append(f"kernel ID {last} (the last launch) left out, as coreutil.py's range(max_id) "
                 "does")
    pct = {unit: 100 * value / total for unit, value in weighted.items()} if total > 0 else {}
    return CoreUtil(pct, used, total, len(kernels), notes)


def coreutil_lines(result: CoreUtil) -> list[str]:
    """What coreutil.py prints: ``fma\\t12.34567 %`` per unit."""
    return [f"{unit}\t{value:.5f} %" for unit, value in result.pct.items()]


# --- TensorFlow TimeHistory (TBD's throughput runs) ----------------------------------------------

TIME_HISTORY = re.compile(
    r"TimeHistory: ([0-9.]+) seconds, ([0-9.]+) examples/second between steps (\d+) and (\d+)")


def time_history(text: str) -> list[tuple[float, float, int, int]]:
    """``(seconds, examples/s, first step, last step)`` of every TimeHistory line."""
    return [(float(m[1]), float(m[2]), int(m[3]), int(m[4])) for m in TIME_HISTORY.finditer(text)]


# --- seed 002: per-GPU iteration durations, nvprof system profiling -------------------------------

ITERATION_DURATION = re.compile(
    r"Iteration Duration (\d+) (\d+) : ([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)")


def iteration_durations(text: str) -> dict[int, list[tuple[int, float]]]:
    """Per device (the GPU index the rank printed), its ``(iteration, seconds)`` in log order."""
    series: dict[int, list[tuple[int, float]]] = {}
    for match in ITERATION_DURATION.finditer(text):
        series.setdefault(int(match[2]), []).append((int(match[1]), float(match[3])))
    return dict(sorted(series.items()))


@dataclass
class GpuSeries:
    """One GPU's iteration series and its summary (the first iteration dropped)."""

    gpu: int
    times: list[float]
    median_s: float | None
    mean_s: float | None
    max_s: float | None
    min_s: float | None


def per_gpu(series: Mapping[int, Sequence[tuple[int, float]]], drop_first: int = 1
            ) -> list[GpuSeries]:
    """Each GPU's series with its median/mean/max/min over the iterations after the first
    ``drop_first``."""
    out = []
    for gpu, points in series.items():
        times = [t for _, t in points]
        kept = times[drop_first:]
        out.append(GpuSeries(
            gpu, times, statistics.median(kept) if kept else None,
            math.fsum(kept) / len(kept) if kept else None, max(kept, default=None),
            min(kept, default=None)))
    return out


def spread_pct(values: Sequence[float]) -> float | None:
    """(max - min) / min, in %, of per-GPU figures (None for fewer than two)."""
    vals = [v for v in values if v is not None and v > 0]
    if len(vals) < 2:
        return None
    return 100.0 * (max(vals) - min(vals)) / min(vals)


#: nvprof's system-profiling columns (substring, case-insensitive) -> our telemetry name.
NVPROF_SYSTEM = {"sm clock": "sm_clock_mhz", "temperature": "temp_c", "power": "power_w"}
_DEVICE_INDEX = re.compile(r"\((\d+)\)\s*$")


def nvprof_system(text: str, file: str = "nvprof.csv") -> dict[int, dict[str, list[float]]]:
    """Per GPU, the SM clock, temperature and power samples of an nvprof ``--print-gpu-trace
    --system-profiling on --csv`` log (columns found by name; power in mW becomes W; the GPU is
    the ``(N)`` at the end of the Device column). Empty when the file has no such columns."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("==")]
    start = next((i for i, ln in enumerate(lines) if '"Start"' in ln or ln.startswith("Start,")),
                 None)
    if start is None:
        raise LogFormatError([Problem(file, "", "no nvprof GPU trace (a CSV header with Start)")])
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = [h.strip() for h in rows[0]]
    units = rows[1] if len(rows) > 1 and rows[1] and _number(rows[1][0]) is None else None
    body = rows[2:] if units is not None else rows[1:]
    device = next((i for i, h in enumerate(header) if h.lower() == "device"), None)
    cols: dict[int, tuple[str, float]] = {}
    for i, name in enumerate(header):
        for key, ours in NVPROF_SYSTEM.items():
            if key in name.lower():
                unit = (units[i] if units is not None and i < len(units) else name).lower()
                scale = 0.001 if ours == "power_w" and "mw" in unit else 1.0
                cols[i] = (ours, scale)
    out: dict[int, dict[str, list[float]]] = {}
    for row in body:
        gpu = 0
        if device is not None and device < len(row):
            match = _DEVICE_INDEX.search(row[device])
            if match is None:
                continue
            gpu = int(match[1])
        for i, (ours, scale) in cols.items():
            value = _number(row[i]) if i < len(row) and row[i].strip() else None
            if value is not None:
                out.setdefault(gpu, {}).setdefault(ours, []).append(value * scale)
    return out


# --- Habana Model-References train.py ------------------------------------------------------------

HABANA_LINE = re.compile(r"Epoch: \[(\d+)\]\s+\[\s*(\d+)/(\d+)\].*?img/s: ([0-9.]+)")


def habana_img_per_s(text: str) -> list[tuple[int, int, float]]:
    """``(epoch, step, img/s)`` of every training line the main process printed."""
    return [(int(m[1]), int(m[2]), float(m[4])) for m in HABANA_LINE.finditer(text)]
