"""Summaries of a run, built only from what is on disk.

One row per cell group (a cell without its repeat): the median over the repeats that ended ok,
the spread (min..max), and where the matrix has a ``gpus`` axis, speedup and scaling efficiency
against the 1-GPU group with otherwise equal parameters.

Comparisons stay within one software stack: a ratio to a baseline row or a speedup between rows
whose cells ran on different stacks (:func:`stack_key`: torch, torchvision, CUDA, cuDNN, the NGC
release, Gaudi software, as each result.json's ``env`` records them, the release from the
result's ``provenance`` where the env does not say) is marked as a cross-stack comparison that
names what differs (``cross-stack: torch 2.1.0 vs 2.4.0``), never a bare ratio. A baseline on
``ngc_release`` compares releases by design: its ratios are labelled as the release comparison
(``release comparison: NGC 24.10 vs 24.05, torch ...``), not as a cross-stack warning.

Which release each row ran (:func:`release_of`: the image's release as the backend recorded it,
or the NGC/Gaudi release the workload saw) is a ``release`` column when rows differ in it and no
``ngc_release`` column already says so; a row whose repeats ran different releases (hosts with
different drivers, ``release = "auto"``) shows them all and is marked ``*``.

Optional columns (:data:`METRIC_COLUMNS`: telemetry and profiler figures) are shown, and written
to summary.csv, when any row has them. A group with a repeat whose GPU throttled during the
measured window (``telemetry.throttled``) gets ``!`` after its images/s and a footnote; the csv
column ``throttled`` counts such repeats. A group whose ok repeats spread beyond the stated
bound (:func:`orchestrator.results.statistics.stats.unstable`: (max - min) / median > 10 % over at
least 2 ok repeats) gets ``?`` and a footnote; the csv column ``unstable`` says it for every group
with 2 or more ok repeats.
"""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from orchestrator.config.syntax import RELEASE_PARAM, param_matches, parse_baseline
from orchestrator.results.figures.rerun import THROTTLED
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    throughput_key,
    write_file,
)
from orchestrator.results.reports import table_rules
from orchestrator.results.reports.csv_out import RowWriter
from orchestrator.results.reports.table_rules import Column, TableRule
from orchestrator.results.statistics import stats


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.median(vals) if vals else None


#: The columns of figures every table shows once a row has the figure (:class:`Column`: a
#: rule's own are its ``columns``), in table order: telemetry (workload/telemetry.py), then the
#: profilers' figures (orchestrator/results/figures/profiler_figures.py; ncu's, else nvprof's).
#: A new column of figures is one more entry here (docs/contributing.md), never a GroupRow field.
METRIC_COLUMNS: tuple[Column, ...] = (
    Column("W", "power_mean_w", ("telemetry.power_mean_w",), 0),
    Column("J/image", "energy_per_image_j", ("telemetry.energy_per_image_j",), 3),
    Column("max C", "temp_max_c", ("telemetry.temp_max_c",), 0, max),
    Column("SM MHz", "sm_clock_mean_mhz", ("telemetry.sm_clock_mean_mhz",), 0),
    Column("FMA %", "fma_pct", ("ncu.fma_pct", "nvprof.fma_pct")),
    Column("FP16 %", "fp16_pct", ("ncu.fp16_pct", "nvprof.fp16_pct")),
    Column("Tensor %", "tensor_pct", ("ncu.tensor_pct", "nvprof.tensor_pct")),
    Column("SFU %", "sfu_pct", ("ncu.sfu_pct", "nvprof.sfu_pct")),
    Column("GPU busy %", "gpu_busy_pct", ("nsys.gpu_busy_pct",)),
)
#: The footnote of a row whose cells ran under ncu (``~`` after its images/s).
NCU_NOTE = ("~ ran under ncu, which slows the whole program, not only its profile window (0.64x "
            "outside a one-iteration window on an H100, benchmarks/README.md): its images/s is "
            "not the configuration's throughput")


