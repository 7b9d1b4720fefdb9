"""History of a matrix across runs: the nightly sweep's trend and a regression check that holds up.

Built from the results store (:mod:`orchestrator.results.folders.store`), so only what is on disk
counts.

* **What is compared with what.** A line is one *configuration* (the content hash of its
  parameters and hardware profile; the display id is only a label) on one *stack* (image,
  torch, CUDA, cuDNN, driver, GPU/CPU model, host, Python; ``ignore_stack`` drops fields, e.g.
  ``host`` for a pool of identical machines). The newest run's ok repeats of the line are
  compared with the same configuration on the same stack in the ``window`` runs before it.
* **Verdicts.** ``regression`` / ``faster`` / ``no significant change``: the test of
  :func:`orchestrator.results.statistics.stats.regression_test` (the newest run's repeats, through
  the exact bootstrap variance of their median, against the run-to-run noise of the earlier runs of
  the whole matrix; p < ``alpha``, Holm-adjusted over the run's configurations, and a change beyond
  ``threshold``).
  ``insufficient history``: fewer than ``min_history`` earlier runs with this configuration and
  stack (nothing is called). ``stack changed``: too few earlier runs on this stack but some on
  another: the difference of stacks is reported, not a regression. ``failed``: the newest run
  has no ok repeat of a configuration it ran (repeats that failed beside ok ones are counted
  too). ``missing``: a configuration of the earlier runs that the newest run planned but has no
  result for (a sweep that died leaves its run unfinished: it is judged all the same).
  ``dropped``: one the newest run's plan no longer has (a stray ``--only`` or ``--exclude``, or
  taken out of the matrix). Missing and dropped lines show their earlier runs' figures too.
* **Failing lines** (``--fail-on-regression``): regression, failed (any failed repeat),
  missing, dropped by the run's ``--only`` or ``--exclude`` (unless ``allow_dropped``: a nightly
  run that left configurations out on purpose; one taken out of the matrix is reported, not
  failed), and any
  absolute reference (:mod:`orchestrator.config.references`) not met. A gate
  cannot go green because configurations were not run.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from orchestrator.config.references import ReferenceCheck, ReferenceEntry, check
from orchestrator.errors import ConfigError
from orchestrator.results.folders.run_folder import RunPaths, no_runs, read_json
from orchestrator.results.folders.store import (
    CellRecord,
    RecordedStack,
    RunRecord,
    Store,
    headline,
    is_throughput,
)
from orchestrator.results.reports.summary import varying_keys
from orchestrator.results.statistics.stats import (
    Check,
    between_run_variance,
    detectable_drop,
    holm,
    loo_deviations,
    median_log_variance,
    regression_test,
    verdict,
)

FAILING = frozenset({"regression", "failed", "missing", "dropped"})


@dataclass(frozen=True)
class Options:
    """How the check is made (defaults: the CLI's)."""

    window: int = 10  # earlier runs considered
    min_history: int = 3  # earlier runs of a configuration needed before anything is called
    threshold: float = 0.05  # smallest relative change worth flagging
    alpha: float = 0.05  # family-wise: chance of any false alarm in a run (Holm over configs)
    ignore_stack: tuple[str, ...] = ()
    metric: str | None = None  # a throughput figure (``*_ips``); None: the headline images/s
    #: Judge the raw figures even where the runs had a control (``--raw``).
    raw: bool = False
    #: A configuration the newest run left out of its plan does not fail the check.
    allow_dropped: bool = False

    def validate(self) -> None:
        """ConfigError listing every bad option."""
        problems = []
        if self.min_history < 2:
            problems.append(("--min-history", "must be at least 2 (the noise of earlier runs "
                             "is estimated from their spread)"))
        if self.window < max(self.min_history, 2):
            problems.append(("--window", f"{self.window} earlier runs cannot reach "
                             f"--min-history {self.min_history}; use at least "
                             f"{max(self.min_history, 2)}"))
        if not 0 <= self.threshold < 1:
            problems.append(("--threshold", "must be from 0% to below 100%"))
        if not 0 < self.alpha < 0.5:
            problems.append(("--alpha", "must be above 0 and below 0.5"))
        if self.metric is not None and not is_throughput(self.metric):
            problems.append(("--metric", f"{self.metric!r}: the check needs a throughput "
                             "figure (higher is better), e.g. train.total_ips or "
                             "train.step_ips_p90"))
        unknown = set(self.ignore_stack) - set(RecordedStack.names())
        if unknown:
            problems.append(("--ignore-stack", f"unknown field(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(RecordedStack.names())}"))
        if problems:
            from orchestrator.errors import Problem

            raise ConfigError([Problem("", f, m) for f, m in problems])


@dataclass
class Line:
    """One configuration on one stack in the newest run."""

    config: str
    label: str
    params: dict[str, Any]
    stack: RecordedStack | None
    newest: list[float] = field(default_factory=list)
    failed_cells: list[CellRecord] = field(default_factory=list)
    medians: dict[int, float] = field(default_factory=dict)  # run pk -> median, same stack
    repeats: dict[int, list[float]] = field(default_factory=dict)  # run pk -> values, same stack
    other_stack: dict[int, float] = field(default_factory=dict)  # run pk -> median, other stack
    used_runs: list[int] = field(default_factory=list)
    stack_change: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    check: Check | None = None
    p_slower: float | None = None  # Holm-adjusted over the run's tested configurations
    p_faster: float | None = None
    #: The smallest drop this line's test catches 95 % of the time (:func:`detectable_drop`).
    detectable: float | None = None
    verdict: str = "insufficient history"
    references: list[ReferenceCheck] = field(default_factory=list)
    #: What the line's figures are: ``raw`` (images/s) or ``normalised`` (ratios to the
    #: control measured beside each cell, :mod:`orchestrator.results.statistics.normalise`).
    basis: str = "raw"
    #: The same configuration on the other basis (the JSON carries both), when there is one.
    other: Line | None = None
    #: A verdict in FAILING that does not fail (a dropped line under ``allow_dropped``, or one
    #: the matrix no longer has).
    excused: bool = False
    #: What left a ``dropped`` line out of the newest run: ``--only K=V --exclude K=V ...`` or
    #: ``the matrix``.
    dropped_by: str = ""

    @property
    def failing(self) -> bool:
        return ((self.verdict in FAILING and not self.excused) or bool(self.failed_cells)
                or any(r.failed for r in self.references))

    def figures_json(self) -> dict[str, Any]:
        """The line's figures on its basis: newest repeats, reference, change, noise."""
        return {
            "newest": self.newest, "reference": self.check.reference if self.check else None,
            "change": self.check.change if self.check else None,
            "p_slower_unadjusted": self.check.p_slower if self.check else None,
            "noise": self.check.noise if self.check else None,
            "earlier_runs_used": len(self.used_runs),
        }

    def to_json(self) -> dict[str, Any]:
        both = {self.basis: self.figures_json()}
        if self.other is not None:
            both[self.other.basis] = self.other.figures_json()
        return {
            "config": self.config, "label": self.label, "params": self.params,
            "stack": None if self.stack is None else self.stack.as_dict(),
            "basis": self.basis,
            "newest": self.newest, "reference": self.check.reference if self.check else None,
            "change": self.check.change if self.check else None,
            "p_slower": self.p_slower, "p_faster": self.p_faster,
            "p_slower_unadjusted": self.check.p_slower if self.check else None,
            "noise": self.check.noise if self.check else None,
            "detectable_drop": self.detectable,
            "earlier_runs_used": len(self.used_runs),
            "figures": both,
            "verdict": self.verdict, "failing": self.failing,
            "dropped_by": self.dropped_by or None,
            "failed_cells": [{"cell_id": c.cell_id, "status": c.status, "reason": c.reason}
                             for c in self.failed_cells],
            "stack_change": {k: list(v) for k, v in self.stack_change.items()},
            "references": [{"metric": r.metric, "value": r.value, "low": r.low,
                            "high": r.high, "verdict": r.verdict} for r in self.references],
        }


@dataclass
class HistoryReport:
    """The newest run of a matrix against its history."""

    matrix: str
    newest: RunRecord
    earlier: list[RunRecord]
    shown: list[RunRecord]
    lines: list[Line]
    options: Options
    noise: Noise | None = None
    references_file: str | None = None
    #: The between-run noise of the normalised figures (None: no control, or ``--raw``).
    norm_noise: Noise | None = None
    #: The control's own trend: the machine's drift (shown, never judged).
    controls: list[ControlLine] = field(default_factory=list)

    @property
    def failing(self) -> list[Line]:
        return [line for line in self.lines if line.failing]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for line in self.lines:
            out[line.verdict] += 1
        return dict(out)

    def to_json(self) -> dict[str, Any]:
        o = self.options
        return {
            "matrix": self.matrix, "newest": self.newest.to_json(),
            "earlier": [r.run_id for r in self.earlier],
            "metric": o.metric or "headline images/s (train.total_ips / val.total_ips)",
            "options": {"window": o.window, "min_history": o.min_history,
                        "threshold": o.threshold, "alpha": o.alpha,
                        "ignore_stack": list(o.ignore_stack),
                        "allow_dropped": o.allow_dropped},
            "method": METHOD,
            "between_run_sd": math.sqrt(self.noise.tau2) if self.noise else None,
            "pooled_deviations": self.noise.pairs if self.noise else 0,
            "between_run_sd_normalised": (math.sqrt(self.norm_noise.tau2)
                                          if self.norm_noise else None),
            "normalisation": NORMALISATION if self.norm_noise else None,
            "controls": [c.to_json() for c in self.controls],
            "references_file": self.references_file,
            "counts": self.counts(), "failing": len(self.failing),
            "lines": [line.to_json() for line in self.lines],
        }


METHOD = ("log(newest median / median of earlier runs' medians), one-sided Student-t test with "
          "variance tau^2 + v_new + v_ref: tau^2 the between-run variance pooled over the "
          "matrix's earlier runs (median Paule-Mandel on leave-one-out deviations), v the exact "
          "bootstrap variance of a run's median over its repeats")

NORMALISATION = ("a line with a control in the newest run and in at least min_history earlier "
                 "runs is judged on each cell's figure / the control's, log-interpolated "
                 "between the control measurements just before and after it on the same host "
                 "and GPUs (the machine factor cancels); other lines on the raw figure")


@dataclass
class ControlLine:
    """One control (per hardware profile) across runs: the machine's own drift."""

    group: str
    config: str
    medians: dict[int, float]  # run pk -> median of its measurements
    newest: list[float]  # the newest run's measurements, in time order
    reference: float | None  # median of the earlier runs' medians
    failed: int = 0  # measurements of the newest run that did not end ok

    @property
    def change(self) -> float | None:
        if self.reference is None or not self.newest:
            return None
        return statistics.median(self.newest) / self.reference - 1.0

    @property
    def within(self) -> float | None:
        """Last / first measurement of the newest run - 1: its drift over the night."""
        return self.newest[-1] / self.newest[0] - 1.0 if len(self.newest) >= 2 else None

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "config": self.config, "newest": self.newest,
                "reference": self.reference, "change": self.change,
                "within_run_change": self.within, "failed": self.failed}


