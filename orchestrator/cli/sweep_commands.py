"""``orchestrate matrix | plan | validate | schema`` (runs, report, compare, history and export
are :mod:`orchestrator.cli.result_commands`).

A sweep's progress goes to stderr: a progress bar in a terminal (:class:`RichEvents`), else
(cron, CI, a pipe) one timestamped line when each cell starts and one when it ends, with
``n/N``, the running counts and the ETA (:class:`LineEvents`). ``-q`` shows neither (errors,
the final table, and one line when a cell begins to wait for another sweep's GPUs or CPU:
:class:`QuietEvents`); ``-v`` adds every line the cells print. A lock wait is shown as it
begins (what, who holds it, since when) and when it ends. The results folder and the
hosts inventory default from the environment and the user's config file
(:mod:`orchestrator.config.defaults`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.cli import app, options
from orchestrator.config.defaults import RESULTS_HELP, results_root
from orchestrator.errors import ConfigError
from orchestrator.plan.eta import Eta, format_duration
from orchestrator.plan.matrix import Cell, Matrix, filter_cells, load_matrix
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    parse_metric_lines,
)

if TYPE_CHECKING:
    from rich.progress import TaskID

    from orchestrator.backends import BackendRecord
    from orchestrator.backends.checks import Decision
    from orchestrator.images.pulls import PullProgress
    from orchestrator.plan.placement import Allocation
    from orchestrator.plan.selection import HostDriver
    from orchestrator.sweep import StopFlag, SweepOutcome

log = logging.getLogger(__name__)



def _seconds(text: str) -> float:
    """``--lock-timeout S``: a finite number of seconds, 0 or more (``nan`` would wait forever,
    a negative number give up at once)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more seconds (leave it out to "
                                         "wait as long as it takes)")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "matrix", help="run a sweep: every cell of a matrix file",
        description="Expand MATRIX.toml into cells and run each one; results land in "
        "RESULTS/<matrix>/<run id>/.",
    )
    options.matrix_file(p)
    options.backend(p)
    options.results(p)
    options.only(p, "run " + options.ONLY_HELP)
    options.exclude(p)
    options.set_fields(p)
    options.hosts(p)
    p.add_argument("--resume", nargs="?", const="", metavar="RUN_ID",
                   help="re-run, in an earlier run's folder (default: the newest), only the "
                   "cells that did not end ok")
    options.dry_run(p, "print the plan, every cell's launch and what the target lacks; run "
                    "nothing (exit 0: the sweep would start here, 3: it would not)")
    options.target(p, options.TARGET_HELP + " (with --dry-run)")
    p.add_argument("--order-seed", type=_order_seed, metavar="N",
                   help="seed of the cells' random order within each round of repeats "
                   "(default: a fresh one, recorded in plan.json and run.json; give a run's "
                   "seed to run its order again)")
    p.add_argument("--lock-timeout", type=_seconds, metavar="S",
                   help="a cell whose GPUs another sweep holds waits at most S seconds, then "
                   "fails (default: it waits as long as it takes)")
    p.add_argument("--no-wait", dest="lock_timeout", action="store_const", const=0.0,
                   help="never wait for GPUs another sweep holds (--lock-timeout 0)")
    options.no_publish(p, "this sweep")
    p.add_argument("-q", "--quiet", dest="matrix_quiet", action="count",
                   default=argparse.SUPPRESS, help="no progress, only errors, the table "
                   "and a line when a cell waits for another sweep's locks")
    p.add_argument("-v", "--verbose", dest="matrix_verbose", action="count",
                   default=argparse.SUPPRESS, help="also every line the cells print")
    p.set_defaults(handler=cmd_matrix)

    p = sub.add_parser(
        "plan", help="print the expanded cells of a matrix",
        description="Print the cells MATRIX.toml expands to (id, varying parameters, repeat, "
        "content hash), after the same checks as `validate`, then what the target lacks "
        "(GPUs, engine, programs, checkouts, images, data, inventory); builds and runs nothing. "
        "Exit 0: the sweep would start here; 3: it would not (the plan is still printed); 2: "
        "the file is invalid.")
    options.matrix_file(p)
    options.only(p)
    options.exclude(p)
    options.set_fields(p)
    options.json(p, "a JSON list, one object per cell (the requirements go to stderr)")
    options.backend(p, "plan for this backend: ")
    options.hosts(p)
    options.target(p)
    options.results(p, "where the run would go, for --json's cell folders; " + RESULTS_HELP)
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser(
        "validate", help="check a matrix file; exit 2 listing every problem (3: what the "
        "target lacks)",
        description="Check MATRIX.toml: its structure and types, then whether every cell can "
        "run where it is planned (model, torch features, precision and profiler on the "
        "hardware, image kind for the backend, the baseline), then what the target lacks. "
        "Prints each profile's software stack, warnings and what could not be checked. Exit 2: "
        "the file is invalid; 3: it is valid and the target lacks what the cells need.",
    )
    options.matrix_file(p)
    options.backend(p, "check for this backend: ")
    options.hosts(p)
    options.target(p)
    options.set_fields(p)
    options.only(p, "what the target lacks, for matching cells only (the file is checked "
                 "whole; as the sweep with --only): " + options.ONLY_HELP)
    options.exclude(p)
    p.add_argument("--strict", action="store_true",
                   help="warnings are problems too (exit 2)")
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser(
        "schema", help="print the JSON Schema of matrix files (for editors)",
        description="Print the JSON Schema of matrix files: every key, its type, range and "
        "description. Point an editor's TOML language server at it (e.g. taplo's "
        "`#:schema` comment) to get completion and checks while writing a matrix.")
    p.set_defaults(handler=cmd_schema)