def _under_ncu(row: GroupRow) -> bool:
    return row.params.get("profiler") == "ncu"


#: The footnote of a row whose ok repeats spread beyond the bound (``?`` after its images/s).
UNSTABLE_NOTE = (f"? unstable: the ok repeats spread too far ({stats.UNSTABLE_RULE}; "
                 "summary.csv: unstable): the machine was not steady (load, clocks: each "
                 "cell's result.json machine); run it again before trusting the figure")
THROTTLE_NOTE = ("! the GPU throttled (clocks held down by a power or thermal limit) during the "
                 "measured window of a repeat (summary.csv: throttled; [matrix] rerun_throttled "
                 "re-runs such cells)")


@dataclass
class GroupRow:
    """The summary of one cell group: the table's own numbers (the main figure and its spread,
    speedup, efficiency, the ratio to a baseline, latency, loss), and the values of its
    :class:`Column` s by csv name (``extra``: :data:`METRIC_COLUMNS`; ``rule_columns``: the
    rule's)."""

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
    #: The software stacks its ok cells ran on (:func:`stack_key`), distinct, in order.
    stacks: list[StackKey] = field(default_factory=list)
    #: "ratio" / "speedup" -> what differs from the row it is compared with (cross-stack only).
    cross_stack: dict[str, str] = field(default_factory=dict)
    #: "ratio" -> what differs from the baseline row, where the baseline compares releases.
    release_comparison: dict[str, str] = field(default_factory=dict)
    #: The releases its ok cells ran (:func:`release_of`), distinct, in order.
    releases: list[str] = field(default_factory=list)
    #: METRIC_COLUMNS values by csv name (only those the group's results have).
    extra: dict[str, float] = field(default_factory=dict)
    #: ok repeats whose GPU throttled; None when no ok repeat says.
    throttled: int | None = None
    #: Its ok repeats spread beyond the bound
    #: (:func:`orchestrator.results.statistics.stats.unstable`); None when there are too few to
    #: judge.
    unstable: bool | None = None
    #: The table rule that made ``ips``, speedup and the rule's columns
    #: (:mod:`orchestrator.results.reports.table_rules`).
    rule: str = table_rules.DEFAULT_RULE
    #: The mean of the repeats, where the rule reports it (DLPerf's average_speed).
    ips_mean: float | None = None
    #: The rule's columns by csv name.
    rule_columns: dict[str, float] = field(default_factory=dict)

    def csv_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"group": self.group, **self.params}
        if self.rule != table_rules.DEFAULT_RULE:
            row["table_rule"] = self.rule
        row.update(
            runs=self.runs, ok=self.ok,
            statuses=";".join(f"{k}={v}" for k, v in sorted(self.statuses.items())),
            images_per_s=self.ips, images_per_s_min=self.ips_min, images_per_s_max=self.ips_max,
            compute_images_per_s=self.compute_ips, latency_p50_ms=self.latency_p50_ms,
            latency_p99_ms=self.latency_p99_ms, loss=self.loss, speedup=self.speedup,
            efficiency=self.efficiency, ratio_vs_baseline=self.ratio,
            cross_stack="; ".join(f"{k}: {v}" for k, v in sorted(self.cross_stack.items())),
        )
        if self.ips_mean is not None:
            row["images_per_s_mean"] = self.ips_mean
        row.update(self.rule_columns)
        if self.releases:
            row["release"] = "/".join(self.releases)
        if self.release_comparison:
            row["release_comparison"] = "; ".join(
                f"{k}: {v}" for k, v in sorted(self.release_comparison.items()))
        row.update(self.extra)
        if self.throttled is not None:
            row["throttled"] = self.throttled
        if self.unstable is not None:
            row["unstable"] = self.unstable
        return row