def _control_lines(controls_by_run: dict[int, list[CellRecord]], run: RunRecord,
                   earlier: list[int], shown: list[int]) -> list[ControlLine]:
    """Each control group's measurements in the newest run against its earlier runs."""
    out: dict[str, ControlLine] = {}
    newest = sorted(controls_by_run.get(run.pk, []), key=lambda c: (c.started_at or 0.0,
                                                                    c.repeat or 0))
    for cell in newest:
        line = out.setdefault(cell.group, ControlLine(cell.group, cell.config, {}, [], None))
        if cell.ok and cell.value is not None:
            line.newest.append(cell.value)
        elif not cell.ok:
            line.failed += 1
    for line in out.values():
        for pk in dict.fromkeys([*earlier, *shown]):
            values = [c.value for c in controls_by_run.get(pk, [])
                      if c.config == line.config and c.ok and c.value is not None]
            if values:
                line.medians[pk] = statistics.median(values)
        if line.newest:
            line.medians[run.pk] = statistics.median(line.newest)
        before = [line.medians[pk] for pk in earlier if pk in line.medians]
        line.reference = statistics.median(before) if before else None
    return list(out.values())


#: Smallest run-to-run noise assumed (relative): identical numbers do not make every change
#: significant.
MIN_NOISE = 0.005