def _order_seed(text: str) -> int:
    """``--order-seed``: an integer 0..2^32-1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"{value} is out of range 0..{2**32 - 1}")
    return value


# --- plan / validate / schema ----------------------------------------------------------------


def _decide(args: argparse.Namespace, *, strict: bool = False, refuse: bool = True,
            select: bool = False) -> tuple[Matrix, Decision]:
    """The matrix file, validated, and the one decision a sweep of it takes before its run
    folder exists (:func:`orchestrator.backends.checks.preflight`: a ConfigError with every
    problem; the baseline included), for the backend the command names (``--backend``, else
    the matrix's), the hosts inventory it reads (``--hosts`` first) and the target
    (``--target``, else this machine). ``refuse``: what the target lacks is refused too
    (exit 3); else (``plan``, ``--dry-run``) it is in the decision, for the command to show
    after the plan. ``select``: the matrix returned is the cells ``--only`` keeps and
    ``--exclude`` leaves, and what the target lacks is decided for those cells alone (the file
    is still checked whole). The command acts on the decision; nothing decides again."""
    from orchestrator.backends import backend_record
    from orchestrator.backends.checks import preflight
    from orchestrator.backends.target import HERE, parse_target, refusal

    backend = getattr(args, "backend", None)
    if backend is not None:  # named before the matrix file is read
        backend_record(backend)
    spec = getattr(args, "target", None)
    target = parse_target(spec) if spec is not None else HERE
    matrix = _load_matrix(args.matrix_file, getattr(args, "overrides", []))
    chosen = (filter_cells(matrix, getattr(args, "only", []), getattr(args, "exclude", []))
              if select else matrix)
    try:
        decision = preflight(matrix, backend, hosts_file=getattr(args, "hosts", None),
                             comparisons=True, strict=strict, target=target, refuse=refuse,
                             selected={c.id for c in chosen.cells} if select else None)
    except ConfigError as exc:  # each problem a --set may have caused says so (exit 3 kept)
        raise refusal(matrix.attributed(exc.problems)) from None
    return chosen, decision


def _load(args: argparse.Namespace, *, refuse: bool = True) -> tuple[Matrix, Decision]:
    """:func:`_decide`, its warnings and notes logged (but the requirements a plan shows),
    then the cells ``--only`` keeps and ``--exclude`` leaves."""
    from orchestrator.errors import Requirement

    matrix, decision = _decide(args, refuse=refuse, select=True)
    for problem in matrix.attributed(decision.findings.warnings):
        if refuse or not isinstance(problem, Requirement):
            log.warning("%s", problem)
    for problem in decision.findings.notes:
        if refuse or not isinstance(problem, Requirement):
            log.info("not checked: %s", problem)
    # What exists now (modules, the matrix and its cells, the decision) lives as long as the
    # command: out of the collector's scans, which a plan's many short-lived objects set off
    # (0.05-0.1 s of a 10,000-cell plan)
    gc.freeze()
    return matrix, decision


def requirement_lines(matrix: Matrix, decision: Decision, stream: TextIO | None = None
                      ) -> list[str]:
    """What the target needs (:func:`orchestrator.backends.target.lines`), after a plan; each
    requirement a ``--set`` may have caused says so. Wrapped to the terminal's width where
    ``stream`` (default stdout) is one; a pipe gets one line per requirement."""
    from orchestrator.backends.target import lines
    from orchestrator.errors import Requirement

    stream = stream or sys.stdout
    width = shutil.get_terminal_size().columns - 1 if stream.isatty() else None
    found = [r for r in matrix.attributed(decision.requirements) if isinstance(r, Requirement)]
    return lines(found, decision.target, decision.where, width)


def plan_exit(decision: Decision) -> int:
    """``plan`` and ``--dry-run``: 0 when the sweep would start on the target, else 3 (the
    code of the sweep's own refusal: :class:`~orchestrator.errors.RequirementsUnmet`)."""
    from orchestrator.errors import RequirementsUnmet

    return 0 if decision.starts else RequirementsUnmet.exit_code


def _load_matrix(path: Path, overrides: list[str]) -> Matrix:
    """The matrix file, validated with ``--set``'s overrides; ``[matrix] backend`` must name a
    backend of this build."""
    from orchestrator.backends import backend_names

    return load_matrix(path, backends=backend_names(), overrides=overrides)


def plan_lines(matrix: Matrix, backend: str | None = None) -> list[str]:
    """The plan's header and table (``backend``: the one the sweep would use, else the
    matrix's own)."""
    from orchestrator.results.reports.summary import column_order

    shown = column_order(["hardware", *[k for k in matrix.varying if k != "hardware"]])
    rows = [[c.id, *[getattr(c.params, k) for k in shown], c.repeat, c.hash]
            for c in matrix.cells]
    table = text_table(["cell", *shown, "repeat", "hash"], rows)
    head = f"{matrix.name}: {cell_count(matrix)}, backend {backend or matrix.settings.backend}"
    made = ([f"with {' '.join(shell_words(matrix.command_line))}"]  # the options that made
            if matrix.command_line else [])                         # the cells from the file
    return [head, *made, table, *control_lines(matrix)]


def shell_words(flags: tuple[str, ...]) -> list[str]:
    """``--set KEY=VALUE`` flags with each value quoted as a shell needs it."""
    import shlex

    return [f"{flag} {shlex.quote(value)}" for flag, _, value in
            (text.partition(" ") for text in flags)]


def text_table(headers: list[str], rows: list[list[Any]]) -> str:
    """``tabulate(rows, headers, tablefmt="simple", disable_numparse=True)``, made ten times
    faster for the thousands of rows of a plan: each value as ``str`` writes it (None: empty),
    left-aligned; each column as wide as its longest value, or its header and two; lines
    without trailing blanks. Where a value is not printable ASCII (several lines, an escape
    sequence, characters wider or narrower than one column), tabulate lays the table out."""
    text = [["" if v is None else str(v) for v in row] for row in rows]
    every = "".join(s for line in [headers, *text] for s in line)
    if not (every.isascii() and every.isprintable()):
        from tabulate import tabulate

        return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    widths = [max([len(h) + 2, *map(len, column)]) for h, column in
              zip(headers, zip(*text, strict=True) if text else [()] * len(headers), strict=True)]
    return "\n".join("  ".join(s.ljust(w) for s, w in zip(line, widths, strict=True)).rstrip()
                     for line in [headers, ["-" * w for w in widths], *text])


def cell_count(matrix: Matrix) -> str:
    """``12 cells (4 configurations x 3 repeats)`` of the cells planned (after ``--only``:
    ``--only repeat=1`` plans 1 repeat of each), in words that agree with the numbers; a
    selection that keeps different repeats of different configurations says so."""
    from orchestrator.config.syntax import plural

    configs = len({c.group for c in matrix.cells})
    repeats = {c.repeat for c in matrix.cells}
    per_config = len(matrix.cells) / configs if configs else 0
    if per_config == len(repeats):
        how = f"{plural(configs, 'configuration')} x {plural(len(repeats), 'repeat')}"
    else:
        how = f"{plural(configs, 'configuration')}, repeats {min(repeats)}..{max(repeats)}"
    return f"{plural(len(matrix.cells), 'cell')} ({how})"


def control_lines(matrix: Matrix) -> list[str]:
    """What the plan says of the matrix's ``[control]``: each template, where and how often it
    runs (nothing when there is none)."""
    from orchestrator.config.matrix_file import CellParams
    from orchestrator.sweep import CONTROL_RULE

    if not matrix.controls:
        return []
    defaults = {k: f.default for k, f in CellParams.model_fields.items()}
    lines = [f"control ({CONTROL_RULE.format(every=matrix.control_every)}; recorded as "
             "role 'control', never a configuration):"]
    for template in matrix.controls.values():
        params = template.params.model_dump()
        shown = ", ".join(f"{k}={v}" for k, v in params.items()
                          if k in ("arch", "batch_size", "image_size", "mode", "gpus",
                                   "precision", "iterations") or (
                              k != "hardware" and v != defaults.get(k)))
        lines.append(f"  {template.group}: program {matrix.program(template).name}, "
                     f"{shown}; hash {template.hash}")
    return lines


def cmd_plan(args: argparse.Namespace) -> int:
    matrix, decision = _load(args, refuse=False)
    if args.json:  # each cell with the launch a sweep would give it (matrix --dry-run's)
        from orchestrator.backends.dry_run import dry_backend, launches_on

        cells = matrix.checked_cells
        runner = dry_backend(matrix, decision.backend, results_root(args.results),
                             decision.hosts_file, decision.target)
        write_json_array(sys.stdout, ({**c.to_json(), "launch": launch} for c, launch
                                      in zip(cells, launches_on(runner, cells), strict=True)))
        sys.stdout.flush()  # the plan first, then (stderr) what the target lacks
        print("\n".join(requirement_lines(matrix, decision, sys.stderr)), file=sys.stderr)
    else:
        print("\n".join([*plan_lines(matrix, decision.backend), "",
                         *requirement_lines(matrix, decision)]))
    return plan_exit(decision)


def write_json_array(out: TextIO, items: Iterable[Any]) -> None:
    """``items`` as one JSON array, one item a line, each written as it is made (a plan of
    10,000 cells never waits whole in memory; compact items are what the C encoder writes)."""
    sep, chunk = "[\n  ", list[str]()
    for item in items:
        chunk += (sep, json.dumps(item))
        sep = ",\n  "
        if len(chunk) >= 2 * WRITE_ITEMS:
            out.write("".join(chunk))
            chunk.clear()
    out.write("".join(chunk) + ("[]\n" if sep == "[\n  " else "\n]\n"))


#: Items of a JSON array written at once (a few hundred KiB of a plan: a write each, not two
#: a cell).
WRITE_ITEMS = 128


def cmd_validate(args: argparse.Namespace) -> int:
    matrix, decision = _decide(args, strict=args.strict, select=True)
    findings, backend = decision.findings, decision.backend
    given = "".join(f" {option}" for option in matrix.command_line)
    print(f"{args.matrix_file}{given}: ok ({_cells(len(matrix.cells))})")
    pinned = {hw for hw, _ in findings.release_stacks}
    for hw, stack in findings.stacks.items():
        if hw in pinned and all(c.params.ngc_release for c in matrix.cells if c.hardware == hw):
            continue  # every cell pins its release: the lines below say which
        print(f"  hardware {hw} ({backend} backend): {stack.label}")
        if hw in findings.gpus:
            print(f"    on {findings.gpus[hw]}")
    for (hw, release), stack in findings.release_stacks.items():
        print(f"  hardware {hw}, ngc_release {release} ({backend} backend): {stack.label}")
    for problem in matrix.attributed(findings.warnings):
        print(f"  warning: {problem}")
    for problem in findings.notes:
        print(f"  note: {problem}")
    if decision.target.declared:  # what the declared target must have, and what it does not
        print("\n".join(f"  {line}" for line in requirement_lines(matrix, decision)))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.config.matrix_file import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


# --- matrix (the sweep) ----------------------------------------------------------------------


class SweepClock:
    """What the progress displays share to show an ETA: when each running cell started, and how
    many cells have run at once at most (the ETA's concurrency)."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def started(self, eta: Eta | None, cell_id: str, running: int) -> None:
        self.since[cell_id] = time.monotonic()
        if eta is not None:
            eta.concurrency = max(eta.concurrency, float(running))
            eta.started(cell_id)

    def restart(self, cell_id: str) -> None:
        """A running cell's time starts again (it waited for another sweep's locks: the wait
        is not its time)."""
        if cell_id in self.since:
            self.since[cell_id] = time.monotonic()

    def finished(self, eta: Eta | None, cell_id: str, duration_s: float | None) -> None:
        self.since.pop(cell_id, None)
        if eta is not None:
            eta.finished(cell_id, duration_s)

    def eta_text(self, eta: Eta | None) -> str:
        if eta is None:
            return format_duration(None)
        now = time.monotonic()
        return format_duration(eta.remaining_s({c: now - t for c, t in self.since.items()}))


def escape(text: str) -> str:
    """``text`` shown as it is by rich (its ``[`` are not markup); rich is imported lazily."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class RichEvents:
    """Progress on the terminal: a bar over the cells, the running cell and its last metric.

    Text from outside (paths, cell ids, reasons such as ``[Errno 28] No space left``, what a
    cell prints) is escaped before it meets rich's markup: it is shown as it is, and a ``[/x]``
    in it cannot stop the sweep with a markup error."""

    def __init__(self, verbose: bool = False) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
            console=self.console, transient=True,
        )
        self.task: TaskID | None = None
        from orchestrator.cli.pull_bars import PullBars

        self.pulls = PullBars(self.console)
        self.verbose = verbose
        self.running: dict[str, str] = {}
        self.eta: Eta | None = None
        self.clock = SweepClock()
        self._lock = threading.Lock()

    def __enter__(self) -> RichEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.stop()

    @property
    def _task(self) -> TaskID:
        """The progress bar's task (sweep_started comes before any cell)."""
        assert self.task is not None
        return self.task

    def _status(self) -> str:
        left = self.clock.eta_text(self.eta)
        if len(self.running) == 1:
            return escape(f"{next(iter(self.running.values()))} | ETA {left}")
        text = " | ".join(f"{cid}: {last}" for cid, last in self.running.items())[:110]
        return escape(f"{text} | ETA {left}")

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: Mapping[str, float]) -> None:
        self.console.print(f"run folder: {paths.root}", markup=False, highlight=False)
        self.eta = Eta(cells, expected)
        self.progress.start()
        self.task = self.progress.add_task("sweep", total=len(cells), status="")

    def log(self, message: str) -> None:
        self.console.print(f"[dim]{escape(message)}[/dim]", highlight=False)

    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        with self._lock:
            if waited_s is not None:  # its time runs from now on (the ETA's elapsed)
                self.clock.restart(cell_id)
            self.console.print(escape(f"{time.strftime('%H:%M:%S')} {cell_id}: {message}"),
                               style="yellow" if waited_s is None else "dim", highlight=False)

    def pull_progress(self, progress: PullProgress) -> None:
        """A base image's pull while the backend prepares (before the sweep's bar): a bar of
        its own; once the sweep's bar is drawn, a line every few seconds beside it."""
        if self.task is None:
            self.pulls.pull_progress(progress)
        elif self.pulls.due(progress):
            self.log(progress.line())

    def cell_started(self, cell: Cell, allocation: Allocation) -> None:
        if cell.is_control:
            return
        with self._lock:
            self.clock.started(self.eta, cell.id, len(self.running) + 1)
            self.running[cell.id] = "starting"
            where = f" on {allocation.host}" if allocation.host else ""
            gpus = f" GPUs {list(allocation.gpu_ids)}" if allocation.gpu_ids else ""
            self.progress.update(self._task, description=escape(f"{cell.id}{where}{gpus}"),
                                 status=self._status())

    def cell_output(self, cell_id: str, line: str) -> None:
        if self.verbose:
            self.console.print(f"{cell_id} | {line}", style="dim", highlight=False, markup=False)
        if not line.startswith("{"):
            return
        parsed = parse_metric_lines(line)
        if not parsed:
            return
        obj = parsed[0]
        data = obj.get("data", {})
        ips = data.get("train.total_ips") or data.get("val.total_ips")
        with self._lock:
            if cell_id not in self.running:
                return
            if isinstance(ips, int | float):
                self.running[cell_id] = f"step {obj.get('step', '?')}: {ips:,.1f} img/s"
            elif obj.get("type") == "meta":
                env = obj.get("env", {})
                self.running[cell_id] = f"running on {env.get('device_name') or env.get('device')}"
            self.progress.update(self._task, status=self._status())

    def cell_finished(self, cell: Cell, result: CellResult) -> None:
        if cell.is_control:
            with self._lock:
                if self.eta is not None:
                    self.eta.control_finished(result.duration_s)
            self.console.print(escape(f"control {cell.id}: {_detail(cell, result)}"),
                               style="dim", highlight=False)
            return
        with self._lock:
            self.running.pop(cell.id, None)
            self.clock.finished(self.eta, cell.id, result.duration_s)
            mark = "[green]ok[/green]" if result.status is Status.OK else \
                f"[red]{result.status.value}[/red]"
            from orchestrator.results.reports.summary import throughput_key

            ips = result.metrics.get(throughput_key(cell.params.mode))
            detail = f"{ips:,.1f} images/s" if isinstance(ips, int | float) else result.reason
            took = f" ({result.duration_s:.1f} s)" if result.duration_s else ""
            self.console.print(f"{mark} {escape(f'{cell.id}{took}: {detail}')}",
                               highlight=False)
            self.progress.advance(self._task)
            self.progress.update(self._task, status=self._status())