#: A cell's software stack: (part, version) of each :data:`STACK_FIELDS` part its env records.
StackKey = tuple[tuple[str, str], ...]
#: The parts of a software stack a comparison must hold equal: (name shown, key in ``env``).
STACK_FIELDS: tuple[tuple[str, str], ...] = (
    ("torch", "torch_version"), ("torchvision", "torchvision_version"),
    ("CUDA", "cuda_version"), ("cuDNN", "cudnn_version"), ("NGC", "container_release"),
    ("Gaudi software", "habana_version"),
)


#: The part of the stack a backend's provenance names, by the image's release family.
_RELEASE_PART = {"ngc": ("NGC", "container_release"), "habana": ("Gaudi software",
                                                                 "habana_version")}


def stack_key(result: CellResult) -> StackKey:
    """The software stack ``result`` ran on, as far as its env (the workload's account) says,
    with the image's release from its provenance where the env does not name one."""
    env = dict(result.env) if isinstance(result.env, dict) else {}
    prov = result.provenance if isinstance(result.provenance, dict) else {}
    part = _RELEASE_PART.get(str(prov.get("release_family")))
    if part and prov.get("release") and env.get(part[1]) in (None, ""):
        env[part[1]] = prov["release"]
    return tuple((name, str(env[key])) for name, key in STACK_FIELDS
                 if env.get(key) not in (None, ""))


def release_of(result: CellResult) -> str | None:
    """The release ``result`` ran: the image's as the backend recorded it (``provenance``),
    else the NGC or Gaudi release the workload saw in its container; None when neither says."""
    prov = result.provenance if isinstance(result.provenance, dict) else {}
    if prov.get("release"):
        return str(prov["release"])
    env = result.env if isinstance(result.env, dict) else {}
    found = env.get("container_release") or env.get("habana_version")
    return str(found) if found else None


def stack_difference(row: GroupRow, ref: GroupRow) -> str:
    """What differs between the stacks of ``row`` and ``ref`` (``torch 2.1.0 vs 2.4.0, CUDA
    12.2 vs 12.4``; parts only one side records are not compared), or '' if nothing does."""
    parts: dict[str, tuple[set[str], set[str]]] = {}
    for side, keys in ((0, row.stacks), (1, ref.stacks)):
        for key in keys:
            for name, version in key:
                parts.setdefault(name, (set(), set()))[side].add(version)
    shown = [f"{name} {'/'.join(sorted(mine))} vs {'/'.join(sorted(theirs))}"
             for name, (mine, theirs) in parts.items() if mine and theirs and mine != theirs]
    return ", ".join(shown)


def summarize(results: Sequence[CellResult], rule: TableRule | None = None) -> list[GroupRow]:
    """Group results by cell group (plan order) and compute, by the table ``rule`` (default:
    :data:`~orchestrator.results.reports.table_rules.DEFAULT_RULE`), each row's number, speedup and
    efficiency, and the rule's columns. Control measurements (role ``control``) are no
    configuration: they make no row (:func:`control_note` says what they measured)."""
    rule = rule or table_rules.table_rule(None)
    rows: dict[str, GroupRow] = {}
    ok_by_group: dict[str, list[CellResult]] = {}
    for res in results:
        if res.role == "control":
            continue
        row = rows.setdefault(res.group, GroupRow(res.group, dict(res.params), rule=rule.name))
        row.runs += 1
        row.statuses[res.status.value] = row.statuses.get(res.status.value, 0) + 1
        if res.status is Status.OK:
            ok_by_group.setdefault(res.group, []).append(res)
            if stack_key(res) not in row.stacks:
                row.stacks.append(stack_key(res))
            release = release_of(res)
            if release is not None and release not in row.releases:
                row.releases.append(release)
    for row in rows.values():
        ok = ok_by_group.get(row.group, [])
        row.ok = len(ok)
        mode = row.params.get("mode", "train")
        found = [table_rules.cell_value(rule, mode, r.metrics, r.params) for r in ok]
        ips = [v for v in found if v is not None]
        if ips:
            row.ips, row.ips_min, row.ips_max = rule.aggregate(ips), min(ips), max(ips)
            row.unstable = stats.unstable(ips)
            if rule.mean_header:
                row.ips_mean = table_rules.fl.dlperf_average(ips)
        row.compute_ips = _median(r.metrics.get(throughput_key(mode, "compute_ips")) for r in ok)
        # inference latency: infer cells, and training runs with a validation pass (DLE's)
        for pct, attr in ((50, "latency_p50_ms"), (99, "latency_p99_ms")):
            sec = _median(r.metrics.get(f"val.compute_latency_at{pct}") for r in ok)
            setattr(row, attr, None if sec is None else sec * 1000.0)
        if mode == "train":
            row.loss = _median(r.metrics.get("train.loss") for r in ok)
        _optional(row, ok)
    columns = table_rules.expand_columns(
        rule, [r.metrics for group in ok_by_group.values() for r in group])
    for row in rows.values():
        ok = ok_by_group.get(row.group, [])
        for column in columns:
            value = column.value(r.metrics for r in ok)
            if value is not None:
                row.rule_columns[column.csv] = value
    _scaling(list(rows.values()), rule)
    return list(rows.values())