@dataclass(frozen=True)
class Noise:
    """The between-run noise of the matrix's earlier runs."""

    tau2: float  # variance of a run's own offset, log scale
    dof: int
    pairs: int  # earlier (configuration, run) deviations it is estimated from


def _stack_key(stack: RecordedStack | None, ignore: Sequence[str]) -> str:
    """A stack's key without the ignored fields. A cell that recorded no stack (an import of a
    log that states none) has every field unrecorded: ``--ignore-stack`` on the fields the
    others state joins it to their history, as it joins any two stacks."""
    return (stack or RecordedStack()).key(ignore)


def analyze(
    store: Store,
    matrix: str,
    options: Options | None = None,
    run: RunRecord | None = None,
    shown: int = 7,
    references: Sequence[ReferenceEntry] = (),
    references_file: str | None = None,
) -> HistoryReport:
    """The newest run of ``matrix`` (or ``run``) against the ``window`` runs before it. The
    newest run is judged even if it has not finished (still going, or its sweep died): its
    configurations without a result are then ``missing``."""
    options = options or Options()
    options.validate()
    with store.snapshot():
        return _analyze(store, matrix, options, run, shown, references, references_file)


def _analyze(store: Store, matrix: str, options: Options, run: RunRecord | None, shown: int,
             references: Sequence[ReferenceEntry], references_file: str | None
             ) -> HistoryReport:
    runs = store.runs(matrix=matrix)
    if not runs:
        raise ConfigError(no_runs(store.root, matrix), field="history")
    if run is None:
        run = runs[-1]  # even unfinished: a sweep that crashed must not pass as yesterday's
    idx = next(i for i, r in enumerate(runs) if r.pk == run.pk)
    earlier = runs[max(0, idx - options.window):idx]
    shown_runs = runs[max(0, idx + 1 - max(1, shown)):idx + 1]
    wanted = {r.pk for r in earlier} | {r.pk for r in shown_runs}
    cells = (store.cells(sorted(wanted - {run.pk}), metric=options.metric)
             + store.cells([run.pk], figures=bool(references), metric=options.metric))
    by_run: dict[int, list[CellRecord]] = defaultdict(list)
    controls_by_run: dict[int, list[CellRecord]] = defaultdict(list)
    for cell in cells:
        (controls_by_run if cell.is_control else by_run)[cell.run_pk].append(cell)
    history_pks = [r.pk for r in runs[:idx] if r.pk in wanted]
    in_window = {r.pk for r in earlier}
    position = {r.pk: i for i, r in enumerate(runs)}
    lines, noise = _judged_lines(run, by_run, history_pks, in_window, position, options, RAW)
    norm_noise = None
    if not options.raw and any(c.norm is not None for c in by_run[run.pk]):
        normalised, norm_noise = _judged_lines(run, by_run, history_pks, in_window, position,
                                               options, NORMALISED)
        lines = _choose(lines, normalised)
    _adjust(lines, options)
    lines += _missing(run, by_run, [r.pk for r in reversed(earlier)], lines, options)
    if references:
        _check_references(lines, by_run[run.pk], references, references_file or "")
    controls = _control_lines(controls_by_run, run, [r.pk for r in earlier],
                              [r.pk for r in shown_runs])
    return HistoryReport(matrix, run, earlier, shown_runs, lines, options, noise,
                         references_file, norm_noise, controls)