class LineEvents:
    """Progress as timestamped lines (cron, CI, a pipe): a line when each cell starts and one
    when it ends, with ``n/N``, the counts so far and the ETA (:class:`~orchestrator.plan.eta.Eta`,
    from earlier runs' durations); ``verbose`` adds every line the cells print."""

    def __init__(self, stream: TextIO | None = None, verbose: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self.total = 0
        self.started: set[str] = set()
        self.running: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.eta: Eta | None = None
        self.clock = SweepClock()
        self._lock = threading.Lock()
        self.mute = False

    def say(self, text: str) -> None:
        """One timestamped line. Progress that cannot be written (the reader of the pipe is
        gone: an ssh session closed) goes unsaid; the sweep goes on."""
        with self._lock:
            if self.mute:
                return
            try:
                print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", file=self.stream,
                      flush=True)
            except OSError as exc:  # BrokenPipeError, EIO
                self.mute = True
                log.debug("progress lines stopped: %s", exc)

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: Mapping[str, float]) -> None:
        self.total = len(cells)
        self.eta = Eta(cells, expected)
        self.say(f"run folder: {paths.root} ({_cells(self.total)})")

    def log(self, message: str) -> None:
        self.say(message)

    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        if waited_s is not None:
            self.clock.restart(cell_id)
        self.say(f"{cell_id}: {message}")

    def cell_started(self, cell: Cell, allocation: Allocation) -> None:
        if cell.is_control:
            return
        self.started.add(cell.id)
        self.running.add(cell.id)
        self.clock.started(self.eta, cell.id, len(self.running))
        where = f" on {allocation.host}" if allocation.host else ""
        gpus = f" GPUs {','.join(map(str, allocation.gpu_ids))}" if allocation.gpu_ids else ""
        self.say(f"[{len(self.started)}/{self.total}] start {cell.id}{where}{gpus}")

    def cell_output(self, cell_id: str, line: str) -> None:
        if self.verbose:
            self.say(f"{cell_id} | {line}")

    def cell_finished(self, cell: Cell, result: CellResult) -> None:
        if cell.is_control:
            if self.eta is not None:
                self.eta.control_finished(result.duration_s)
            took = f" {result.duration_s:.1f} s" if result.duration_s else ""
            self.say(f"control {result.status.value} {cell.id}{took}: {_detail(cell, result)}")
            return
        self.running.discard(cell.id)
        self.counts[result.status.value] += 1
        self.clock.finished(self.eta, cell.id, result.duration_s)
        done = sum(self.counts.values())
        took = f" {result.duration_s:.1f} s" if result.duration_s else ""
        counts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()))
        self.say(f"[{done}/{self.total}] {result.status.value} {cell.id}{took}: "
                 f"{_detail(cell, result)} | {counts} | ETA {self.clock.eta_text(self.eta)}")