def _optional(row: GroupRow, ok: Sequence[CellResult]) -> None:
    """The optional columns' values and the throttle count of a group."""
    for col in METRIC_COLUMNS:
        value = col.value(r.metrics for r in ok)
        if value is not None:
            row.extra[col.csv] = value
    flags = [r.metrics[THROTTLED] for r in ok if isinstance(r.metrics.get(THROTTLED), bool)]
    row.throttled = sum(flags) if flags else None


def _baselines(rows: Sequence[GroupRow], key: str, value: str, also: Sequence[str] = ()
               ) -> list[tuple[GroupRow, GroupRow]]:
    """(row, its baseline): the row with ``key = value`` and otherwise equal parameters (those
    in ``also`` may differ too), both with a throughput."""
    skip = {key, *also}

    def others(row: GroupRow) -> str:
        return repr(sorted((k, v) for k, v in row.params.items() if k not in skip))

    base = {others(r): r for r in rows if param_matches(r.params.get(key), value) and r.ips}
    return [(row, base[others(row)]) for row in rows
            if row.ips is not None and others(row) in base]


def _mark_cross_stack(row: GroupRow, ref: GroupRow, what: str) -> None:
    difference = stack_difference(row, ref)
    if difference:
        row.cross_stack[what] = difference


def _scaling(rows: list[GroupRow], rule: TableRule | None = None) -> None:
    """Speedup and efficiency vs the 1-GPU row with otherwise equal parameters, its nodes aside
    (a 16-GPU cell on two nodes is measured against one GPU, as DLPerf's 2n8g); a per-card rule:
    efficiency is the per-card ratio, the seed's scaling %; DLPerf's: speedup rounded to 2."""
    rule = rule or table_rules.table_rule(None)
    if len({r.params.get("gpus") for r in rows}) < 2:
        return
    for row, ref in _baselines(rows, "gpus", "1", also=("nodes",)):
        ratio = _ips_ratio(row, ref)
        speedup = ratio * row.params["gpus"] if rule.per_card else ratio
        if rule.speedup_digits is not None:
            speedup = round(speedup, rule.speedup_digits)
        row.speedup = speedup
        row.efficiency = ratio if rule.per_card else speedup / row.params["gpus"]
        _mark_cross_stack(row, ref, "speedup")


def _ips_ratio(row: GroupRow, ref: GroupRow) -> float:
    """``row``'s images/s over ``ref``'s (:func:`_baselines` pairs only rows that have one)."""
    assert row.ips is not None and ref.ips
    return row.ips / ref.ips


