"""Table rules: how a run's cells become the numbers of its table, named and chosen per matrix.

Each seed experiment computed its table by a rule of its own; a matrix names the rule its table
follows (``[matrix] table_rule = "dlperf"``, recorded in ``plan.json`` so ``report`` rebuilds the
same table from disk), and every table says which rule made its numbers (a line above it, the
``rule`` column of ``summary.csv``). :mod:`orchestrator.results.reports.summary` applies the rule;
the per-cell figures it combines come from the parsers of
:mod:`orchestrator.results.figures.foreign_logs`.

``median`` (the default, ours)
    per configuration, the median images/s (``train.total_ips`` / ``val.total_ips``) of the
    repeats that ended ok; speedup and efficiency against the 1-GPU row; ratios to a baseline.
``dlperf`` (seed 003)
    DLPerf's ``extract_pytorch_logs_time.py``: per run (log) ``dlperf.total_ips`` (its rule,
    rounded to 2), per configuration the median of the runs rounded to 2 (its
    ``compute_median``) and their mean (``compute_average``), speedup = median / the 1-GPU
    median, rounded to 2.
``dle`` (seed 000)
    DeepLearningExamples' own run summary: ``train.compute_ips`` / ``val.compute_ips`` as
    DLE's logger reports it (``dle.train.compute_ips``: its mean of per-iteration ips, warmup
    included), median over repeats; the baseline ratio (Bitfusion / native) on it. Two decimals,
    as the seed's table.
``tbd`` (seed 001)
    TBD's ``coreutil.py``: per configuration the FMA, FP16, Tensor and SFU utilisation (%), each
    the median over repeats of ``tbd.<unit>_pct`` (elapsed pipe metrics weighted by
    ``gpc__cycles_elapsed.max``), five decimals as coreutil prints them; images/s where the cells
    have it.
``per-gpu`` (seed 002)
    one column per GPU: the median iteration time of each GPU (``gpu<N>.iteration_median_s``,
    first iteration dropped), the spread of those medians across GPUs (``per_gpu.spread_pct``)
    and, where recorded, each GPU's mean power and SM clock; median over repeats.
``habana`` (seed 004)
    images/s per card (``habana.img_per_s_card``, else ``train.total_ips`` / cards) and scaling
    % = per-card images/s of the row / per-card images/s of the 1-card row, as the seed's table.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.folders.run_folder import gpus_of, throughput_key


@dataclass(frozen=True)
class Column:
    """A column of figures, the one way a table gets one: over a group's ok repeats,
    ``reduce`` of each result's first figure of ``figures`` that it has (numbers only); the
    text table shows it under ``header`` with ``digits`` decimals, summary.csv as ``csv``. A
    ``{gpu}`` in its names makes one column per GPU the results have (``gpu{gpu}.power_w_mean``).

    Where it is listed says which tables show it, once a row has a value:
    :data:`orchestrator.results.reports.summary.METRIC_COLUMNS` (every table), or a
    :class:`TableRule`'s ``columns`` (the tables of that rule only)."""

    header: str
    csv: str
    figures: tuple[str, ...]
    digits: int = 1
    reduce: Callable[[list[float]], float] = statistics.median

    @property
    def per_gpu(self) -> bool:
        return "{gpu}" in self.csv

    def for_gpu(self, gpu: int) -> Column:
        """The column of one GPU of a ``{gpu}`` column."""
        return replace(self, header=self.header.format(gpu=gpu), csv=self.csv.format(gpu=gpu),
                       figures=tuple(f.format(gpu=gpu) for f in self.figures))

    def value(self, metrics: Iterable[Mapping[str, Any]]) -> float | None:
        """``reduce`` over the results' (``metrics``) figure; None when none has it."""
        found = [next((m[k] for k in self.figures if k in m), None) for m in metrics]
        vals = [float(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool)]
        return self.reduce(vals) if vals else None


@dataclass(frozen=True)
class TableRule:
    """How a table's numbers are made (see the module docstring)."""

    name: str
    #: Where the rule comes from, for the line above the table.
    source: str
    #: The figure a row's main number is made of, per mode (``train`` / ``infer``); None: the
    #: row has no main number (tbd: the utilisations are the table).
    figure: Callable[[str], str | None]
    #: The header of the main number.
    header: str
    #: Repeats -> the row's number.
    aggregate: Callable[[Sequence[float]], float] = statistics.median
    digits: int = 1
    #: Divide each cell's figure by its cards first (per-card throughput).
    per_card: bool = False
    #: ``speedup``: x vs the 1-GPU row with efficiency; ``scaling``: % of the 1-card row's
    #: per-card number (the row's number is per card already).
    scaling: Literal["speedup", "scaling"] = "speedup"
    #: Speedups rounded as the rule rounds them (None: not rounded).
    speedup_digits: int | None = None
    #: Also the mean of the repeats (DLPerf's average_speed), under this header.
    mean_header: str | None = None
    #: The rule's own columns (:class:`Column`; a ``{gpu}`` one per GPU the rows have), shown
    #: after the main number's.
    columns: tuple[Column, ...] = field(default=())
    #: The configuration the rule's own figures were measured in, (parameter, value, what it
    #: is): when no row of a table has it, the line above the table says so.
    measured_in: tuple[str, str, str] | None = None

    def unmeasured_note(self, params: Sequence[Mapping[str, Any]]) -> str:
        """What the line above a table adds when no row (``params``: the rows' parameters) ran
        the configuration the rule's own figures come from; empty when some row did."""
        if self.measured_in is None:
            return ""
        key, value, what = self.measured_in
        if any(str(p.get(key)) == value for p in params):
            return ""
        return f"the rule's own figures were measured in {what}, which no row of this table ran"