class QuietEvents:
    """``-q``: no progress, but a cell that waits for another sweep's locks says so, one
    timestamped line when the wait begins (a nightly's log must show why it took longer)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.lines = LineEvents(stream)

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: Mapping[str, float]) -> None: ...
    def log(self, message: str) -> None: ...
    def cell_started(self, cell: Cell, allocation: Allocation) -> None: ...
    def cell_output(self, cell_id: str, line: str) -> None: ...
    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...

    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        if waited_s is None:
            self.lines.say(f"{cell_id}: {message}")


def _detail(cell: Cell, result: CellResult) -> str:
    """images/s of a cell that ended ok, else why it did not."""
    from orchestrator.results.reports.summary import throughput_key

    ips = result.metrics.get(throughput_key(cell.params.mode))
    return f"{ips:,.1f} images/s" if isinstance(ips, int | float) else result.reason


def verbosity(args: argparse.Namespace) -> int:
    """-1 quiet, 0 normal, 1 verbose: ``orchestrate -q matrix`` (the global flags, which also
    set the log level) or ``orchestrate matrix -q`` (this command's own)."""
    level = int(getattr(args, "verbose", 0) or 0) - (1 if getattr(args, "quiet", False) else 0)
    level += getattr(args, "matrix_verbose", 0) - getattr(args, "matrix_quiet", 0)
    return max(-1, min(1, level))


def sweep_events(level: int, stream: TextIO | None = None
                 ) -> RichEvents | LineEvents | QuietEvents:
    """How a sweep reports progress: only lock waits (quiet), a bar in a terminal, else
    lines."""
    stream = stream or sys.stderr
    if level < 0:
        return QuietEvents(stream)
    if stream.isatty():
        return RichEvents(verbose=level > 0)
    return LineEvents(stream, verbose=level > 0)


def cmd_matrix(args: argparse.Namespace) -> int:
    from orchestrator.sweep import StopFlag, check_run, run_sweep

    if args.target is not None and not args.dry_run:
        raise ConfigError("a sweep runs on this machine: --target plans for another one, "
                          "with --dry-run", field="--target")
    matrix, decision = _load(args, refuse=not args.dry_run)
    results = results_root(args.results)
    if args.dry_run:  # the file's and the run options' refusals before the (long) plan
        check_run(matrix, results, args.resume)
        sys.stdout.writelines(f"{line}\n" for line in itertools.chain(
            dry_run_lines(matrix, decision, results, args.order_seed), [""],
            requirement_lines(matrix, decision)))
        return plan_exit(decision)
    # SIGINT too, explicitly: a sweep started in the background of a script inherits SIGINT
    # ignored from the shell, and `kill -INT` must still stop it the one way it stops. SIGHUP
    # (its terminal or ssh session closed) stops it the same way: its cells stopped and
    # recorded, its locks released, run.json finished (the default would kill it at once and
    # orphan the running cell); unless it was ignored from the start (nohup). Any number of
    # them, at any moment, stop it once (StopFlag): exit 130.
    own_process = getattr(args, "own_process", False)
    stop = StopFlag()
    stopper = _Stopper(stop)
    previous = {sig: signal.signal(sig, stopper) for sig in STOP_SIGNALS
                if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)}
    try:
        if own_process and app.STOPS.signum is not None:  # one came before these handlers
            stop.stop(app.STOPS.signum)
        progress = sweep_events(verbosity(args))
        try:  # a progress bar is drawn while the sweep runs and cleared after
            with progress if isinstance(progress, RichEvents) else contextlib.nullcontext():
                outcome = run_sweep(matrix, decision=decision, results_root=results,
                                    events=progress, cancel=stop,
                                    resume=args.resume, lock_timeout_s=args.lock_timeout,
                                    order_seed=args.order_seed)
        finally:
            stop.unwinds = False  # the run is on disk: a later signal only makes the exit 130
        return _after_sweep(args, outcome, stop)
    finally:
        if not own_process:  # a process of its own keeps the handler
            stopper.restore(previous)  # to its end: no signal kills it before it exits 130