#: The two figures a line can be judged on: the raw figure, or its ratio to the control.
RAW = "raw"
NORMALISED = "normalised"


def _value(cell: CellRecord, basis: str) -> float | None:
    return cell.norm if basis == NORMALISED else cell.value


def _judged_lines(run: RunRecord, by_run: dict[int, list[CellRecord]], history_pks: list[int],
                  in_window: set[int], position: dict[int, int], options: Options, basis: str
                  ) -> tuple[list[Line], Noise]:
    """The newest run's lines on one basis (raw or normalised figures), each tested against
    its history with the between-run noise of that basis (not yet Holm-adjusted)."""
    lines = _newest_lines(by_run[run.pk], options, basis)
    _attach_history(lines, history_pks, by_run, options, basis)
    for line in lines:
        line.used_runs = [pk for pk in line.used_runs if pk in in_window]
    pairs = [pair for line in lines if len(line.used_runs) >= 2 for pair in zip(
        loo_deviations([line.medians[pk] for pk in line.used_runs]),
        [median_log_variance(line.repeats[pk]) for pk in line.used_runs], strict=True)]
    tau2 = between_run_variance(pairs, MIN_NOISE)
    noise = Noise(tau2, max(1, len(pairs) - 1), len(pairs))
    for line in lines:
        _judge(line, noise, options, in_window, position)
    return lines, noise