def add_ratios(rows: Sequence[GroupRow], key: str, value: str) -> int:
    """Ratio of each row's images/s to the row with ``key = value`` and otherwise equal params.

    E.g. ``hardware=v100`` gives Bitfusion/native. A pair that ran on different software stacks
    is marked (``row.cross_stack["ratio"]``), unless the baseline is a release
    (``ngc_release=24.05``): then what differs is the point, recorded as the release comparison
    (``row.release_comparison["ratio"]``). Returns how many rows got a ratio.
    """
    pairs = _baselines(rows, key, value)
    for row, ref in pairs:
        row.ratio = _ips_ratio(row, ref)
        if key == RELEASE_PARAM:
            if row is not ref:
                row.release_comparison["ratio"] = stack_difference(row, ref) or (
                    f"NGC {row.params.get(key)} vs {value}")
        else:
            _mark_cross_stack(row, ref, "ratio")
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
    rule = table_rules.table_rule(rows[0].rule if rows else None)
    digits = rule.digits
    infer = any(r.params.get("mode") == "infer" or r.latency_p50_ms is not None
                or r.latency_p99_ms is not None for r in rows)
    scaling = any(r.speedup is not None for r in rows)
    main = rule.header
    headers = [*cols, "ok", main, "min..max"]
    mean = rule.mean_header is not None and any(r.ips_mean is not None for r in rows)
    if mean:
        headers.append(str(rule.mean_header))
    if scaling:
        headers += ["speedup", "scaling %" if rule.scaling == "scaling" else "efficiency"]
    if infer:
        headers += ["p50 ms", "p99 ms"]
    ratios = baseline is not None and any(r.ratio is not None for r in rows)
    if ratios:
        headers.append(f"vs {baseline}")
    shown = _rule_columns(rule, rows)
    headers += [c.header for c in shown]
    optional = [c for c in METRIC_COLUMNS if any(c.csv in r.extra for r in rows)]
    headers += [c.header for c in optional]
    shown_release = release_column(rows, cols)
    if shown_release:
        headers.insert(len(cols), "release")
    table = []
    for r in rows:
        line = [str(r.params.get(c, "")) for c in cols]
        if shown_release:
            line.append("/".join(r.releases) + ("*" if len(r.releases) > 1 else ""))
        mark = (("!" if r.throttled else "") + ("~" if _under_ncu(r) else "")
                + ("?" if r.unstable else ""))
        line += [f"{r.ok}/{r.runs}", _fmt(r.ips, digits) + mark,
                 f"{_fmt(r.ips_min, digits)}..{_fmt(r.ips_max, digits)}" if r.ips is not None
                 else ""]
        if mean:
            line.append(_fmt(r.ips_mean, digits))
        if scaling:
            efficiency = "" if r.efficiency is None else (
                f"{r.efficiency:.1%}" if rule.scaling == "scaling" else f"{r.efficiency:.0%}")
            line += [_fmt(r.speedup, 2) + _cross_note(r, "speedup"), efficiency]
        if infer:
            line += [_fmt(r.latency_p50_ms, 2), _fmt(r.latency_p99_ms, 2)]
        if ratios:
            line.append("" if r.ratio is None else f"{r.ratio:.2f}x" + _cross_note(r, "ratio"))
        line += [_fmt(r.rule_columns.get(c.csv), c.digits) for c in shown]
        line += [_fmt(r.extra.get(c.csv), c.digits) for c in optional]
        table.append(line)
    return headers, table


def _rule_columns(rule: TableRule, rows: Sequence[GroupRow]) -> list[Column]:
    """The rule's columns some row has a value for, in the rule's order."""
    names = {k for r in rows for k in r.rule_columns}
    per_gpu = re.compile(r"^gpu(\d+)_")
    gpus = sorted({int(m[1]) for k in names for m in [per_gpu.match(k)] if m})
    out = []
    for column in rule.columns:
        for shown in ([column.for_gpu(g) for g in gpus] if column.per_gpu else [column]):
            if shown.csv in names:
                out.append(shown)
    return out