def _after_sweep(args: argparse.Namespace, outcome: SweepOutcome, stop: StopFlag) -> int:
    """Print a finished sweep's table, counts and problems; publish it (not after a stop);
    the exit status (130 once a stop signal came, even after the cells had ended)."""
    print(outcome.table)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(outcome.counts.items()))
    controls = outcome.control_counts
    extra = ("; control measurements: " + ", ".join(
        f"{v} {k}" for k, v in sorted(controls.items()))) if controls else ""
    print(f"\n{_cells(sum(outcome.counts.values()))}: {counts}{extra}")
    print(f"results: {outcome.paths.root}")
    from orchestrator.results.reports.summary import load_line

    load = load_line(outcome.load)
    if load:
        print(load)
    for problem in outcome.problems:
        print(f"error: {problem}", file=sys.stderr)
    if outcome.interrupted:
        print("interrupted: cells that did not finish are recorded as cancelled",
              file=sys.stderr)
    elif not outcome.ok:
        failed = [r for r in outcome.results if r.status is not Status.OK]
        for r in failed:
            print(f"  {r.cell_id}: {r.status.value}: {r.reason}", file=sys.stderr)
    if not outcome.interrupted and not stop.is_set():  # a Ctrl-C means stop now, not publish
        from orchestrator.cli.publish_commands import after_run

        after_run(outcome.paths, args.results, skip=args.no_publish)
    return 130 if stop.signum is not None else outcome.exit_code  # (also after the sweep)