def _choose(raw: list[Line], normalised: list[Line]) -> list[Line]:
    """Per line, the normalised one where it can be tested (the newest run and at least
    ``min_history`` earlier runs have a control), else the raw one; each keeps the other as
    ``other`` (both figures in the JSON)."""
    by_key = {(ln.config, ln.stack.key() if ln.stack else None): ln for ln in normalised}
    out = []
    for line in raw:
        norm = by_key.get((line.config, line.stack.key() if line.stack else None))
        if norm is not None and norm.check is not None:
            norm.other = line
            out.append(norm)
        else:
            line.other = norm
            out.append(line)
    return out


def _newest_lines(cells: list[CellRecord], options: Options, basis: str = RAW) -> list[Line]:
    lines: dict[tuple[str, str | None], Line] = {}
    failed: dict[str, list[CellRecord]] = defaultdict(list)
    for cell in cells:
        if not cell.ok:
            failed[cell.config].append(cell)
            continue
        value = _value(cell, basis)
        if value is None:
            continue  # ok, but without this figure (e.g. an old result, no control)
        key = (cell.config, _stack_key(cell.stack, options.ignore_stack))
        line = lines.setdefault(key, Line(cell.config, cell.group, cell.params, cell.stack,
                                          basis=basis))
        line.newest.append(value)
    out = list(lines.values())
    for config, bad in failed.items():
        found = next((ln for ln in out if ln.config == config), None)
        if found is None:
            found = Line(config, bad[0].group, bad[0].params, None, verdict="failed",
                         basis=basis)
            out.append(found)
        found.failed_cells.extend(bad)
    return out


def _attach_history(lines: list[Line], run_pks: list[int],
                    by_run: dict[int, list[CellRecord]], options: Options, basis: str = RAW
                    ) -> None:
    """Each line's median in each earlier run: same stack (used) or another (shown only)."""
    for pk in run_pks:
        values: dict[tuple[str, str | None], list[float]] = defaultdict(list)
        stacks: dict[tuple[str, str | None], RecordedStack | None] = {}
        for cell in by_run.get(pk, []):
            value = _value(cell, basis)
            if cell.ok and value is not None:
                key = (cell.config, _stack_key(cell.stack, options.ignore_stack))
                values[key].append(value)
                stacks[key] = cell.stack
        for line in lines:
            if not line.newest:
                continue
            own = (line.config, _stack_key(line.stack, options.ignore_stack))
            if own in values:
                line.medians[pk] = statistics.median(values[own])
                line.repeats[pk] = values[own]
                line.used_runs.append(pk)
                continue
            others = [k for k in values if k[0] == line.config]
            if others:
                line.other_stack[pk] = statistics.median(values[others[0]])
                theirs = stacks[others[0]] or RecordedStack()
                line.stack_change = theirs.differences(line.stack or RecordedStack(),
                                                       options.ignore_stack)


def _judge(line: Line, noise: Noise, options: Options, in_window: set[int],
           position: dict[int, int]) -> None:
    if not line.newest:
        line.verdict = "failed"
        return
    other = [position[pk] for pk in line.other_stack if pk in in_window]
    used = [position[pk] for pk in line.used_runs]
    if len(line.used_runs) >= options.min_history:
        earlier = [line.repeats[pk] for pk in line.used_runs]
        line.check = regression_test(line.newest, earlier, noise.tau2, noise.dof,
                                     options.threshold, options.alpha)
        line.verdict = line.check.verdict
    elif other and (not used or max(other) > max(used)):
        line.verdict = "stack changed"
    else:
        line.verdict = "insufficient history"


def _adjust(lines: list[Line], options: Options) -> None:
    """Holm-adjusted p-values over the tested lines; verdicts from them."""
    tested = [(ln, ln.check) for ln in lines if ln.check is not None]
    slower = holm([test.p_slower for _, test in tested])
    faster = holm([test.p_faster for _, test in tested])
    for (ln, test), ps, pf in zip(tested, slower, faster, strict=True):
        ln.p_slower, ln.p_faster = ps, pf
        ln.detectable = detectable_drop(test, options.alpha / len(tested), options.threshold)
        ln.verdict = verdict(test.change, ps, pf, options.alpha, options.threshold)