RULES: dict[str, TableRule] = {
    "median": TableRule(
        "median", "orchestrate: median of the ok repeats' images/s", throughput_key,
        "images/s (median)"),
    "dlperf": TableRule(
        "dlperf", "DLPerf extract_pytorch_logs_time.py: per log the speed of DLPerf's line "
        "window, rounded to 2; per row the median (and mean) of the runs, rounded to 2; speedup = "
        "median / 1-GPU median, rounded to 2",
        lambda mode: "dlperf.total_ips", "samples/s (DLPerf median)", fl.dlperf_median, 2,
        speedup_digits=2, mean_header="samples/s (DLPerf mean)"),
    "dle": TableRule(
        "dle", "DeepLearningExamples main.py's own summary: train/val.compute_ips (DLE's mean "
        "of per-iteration compute ips), median over repeats; ratios on it",
        lambda mode: "dle." + throughput_key(mode, "compute_ips"),
        "compute_ips (DLE)", statistics.median, 2),
    "tbd": TableRule(
        "tbd", "TBD coreutil.py: per unit sum(gpc__cycles_elapsed.max x pipe % of peak "
        "sustained elapsed) / sum(cycles), median over repeats, printed to 5 decimals",
        throughput_key, "images/s (median)", statistics.median, 1,
        columns=(Column("FMA %", "tbd_fma_pct", ("tbd.fma_pct",), 5),
                 Column("FP16 %", "tbd_fp16_pct", ("tbd.fp16_pct",), 5),
                 Column("Tensor %", "tbd_tensor_pct", ("tbd.tensor_pct",), 5),
                 Column("SFU %", "tbd_sfu_pct", ("tbd.sfu_pct",), 5))),
    "per-gpu": TableRule(
        "per-gpu", "per GPU: median iteration time (first iteration dropped); spread = (max - "
        "min) / min of the GPUs' medians; medians over repeats",
        throughput_key, "images/s (median)", statistics.median, 1,
        columns=(Column("GPU {gpu} s/iter", "gpu{gpu}_iteration_median_s",
                        ("gpu{gpu}.iteration_median_s",), 4),
                 Column("spread %", "spread_pct", ("per_gpu.spread_pct",), 2),
                 Column("GPU {gpu} W", "gpu{gpu}_power_w_mean", ("gpu{gpu}.power_w_mean",), 0),
                 Column("GPU {gpu} MHz", "gpu{gpu}_sm_clock_mhz_mean",
                        ("gpu{gpu}.sm_clock_mhz_mean",), 0))),
    "habana": TableRule(
        "habana", "Habana Model-References: images/s per card (the program's per-card img/s); "
        "scaling % = per-card images/s / the 1-card row's", lambda mode: "habana.img_per_s_card",
        "img/s per card (median)", statistics.median, 0, per_card=True, scaling="scaling",
        measured_in=("hpu_mode", "graph", "graph mode (torch.jit.trace, Habana 0.13: the seed's "
                     "679, 304 and 601 images/s)")),
}
DEFAULT_RULE = "median"
RULE_NAMES = tuple(RULES)


def table_rule(name: str | None) -> TableRule:
    """The rule called ``name`` (None: the default); an unknown name is a ValueError."""
    if name is None:
        return RULES[DEFAULT_RULE]
    try:
        return RULES[name]
    except KeyError:
        raise ValueError(f"unknown table rule {name!r}; known: {', '.join(RULES)}") from None


def cell_value(rule: TableRule, mode: str, metrics: Mapping[str, Any], params: Mapping[str, Any]
               ) -> float | None:
    """A cell's number under ``rule``: its figure (per card where the rule says so; a per-card
    rule takes the cell's throughput / its cards where the program printed no per-card figure)."""
    name = rule.figure(mode)
    if name is None:
        return None
    value = _number(metrics.get(name))
    if value is not None:
        return value
    if rule.per_card:
        total = _number(metrics.get(throughput_key(mode)))
        cards = gpus_of(params)
        if total is not None and cards:
            return total / cards
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


_GPU_KEY = re.compile(r"^gpu(\d+)\.")


def expand_columns(rule: TableRule, metrics: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The rule's columns, a ``{gpu}`` one repeated for every GPU the results have (in order)."""
    gpus = sorted({int(m[1]) for ms in metrics for k in ms for m in [_GPU_KEY.match(k)] if m})
    out: list[Column] = []
    for column in rule.columns:
        out += [column.for_gpu(g) for g in gpus] if column.per_gpu else [column]
    return out