def _inventory_line(hosts: Path | None) -> list[str]:
    """What ``--dry-run`` says of the inventory a sweep reads (the decision refused an invalid
    one; a missing one is a requirement); no host is contacted."""
    from orchestrator.config.inventory import load_hosts

    if hosts is None:
        return ["hosts: no inventory (the requirements say where to give one); the cells are "
                "shown on no host"]
    return [f"hosts: {hosts} ({len(load_hosts(hosts).hosts)} hosts; not contacted by a dry run)"]


def image_lines(matrix: Matrix, backend: BackendRecord, driver: HostDriver | None = None
                ) -> list[str]:
    """What ``--dry-run`` says of the Docker images the cells need, built where ``backend``
    builds them (no engine: the tags shown cover the build context; the build's also cover
    the base image's digest or ID). ``driver``: a declared target's, for an auto release. An
    image whose build input is not on this machine is said so (the requirements list it)."""
    from orchestrator.errors import ConfigError
    from orchestrator.images import build
    from orchestrator.plan import selection

    cells = [c for c in matrix.checked_cells if not matrix.profile(c).apptainer_runtime]
    build.check_image_templates(matrix, cells, backend.name)
    lines = []
    for key in selection.needed_keys(matrix, cells):
        name = key.hardware + (f" (ngc_release {key.ngc_release})" if key.ngc_release else "")
        auto = key.ngc_release is None and selection.is_auto(matrix, key.hardware)
        if auto and driver is None:
            lines.append(f"image for {name}: release chosen from {backend.images_on}'s driver "
                         "when the sweep runs (release = 'auto', template "
                         f"{matrix.profiles[key.hardware].image})")
            continue
        try:
            choice, plan = build.plan_key(matrix, key, driver if auto else None)
        except ConfigError as exc:
            lines.append(f"image for {name}: not planned here (template "
                         f"{matrix.profiles[key.hardware].image}): {exc.problems[0].message}")
            continue
        lines.append(f"image for {name}: {plan.tag} (template {plan.template}, base "
                     f"{plan.base_image}; {choice.label}; the tag is pinned to the base's "
                     "digest or ID when built)")
    return lines