def _missing(run: RunRecord, by_run: dict[int, list[CellRecord]], earlier_newest_first: list[int],
             lines: list[Line], options: Options) -> list[Line]:
    """Configurations of the earlier runs with no result in the newest run (``missing``: it
    planned them; ``dropped``: it did not), each with its figures in the earlier runs (on its
    newest stack; another stack's marked as such). A configuration the run's ``--only`` or
    ``--exclude`` left out fails unless ``allow_dropped``; one the matrix no longer has is
    reported, not failed (the matrix was edited: a new content hash starts its own history)."""
    present = {line.config for line in lines}
    planned, only = _plan_of(run)
    out: dict[str, Line] = {}
    for pk in earlier_newest_first:
        for cell in by_run.get(pk, []):
            if cell.config in present or cell.config in out:
                continue
            dropped = planned is not None and cell.config not in planned
            by = (" ".join(only) if only else "the matrix") if dropped else ""
            out[cell.config] = Line(
                cell.config, cell.group, cell.params, cell.stack,
                verdict="dropped" if dropped else "missing", dropped_by=by,
                excused=dropped and (options.allow_dropped or not only))
    for line in out.values():
        _earlier_figures(line, by_run, options)
    return list(out.values())


def _earlier_figures(line: Line, by_run: dict[int, list[CellRecord]], options: Options) -> None:
    """A line without a newest figure: its median in every earlier run at hand (the window and
    the runs shown), on its stack, else on another (``other_stack``)."""
    own = _stack_key(line.stack, options.ignore_stack)
    for pk, cells in by_run.items():
        values = [c.value for c in cells if c.config == line.config and c.ok
                  and c.value is not None]
        same = [c.value for c in cells if c.config == line.config and c.ok
                and c.value is not None and _stack_key(c.stack, options.ignore_stack) == own]
        if same:
            line.medians[pk] = statistics.median(v for v in same if v is not None)
            line.repeats[pk] = [v for v in same if v is not None]
        elif values:
            line.other_stack[pk] = statistics.median(v for v in values if v is not None)


#: The options that select a run's cells from its matrix (a configuration they leave out is
#: ``dropped`` by them, not by the matrix).
SELECTING = ("--only", "--exclude")


def _plan_of(run: RunRecord) -> tuple[set[str] | None, tuple[str, ...]]:
    """Content hashes the run's plan lists (None: the plan lists none, e.g. a hand-made run)
    and the selection it was made with, as options (``--only K=V``, ``--exclude K=V``:
    plan.json's ``only`` and ``exclude``; a run written before those fields: the ``--only``
    arguments of run.json's argv)."""
    try:
        plan = read_json(RunPaths(Path(run.path)).plan)
    except ConfigError:
        return None, ()
    if not isinstance(plan, dict):
        return None, ()
    cells = plan.get("cells")
    hashes = {c["hash"] for c in (cells if isinstance(cells, list) else [])
              if isinstance(c, dict) and isinstance(c.get("hash"), str)}
    only, exclude = plan.get("only"), plan.get("exclude")
    if isinstance(only, list) or isinstance(exclude, list):
        return hashes or None, tuple(
            f"{option} {value}" for option, values in (("--only", only), ("--exclude", exclude))
            if isinstance(values, list) for value in values)
    return hashes or None, tuple(f"--only {value}" for value in _only_in_argv(run))


def _only_in_argv(run: RunRecord) -> tuple[str, ...]:
    """The ``--only`` filters of the command line in run.json (``--only K=V``, ``--only=K=V``,
    an abbreviation argparse took: ``--on K=V``)."""
    try:
        meta = read_json(RunPaths(Path(run.path)).run_meta)
    except ConfigError:
        return ()
    argv = meta.get("argv") if isinstance(meta, dict) else None
    if not isinstance(argv, list):
        return ()
    out: list[str] = []
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or not arg.startswith("--o"):
            continue
        name, eq, value = arg.partition("=")
        if len(name) < 4 or not "--only".startswith(name):
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(argv) and isinstance(argv[i + 1], str):
            out.append(argv[i + 1])
    return tuple(out)