def rule_line(rows: Sequence[GroupRow]) -> str:
    """The line above a table made by a rule other than the default: which rule, from where."""
    if not rows or rows[0].rule == table_rules.DEFAULT_RULE:
        return ""
    rule = table_rules.table_rule(rows[0].rule)
    note = rule.unmeasured_note([r.params for r in rows])
    return f"table rule: {rule.name} ({rule.source})" + (f"; {note}" if note else "")


def render_table(
    rows: Sequence[GroupRow], plan_varying: Sequence[str] = (), baseline: str | None = None,
    results: Sequence[CellResult] = (),
) -> str:
    """The human table (tabulate): one row per group; a footnote when a group throttled, and
    one per control of the run (``results``: the run's results, controls included)."""
    if not rows:
        return "(no results)"
    headers, table = table_cells(rows, plan_varying, baseline)
    text = tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)
    rule = rule_line(rows)
    if rule:
        text = f"{rule}\n\n{text}"
    notes = table_notes(rows, mixed_releases="release" in headers)
    notes += control_note(results)
    return "\n\n".join([text, *notes])


def table_notes(rows: Sequence[GroupRow], mixed_releases: bool = False) -> list[str]:
    """The footnotes of the marks :func:`table_cells` puts after images/s (``!`` throttled,
    ``~`` under ncu, ``?`` unstable; ``*`` mixed releases where the release column is shown),
    for the rows that have them (the text and HTML tables share them)."""
    notes = [THROTTLE_NOTE] if any(r.throttled for r in rows) else []
    if any(_under_ncu(r) for r in rows):
        notes.append(NCU_NOTE)
    if any(r.unstable for r in rows):
        notes.append(UNSTABLE_NOTE)
    if mixed_releases and any(len(r.releases) > 1 for r in rows):
        notes.append(MIXED_NOTE)
    return notes


def control_note(results: Sequence[CellResult]) -> list[str]:
    """One line per control of a run: its measurements, median images/s and its drift over
    the run (last / first measurement): the machine's own, which ``history`` and ``compare``
    divide out."""
    by_group: dict[str, list[CellResult]] = {}
    for res in results:
        if res.role == "control":
            by_group.setdefault(res.group, []).append(res)
    out = []
    for group, measured in by_group.items():
        measured.sort(key=lambda r: (r.started_at or 0.0, r.repeat))
        ips = [float(v) for r in measured if r.status is Status.OK
               for v in [r.metrics.get(throughput_key(r.params.get("mode", "train")))]
               if isinstance(v, int | float)]
        failed = sum(1 for r in measured if r.status is not Status.OK)
        text = f"control {group}: {len(measured)} measurements"
        if ips:
            text += f", median {statistics.median(ips):,.1f} images/s"
        if len(ips) >= 2:
            text += f", first -> last {ips[-1] / ips[0] - 1:+.1%} (the machine's drift)"
        if failed:
            text += f", {failed} FAILED"
        out.append(text + "; not a configuration: `orchestrate history` and `compare` judge "
                   "each configuration's figure as a ratio to it")
    return out


#: The footnote of a row whose repeats ran different releases.
MIXED_NOTE = ("* the row's repeats ran different releases (hosts with different drivers, "
              "release = \"auto\"): its median mixes software stacks")


def release_column(rows: Sequence[GroupRow], cols: Sequence[str]) -> bool:
    """Whether the table shows which release each row ran: when rows differ in it (or a row
    mixes several), unless an ``ngc_release`` column already says exactly that."""
    found = [tuple(r.releases) for r in rows if r.releases]
    if not found or (len(set(found)) == 1 and len(found[0]) == 1):
        return False
    if RELEASE_PARAM in cols:
        return any(r.releases and r.releases != [str(r.params.get(RELEASE_PARAM))]
                   for r in rows)
    return True