def dry_run_lines(matrix: Matrix, decision: Decision, results: Path,
                  order_seed: int | None = None) -> Iterator[str]:
    """What ``--dry-run`` prints, as the decision's backend record says: the plan, the Docker
    images (where it builds them), the inventory (where it reads one), every cell's exact
    launch (:mod:`orchestrator.backends.dry_run`), how they would be submitted (the backend's
    :meth:`~orchestrator.backends.base.Backend.submission_lines`: Slurm's arrays), and where
    the run would go, line by line as each is made. Nothing is built, written, submitted or
    connected to."""
    from orchestrator.backends.dry_run import dry_backend, launches_on, lines
    from orchestrator.plan.selection import HostDriver

    backend, record, target = decision.backend, decision.record, decision.target
    yield from plan_lines(matrix, backend)
    if record.images_on:
        declared = HostDriver.from_facts(target.facts) if target.facts else None
        yield from image_lines(matrix, record, declared)
    if record.inventory:
        yield from _inventory_line(decision.hosts_file)
    yield (f"commands ({backend} backend; cell folders under {results}/{matrix.name}/"
           "<run id>/):")
    runner = dry_backend(matrix, backend, results, decision.hosts_file, target)
    for launch in launches_on(runner, matrix.checked_cells):
        yield "\n".join(f"  {line}" for line in lines(launch))  # a cell's lines at once
    yield from runner.submission_lines(list(matrix.cells))
    seed = f"seed {order_seed}" if order_seed is not None else "a fresh seed, recorded in plan.json"
    yield (f"order: rounds of repeats, each in a random order ({seed}); longest expected "
           "first when the backend runs several cells at once")
    yield f"where: {placement_words(record)}"
    yield (f"dry run: would run {_cells(len(matrix.cells))} with backend {backend} into "
           f"{results}/{matrix.name}/<run id>/")