def _dropped_note(line: Line, run_id: str) -> str:
    """Why a dropped line is not in the newest run, and whether it fails the check."""
    if line.dropped_by == "the matrix":
        return (f"{line.label}: no longer in the matrix of {run_id} (taken out or its "
                "parameters changed): reported, not failed")
    return (f"{line.label}: left out of {run_id} by {line.dropped_by}: "
            + ("allowed (--allow-dropped)" if line.excused else
               "fails --fail-on-regression unless --allow-dropped"))


def _p_text(line: Line) -> str:
    """The smaller of a tested line's adjusted p-values ('' for an untested line)."""
    ps = [p for p in (line.p_slower, line.p_faster) if p is not None]
    return f"{min(ps):.3f}" if line.check is not None and ps else ""


def _check_references(lines: list[Line], cells: list[CellRecord],
                      references: Sequence[ReferenceEntry], file: str) -> None:
    by_config: dict[str, list[CellRecord]] = defaultdict(list)
    for cell in cells:
        if cell.ok:
            by_config[cell.config].append(cell)
    seen: set[str] = set()
    for line in lines:
        if line.config in seen or line.verdict == "dropped":
            continue
        seen.add(line.config)
        ok = by_config.get(line.config, [])
        figures: dict[str, list[float]] = defaultdict(list)
        for cell in ok:
            for name, value in cell.figures.items():
                figures[name].append(value)
        values = {name: statistics.median(v) for name, v in figures.items()}
        name, _ = headline(line.params, {})
        line.references = check(references, line.params, name, values, file)


# --- rendering -------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def run_headers(run_ids: Sequence[str]) -> list[str]:
    """The column header of each run: its date and time (``20261127-154102``), or its whole id
    where another run shown has the same date and time (two runs, or imports, of one second)."""
    short = [run_id[:15] for run_id in run_ids]
    return [s if short.count(s) == 1 else run_id for s, run_id in zip(short, run_ids,
                                                                      strict=True)]


def _verdict_text(line: Line) -> str:
    text = line.verdict.upper() if line.verdict in FAILING and not line.excused else (
        line.verdict)
    if line.verdict == "dropped":
        options = dict.fromkeys(w for w in line.dropped_by.split() if w in SELECTING)
        text += f" ({'/'.join(options)})" if options else " (not in the matrix)"
    if line.failed_cells and line.verdict != "failed":
        text += f"; {len(line.failed_cells)} repeat(s) FAILED"
    if line.verdict == "insufficient history":
        text += f" ({len(line.used_runs)} run(s))"
    bad = [r for r in line.references if r.failed]
    if bad:
        text += "; REFERENCE " + ", ".join(r.verdict for r in bad)
    return text


def _fmt_on(value: float | None, basis: str) -> str:
    """A figure of a line: images/s, or a ratio to the control (3 decimals)."""
    if value is None:
        return ""
    return f"{value:.3f}" if basis == NORMALISED else f"{value:,.1f}"


def render_history(report: HistoryReport) -> str:
    """The table: parameters, the shown runs' medians, reference, change, noise, verdict;
    then the control's own trend (the machine's drift), then notes on stack changes,
    failures and references."""
    if not report.lines:
        return f"(no cells in run {report.newest.run_id})"
    keys = varying_keys([ln.params for ln in report.lines], always=("hardware",))
    normalised = any(ln.basis == NORMALISED for ln in report.lines)
    headers = [*keys, *run_headers([r.run_id for r in report.shown]), "reference", "change",
               *(["raw change", "basis"] if normalised else []),
               "noise ±", "detects", "p", "verdict"]
    rows = []
    for ln in report.lines:
        row = [ln.params.get(k, "") for k in keys]
        for r in report.shown:
            if r.pk == report.newest.pk:
                row.append(_fmt_on(statistics.median(ln.newest), ln.basis) if ln.newest
                           else "")
            elif r.pk in ln.medians:
                row.append(_fmt_on(ln.medians[r.pk], ln.basis))
            elif r.pk in ln.other_stack:
                row.append(_fmt_on(ln.other_stack[r.pk], ln.basis) + "*")
            else:
                row.append("")
        c = ln.check
        row += [_fmt_on(c.reference, ln.basis) if c else "", f"{c.change:+.1%}" if c else ""]
        if normalised:
            raw = ln if ln.basis == RAW else ln.other
            raw_check = raw.check if raw is not None else None
            row += [f"{raw_check.change:+.1%}" if raw_check else "",
                    "÷control" if ln.basis == NORMALISED else "raw"]
        row += [f"{c.noise:.1%}" if c else "",
                f"-{ln.detectable:.1%}" if ln.detectable is not None else "",
                _p_text(ln), _verdict_text(ln)]
        rows.append(row)
    out = [tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)]
    if report.controls:
        out.append(render_controls(report))
    notes = _notes(report)
    if notes:
        out.append("\n".join(notes))
    return "\n\n".join(out)