def _cross_note(row: GroupRow, what: str) -> str:
    release = row.release_comparison.get(what)
    if release:
        return f" (release comparison: {release})"
    note = row.cross_stack.get(what)
    return f" (cross-stack: {note})" if note else ""


def render_csv(rows: Sequence[GroupRow]) -> str:
    out = io.StringIO()
    dicts = [r.csv_row() for r in rows]
    fields: list[str] = []
    for d in dicts:
        fields += [k for k in d if k not in fields]
    writer = RowWriter(out, fields)
    writer.writeheader()
    for d in dicts:
        writer.writerow({k: "" if v is None else v for k, v in d.items()})
    return out.getvalue()


def load_line(load: Any) -> str | None:
    """What run.json's ``load`` says, for people: ``load of the machine the sweep ran on (1, 5,
    15 min averages): 0.12 0.30 0.41 at start, 1.90 1.20 0.85 at end``; None when the run
    recorded none (an older or imported run)."""
    if not isinstance(load, dict):
        return None
    parts = [f"{' '.join(f'{v:.2f}' for v in values)} at {when}" for when in ("start", "end")
             if isinstance(values := load.get(when), list) and values
             and all(isinstance(v, int | float) for v in values)]
    if not parts:
        return None
    return f"load of the machine the sweep ran on (1, 5, 15 min averages): {', '.join(parts)}"


def write_summary(
    paths: RunPaths, baseline: str | None = None, results: list[CellResult] | None = None
) -> tuple[list[GroupRow], str]:
    """Summarize a run folder; write summary.csv and summary.txt; return the table.

    ``baseline`` (``KEY=VALUE``) adds each row's images/s ratio to the matching baseline row.
    ``results``: the run's results when the caller has just read them (else read from disk).
    """
    rows, table = summarize_run(paths, baseline, results)
    write_summary_files(paths, rows, table)
    return rows, table


def summarize_run(
    paths: RunPaths, baseline: str | None = None, results: list[CellResult] | None = None
) -> tuple[list[GroupRow], str]:
    """The rows and the table of a run folder, as :func:`write_summary` makes them, writing
    nothing (a read-only archive can still be reported)."""
    results = paths.results() if results is None else results
    plan = paths.plan_data() or {}  # a damaged plan.json only loses its column order
    rule = plan.get("table_rule")
    try:
        chosen = table_rules.table_rule(rule if isinstance(rule, str) else None)
    except ValueError:  # a plan.json of a newer orchestrate: its rule is not known here
        chosen = table_rules.table_rule(None)
    rows = summarize(results, chosen)
    varying = plan.get("varying")
    plan_varying = [k for k in varying if isinstance(k, str)] if isinstance(varying, list) else []
    baseline = baseline or (plan.get("baseline") if isinstance(plan.get("baseline"), str) else None)
    base = parse_baseline(baseline)
    if base:
        add_ratios(rows, *base)
    table = render_table(rows, plan_varying, baseline=baseline, results=results)
    made_with = options_line(plan)
    return rows, f"{table}\n\n{made_with}" if made_with else table


def options_line(plan: Mapping[str, Any]) -> str:
    """``run with --set K=V --only K=V --exclude K=V``: the options of plan.json that made the
    run's cells from its matrix file (each value shell-quoted, as it would be typed again);
    "" for a run made with none."""
    import shlex

    flags = []
    for key in ("set", "only", "exclude"):
        values = plan.get(key)
        flags += [f"--{key} {shlex.quote(value)}" for value in
                  (values if isinstance(values, list) else []) if isinstance(value, str)]
    return f"run with {' '.join(flags)}" if flags else ""


def write_summary_files(paths: RunPaths, rows: Sequence[GroupRow], table: str) -> None:
    """summary.csv and summary.txt of a run folder (an OSError when they cannot be written)."""
    write_file(paths.summary_csv, render_csv(rows))
    write_file(paths.summary_txt, table + "\n")