def placement_words(record: BackendRecord) -> str:
    """What the target decides of each cell's launch, as its backend's record says: the GPU
    ids shown are an idle machine's (the sweep takes the free ones), an ssh cell's host the
    first that may run it, a scheduler's nodes its own choice."""
    if record.here:
        return ("the GPU ids shown are the first of each profile's gpu_ids (else 0, 1, ...), as "
                "on an idle machine; the sweep gives a cell those free when it starts")
    if record.inventory:
        return ("each cell is shown on the first host that may run it, with its first GPUs; the "
                "sweep places it on whichever such host is free (release = 'auto': that host's "
                "driver picks the image)")
    return (f"the {record.name} backend's scheduler picks the nodes and GPUs when each job "
            "starts (CUDA_VISIBLE_DEVICES is the job's)")


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


#: The signals that stop a sweep the one way it stops (see :func:`cmd_matrix`).
STOP_SIGNALS = app.STOP_SIGNALS


class _Stopper:
    """The handler of :data:`STOP_SIGNALS`: each sets the sweep's :class:`~orchestrator.sweep.
    StopFlag`, which raises KeyboardInterrupt in the main thread for the first one only, and only
    where the sweep may unwind (before its run folder exists, while it prepares).

    SIGHUP means the terminal is gone: a closed terminal sends it twice (the kernel, then the
    shell), and writing to it fails (EIO). So the first SIGHUP also points stdout and stderr at
    /dev/null where they were that terminal (known from the start: a hung-up terminal no longer
    says it is one), and later ones are ignored: the sweep stops once, quietly."""

    def __init__(self, stop: StopFlag | None = None) -> None:
        from orchestrator.sweep import StopFlag

        self.stop = stop if stop is not None else StopFlag()
        self.terminal_fds = [fd for fd in (1, 2) if _isatty(fd)]
        self.hung_up = False

    def __call__(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP and not self.hung_up:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            self.hung_up = True
            _to_devnull(self.terminal_fds)
        app.STOPS.note(signum)  # the exit status is 130
        self.stop.stop(signum)  # KeyboardInterrupt only where the sweep may unwind

    def restore(self, previous: Mapping[signal.Signals, Any]) -> None:
        """Put back the handlers the sweep replaced, except SIGHUP after a hang-up: it stays
        ignored, so the terminal's second SIGHUP (which may come after the sweep has already
        stopped) cannot kill the process before it prints its summary and exits 130."""
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_IGN if sig == signal.SIGHUP and self.hung_up
                          else handler)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _to_devnull(fds: list[int]) -> None:
    if not fds:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.dup2(devnull, fd)
    finally:
        os.close(devnull)