def render_controls(report: HistoryReport) -> str:
    """The control's own figures across the shown runs: the machine's drift, not judged."""
    headers = ["control", *run_headers([r.run_id for r in report.shown]), "reference", "change",
               "first -> last (newest run)", "measurements"]
    rows = []
    for c in report.controls:
        row: list[str] = [c.group]
        row += [_fmt(c.medians.get(r.pk)) for r in report.shown]
        row += [_fmt(c.reference), f"{c.change:+.1%}" if c.change is not None else "",
                f"{c.within:+.1%}" if c.within is not None else "",
                f"{len(c.newest)}" + (f" ({c.failed} FAILED)" if c.failed else "")]
        rows.append(row)
    return ("control: the machine's own drift (images/s of the pinned control; shown, not "
            "judged)\n" + tabulate(rows, headers=headers, tablefmt="github",
                                     disable_numparse=True))


def _notes(report: HistoryReport) -> list[str]:
    notes = []
    if report.newest.status == "running":
        notes.append(f"run {report.newest.run_id} is still running ({report.newest.live}): "
                     "configurations without a result yet count as missing")
    elif report.newest.status == "unfinished":
        notes.append(f"run {report.newest.run_id} has not finished (its sweep died or was "
                     "killed): configurations without a result count as missing")
    if any(ln.other_stack for ln in report.lines):
        notes.append("* measured on another stack: not part of the reference")
    for ln in report.lines:
        if ln.verdict == "stack changed" and ln.stack_change:
            diff = ", ".join(f"{k} {a or '(not recorded)'} -> {b or '(not recorded)'}"
                             for k, (a, b) in ln.stack_change.items())
            notes.append(f"{ln.label}: stack changed ({diff}); history restarts on the new "
                         "stack")
        for cell in ln.failed_cells:
            notes.append(f"{cell.cell_id}: {cell.status}: {cell.reason}")
        if ln.verdict == "missing":
            notes.append(f"{ln.label}: planned but no result in {report.newest.run_id}")
        if ln.verdict == "dropped":
            notes.append(_dropped_note(ln, report.newest.run_id))
        for ref in ln.references:
            if ref.failed:
                notes.append(f"{ln.label}: reference {ref.describe()}")
    o = report.options
    notes.append(
        f"newest {report.newest.run_id} vs up to {o.window} earlier run(s) "
        f"({len(report.earlier)} found); at least {o.min_history} needed; flagged: p < "
        f"{o.alpha:g} (Holm-adjusted over the run's configurations) and a change beyond "
        f"{o.threshold:.1%}"
        + (f"; stack fields ignored: {', '.join(o.ignore_stack)}" if o.ignore_stack else ""))
    if any(ln.detectable is not None for ln in report.lines):
        notes.append("detects: the smallest drop flagged 95 % of the time at this run-to-run "
                     "noise; a regression smaller than that can pass as noise (a quieter or "
                     "dedicated machine, or a [control], lowers it)")
    if any(ln.basis == NORMALISED for ln in report.lines):
        notes.append("÷control: judged on each cell's figure / the control measured just "
                     "before and after it on the same host and GPUs (the machine's drift "
                     "cancels); raw change: the same on images/s. --raw judges images/s")
    elif report.controls and not report.options.raw:
        notes.append(f"control: judged on images/s until at least {o.min_history} earlier "
                     "runs have a control too")
    if report.references_file:
        checked = sum(len(ln.references) for ln in report.lines)
        notes.append(f"references: {report.references_file} ({checked} check(s))")
    return notes
