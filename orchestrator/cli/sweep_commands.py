"""``orchestrate matrix | plan | validate | schema`` (runs, report, compare, history and export
are :mod:`orchestrator.cli.result_commands`).

A sweep's progress goes to stderr: a progress bar in a terminal (:class:`RichEvents`), else
(cron, CI, a pipe) one timestamped line when each cell starts and one when it ends, with
``n/N``, the running counts and the ETA (:class:`LineEvents`). ``-q`` shows neither (errors
and the final table only); ``-v`` adds every line the cells print. The results folder and the
hosts inventory default from the environment and the user's config file
(:mod:`orchestrator.config.defaults`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from orchestrator.config.defaults import RESULTS_HELP, hosts_file, results_root
from orchestrator.errors import ConfigError, Problem
from orchestrator.plan.eta import Eta, format_duration
from orchestrator.plan.matrix import Cell, Matrix, filter_cells, load_matrix
from orchestrator.results.run_folder import (
    CellResult,
    RunPaths,
    Status,
    parse_metric_lines,
)

if TYPE_CHECKING:
    from rich.progress import TaskID

    from orchestrator.backends.checks import Findings
    from orchestrator.plan.placement import Allocation

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
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.add_argument("--backend", help=f"{_backends_help()} (default: [matrix] backend)")
    p.add_argument("--results", type=Path, metavar="DIR", help=RESULTS_HELP)
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="run only matching cells (repeatable; same key: any value)")
    p.add_argument("--hosts", type=Path, metavar="HOSTS.toml",
                   help="hosts inventory for --backend ssh (default: [matrix] hosts)")
    p.add_argument("--resume", nargs="?", const="", metavar="RUN_ID",
                   help="re-run, in an earlier run's folder (default: the newest), only the "
                   "cells that did not end ok")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--order-seed", type=_order_seed, metavar="N",
                   help="seed of the cells' random order within each round of repeats "
                   "(default: a fresh one, recorded in plan.json and run.json; give a run's "
                   "seed to run its order again)")
    p.add_argument("--lock-timeout", type=_seconds, metavar="S",
                   help="a cell whose GPUs another sweep holds waits at most S seconds, then "
                   "fails (default: it waits as long as it takes)")
    p.add_argument("--no-wait", dest="lock_timeout", action="store_const", const=0.0,
                   help="never wait for GPUs another sweep holds (--lock-timeout 0)")
    p.add_argument("-q", "--quiet", dest="matrix_quiet", action="count",
                   default=argparse.SUPPRESS, help="no progress, only errors and the table")
    p.add_argument("-v", "--verbose", dest="matrix_verbose", action="count",
                   default=argparse.SUPPRESS, help="also every line the cells print")
    p.set_defaults(handler=cmd_matrix)

    p = sub.add_parser(
        "plan", help="print the expanded cells of a matrix",
        description="Print the cells MATRIX.toml expands to (id, varying parameters, repeat, "
        "content hash), after the same checks as `validate`; builds and runs nothing.")
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="only matching cells (repeatable; same key: any value)")
    p.add_argument("--json", action="store_true", help="a JSON list, one object per cell")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser(
        "validate", help="check a matrix file; exit 2 listing every problem",
        description="Check MATRIX.toml: its structure and types, then whether every cell can "
        "run where it is planned (model, torch features, precision and profiler on the "
        "hardware, image kind for the backend, the baseline). Prints each profile's software "
        "stack, warnings and what could not be checked.",
    )
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.add_argument("--backend", help=f"check for this backend: {_backends_help()} "
                   "(default: [matrix] backend)")
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


def _backends_help() -> str:
    """The backends of this build, for --help ("process, docker, ssh or slurm")."""
    from orchestrator.backends import backend_names

    names = backend_names()
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


# --- plan / validate / schema ----------------------------------------------------------------


def _load(args: argparse.Namespace) -> Matrix:
    """The matrix file, validated, checked (every cell can run where it is planned: a
    ConfigError otherwise, before anything is built or launched), then ``--only`` filtered."""
    matrix, findings = _checked(args.matrix_file, getattr(args, "backend", None))
    for problem in findings.warnings:
        log.warning("%s", problem)
    for problem in findings.notes:
        log.info("not checked: %s", problem)
    return filter_cells(matrix, getattr(args, "only", []))


def _load_matrix(path: Path) -> Matrix:
    """The matrix file, validated; ``[matrix] backend`` must name a backend of this build."""
    from orchestrator.backends import backend_names

    return load_matrix(path, backends=backend_names())


def _checked(path: Path, backend: str | None, strict: bool = False) -> tuple[Matrix, Findings]:
    """The matrix and what :mod:`orchestrator.backends.checks` found for ``backend`` (default: its
    own)."""
    from orchestrator.backends.checks import refuse_unrunnable

    matrix = _load_matrix(path)
    return matrix, refuse_unrunnable(matrix, backend, strict=strict)


def plan_lines(matrix: Matrix, backend: str | None = None) -> list[str]:
    """The plan's header and table (``backend``: the one the sweep would use, else the
    matrix's own)."""
    from tabulate import tabulate

    from orchestrator.results.summary import column_order

    shown = column_order(["hardware", *[k for k in matrix.varying if k != "hardware"]])
    rows = [[c.id, *[c.params.model_dump()[k] for k in shown], c.repeat, c.hash]
            for c in matrix.cells]
    table = tabulate(rows, headers=["cell", *shown, "repeat", "hash"], tablefmt="simple",
                     disable_numparse=True)
    groups = len({c.group for c in matrix.cells})
    head = (f"{matrix.name}: {len(matrix.cells)} cells ({groups} configurations x "
            f"{matrix.settings.repeats} repeats), backend {backend or matrix.settings.backend}")
    return [head, table, *control_lines(matrix)]


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
    matrix = _load(args)
    if args.json:
        print(json.dumps([c.to_json() for c in matrix.checked_cells], indent=2))
    else:
        print("\n".join(plan_lines(matrix)))
    return 0


def _check_backend(name: str | None) -> None:
    """``--backend NAME`` must name a backend of this build (ConfigError on ``--backend``)."""
    if name is None:
        return
    from orchestrator.backends import backend_names

    if name not in backend_names():
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(backend_names())}",
                          field="--backend")


def cmd_validate(args: argparse.Namespace) -> int:
    _check_backend(args.backend)
    matrix, findings = _checked(args.matrix_file, args.backend, strict=args.strict)
    backend = args.backend or matrix.settings.backend
    build_problems = _image_problems(matrix, backend)
    if build_problems and args.strict:
        raise ConfigError(build_problems)
    print(f"{args.matrix_file}: ok ({len(matrix.cells)} cells)")
    pinned = {hw for hw, _ in findings.release_stacks}
    for hw, stack in findings.stacks.items():
        if hw in pinned and all(c.params.ngc_release for c in matrix.cells if c.hardware == hw):
            continue  # every cell pins its release: the lines below say which
        print(f"  hardware {hw} ({backend} backend): {stack.label}")
    for (hw, release), stack in findings.release_stacks.items():
        print(f"  hardware {hw}, ngc_release {release} ({backend} backend): {stack.label}")
    for problem in findings.warnings:
        print(f"  warning: {problem}")
    for problem in build_problems:
        print(f"  warning: {problem}; `orchestrate matrix` refuses to run until it is fixed")
    for problem in findings.notes:
        print(f"  note: {problem}")
    return 0


def _image_problems(matrix: Matrix, backend: str) -> list[Problem]:
    """What ``matrix --dry-run`` and a sweep refuse in the images of a docker/ssh matrix beyond
    the checks: a file a profile copies into the build context that is not on this machine
    (the Bitfusion client .deb, a lab's checkout). A warning for ``validate``: the matrix is
    right, this machine lacks the file."""
    if backend not in ("docker", "ssh"):
        return []
    try:
        image_lines(matrix, backend)
    except ConfigError as exc:
        return exc.problems
    return []


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
            from orchestrator.results.summary import throughput_key

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
        self.say(f"run folder: {paths.root} ({self.total} cells)")

    def log(self, message: str) -> None:
        self.say(message)

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


def _detail(cell: Cell, result: CellResult) -> str:
    """images/s of a cell that ended ok, else why it did not."""
    from orchestrator.results.summary import throughput_key

    ips = result.metrics.get(throughput_key(cell.params.mode))
    return f"{ips:,.1f} images/s" if isinstance(ips, int | float) else result.reason


def verbosity(args: argparse.Namespace) -> int:
    """-1 quiet, 0 normal, 1 verbose: ``orchestrate -q matrix`` (the global flags, which also
    set the log level) or ``orchestrate matrix -q`` (this command's own)."""
    level = int(getattr(args, "verbose", 0) or 0) - (1 if getattr(args, "quiet", False) else 0)
    level += getattr(args, "matrix_verbose", 0) - getattr(args, "matrix_quiet", 0)
    return max(-1, min(1, level))


def sweep_events(level: int, stream: TextIO | None = None) -> RichEvents | LineEvents | None:
    """How a sweep reports progress: nothing (quiet), a bar in a terminal, else lines."""
    stream = stream or sys.stderr
    if level < 0:
        return None
    if stream.isatty():
        return RichEvents(verbose=level > 0)
    return LineEvents(stream, verbose=level > 0)


def cmd_matrix(args: argparse.Namespace) -> int:
    from orchestrator.backends import backend_for
    from orchestrator.results.run_folder import check_results_root
    from orchestrator.sweep import NullEvents, hosts_file_of, run_sweep

    _check_backend(args.backend)
    matrix = _load(args)
    results = results_root(args.results)
    backend = backend_for(matrix, args.backend)
    if args.dry_run:  # every refusal before the (long) plan, as a real sweep would refuse
        check_results_root(results)
        images = image_lines(matrix, backend) if backend in ("docker", "ssh") else []
        inventory = _inventory_line(matrix, args.hosts) if backend == "ssh" else []
        runtime = runtime_lines(matrix, backend, results)
        jobs = slurm_lines(matrix, results) if backend == "slurm" else []
        print("\n".join([*plan_lines(matrix, backend), *images, *inventory, *runtime, *jobs]))
        seed = (f"seed {args.order_seed}" if args.order_seed is not None
                else "a fresh seed, recorded in plan.json")
        print(f"order: rounds of repeats, each in a random order ({seed}); longest expected "
              "first when the backend runs several cells at once")
        print(f"dry run: would run {len(matrix.cells)} cells with backend "
              f"{backend} into {results}/{matrix.name}/<run id>/")
        return 0
    hosts = args.hosts
    if backend == "ssh":
        hosts = hosts_file(args.hosts, hosts_file_of(matrix))
    cancel = threading.Event()
    # SIGINT too, explicitly: a sweep started in the background of a script inherits SIGINT
    # ignored from the shell, and `kill -INT` must still stop it the one way it stops. SIGHUP
    # (its terminal or ssh session closed) stops it the same way: its cells stopped and
    # recorded, its locks released, run.json finished (the default would kill it at once and
    # orphan the running cell).
    stopper = _Stopper()
    previous = {sig: signal.signal(sig, stopper) for sig in STOP_SIGNALS}
    progress = sweep_events(verbosity(args))
    try:
        if isinstance(progress, RichEvents):
            with progress:
                outcome = run_sweep(matrix, backend_name=args.backend, results_root=results,
                                    events=progress, cancel=cancel, hosts_file=hosts,
                                    resume=args.resume, lock_timeout_s=args.lock_timeout,
                                    order_seed=args.order_seed)
        else:
            outcome = run_sweep(matrix, backend_name=args.backend, results_root=results,
                                events=progress or NullEvents(), cancel=cancel,
                                hosts_file=hosts, resume=args.resume,
                                lock_timeout_s=args.lock_timeout, order_seed=args.order_seed)
    finally:
        stopper.restore(previous)
    print(outcome.table)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(outcome.counts.items()))
    controls = outcome.control_counts
    extra = ("; control measurements: " + ", ".join(
        f"{v} {k}" for k, v in sorted(controls.items()))) if controls else ""
    print(f"\n{sum(outcome.counts.values())} cells: {counts}{extra}")
    print(f"results: {outcome.paths.root}")
    for problem in outcome.problems:
        print(f"error: {problem}", file=sys.stderr)
    if outcome.interrupted:
        print("interrupted: cells that did not finish are recorded as cancelled",
              file=sys.stderr)
    elif not outcome.ok:
        failed = [r for r in outcome.results if r.status is not Status.OK]
        for r in failed:
            print(f"  {r.cell_id}: {r.status.value}: {r.reason}", file=sys.stderr)
    return outcome.exit_code


def _inventory_line(matrix: Matrix, cli_hosts: Path | None) -> list[str]:
    """What ``--dry-run`` says of an ssh sweep's inventory: read and checked as the sweep reads
    it (a missing or invalid file is refused here too); no host is contacted."""
    from orchestrator.backends.ssh import NO_INVENTORY_HINT
    from orchestrator.config.inventory import load_hosts
    from orchestrator.sweep import hosts_file_of

    path = hosts_file(cli_hosts, hosts_file_of(matrix))
    if path is None:
        raise ConfigError(NO_INVENTORY_HINT, file=str(matrix.path), field="matrix.hosts")
    inventory = load_hosts(path)
    return [f"hosts: {path} ({len(inventory.hosts)} hosts; not contacted by a dry run)"]


def image_lines(matrix: Matrix, backend: str) -> list[str]:
    """What ``--dry-run`` says of the images the cells need (no engine: the tags shown cover
    the build context; the build's also cover the base image's digest or ID)."""
    from orchestrator.images import build
    from orchestrator.plan import selection

    cells = [c for c in matrix.checked_cells if not matrix.profile(c).apptainer_runtime]
    build.check_image_templates(matrix, cells, backend)
    lines = []
    for key in selection.needed_keys(matrix, cells):
        name = key.hardware + (f" (ngc_release {key.ngc_release})" if key.ngc_release else "")
        if key.ngc_release is None and selection.is_auto(matrix, key.hardware):
            where = "each host's" if backend == "ssh" else "this machine's"
            lines.append(f"image for {name}: release chosen from {where} driver when the sweep "
                         f"runs (release = 'auto', template {matrix.profiles[key.hardware].image})")
            continue
        choice, plan = build.plan_key(matrix, key)
        lines.append(f"image for {name}: {plan.tag} (template {plan.template}, base "
                     f"{plan.base_image}; {choice.label}; the tag is pinned to the base's "
                     "digest or ID when built)")
    return lines


def runtime_lines(matrix: Matrix, backend: str, results: Path) -> list[str]:
    """What ``--dry-run`` says of cells that run under Apptainer (process and slurm backends):
    each cell's ``apptainer exec ...`` command as the backend builds it, and, under Slurm, its
    batch script: the first one shown, every one written into a fresh folder (paths printed).
    Cell folders read ``<run id>``; nothing is built or submitted."""
    import shlex
    import tempfile

    from orchestrator.backends import backend_class
    from orchestrator.backends.base import RunOptions
    from orchestrator.plan.placement import Allocation
    from orchestrator.results.run_folder import RunPaths

    cells = [c for c in matrix.checked_cells if matrix.profiles[c.hardware].apptainer_runtime]
    if not cells or backend not in ("process", "slurm"):
        return []
    paths = RunPaths(results.resolve() / matrix.name / "<run id>")
    runner = backend_class(backend)(matrix, paths, RunOptions(timeout_s=matrix.settings.timeout_s))
    lines = ["apptainer commands (GPU ids: " + ("Slurm's allocation, passed in by the batch "
             "script" if backend == "slurm" else "as placed when the sweep runs; 0.. shown")
             + "):"]
    scripts: Path | None = None
    for cell in cells:
        gpus = range(cell.params.gpus) if matrix.profile(cell).device == "cuda" else ()
        spec = runner.spec(cell, Allocation.local(cell.id, gpus))
        lines.append(f"  {cell.id}: {shlex.join(spec.argv)}")
        if spec.script is None:
            continue
        if scripts is None:
            scripts = Path(tempfile.mkdtemp(prefix=f"orchestrate-dry-run-{matrix.name}-"))
            lines += [f"  batch script of {cell.id}:",
                      *(f"    {line}" for line in spec.script.splitlines())]
        script = scripts / f"{cell.id}.sbatch"
        script.write_text(spec.script, encoding="utf-8")
        lines.append(f"    written: {script}")
    return lines


def slurm_lines(matrix: Matrix, results: Path) -> list[str]:
    """What ``--dry-run`` says of a slurm sweep's submissions: its arrays and jobs, each with
    its sbatch options (:meth:`~orchestrator.backends.slurm.SlurmBackend.submission_lines`)."""
    from orchestrator.backends.base import RunOptions
    from orchestrator.backends.slurm import SlurmBackend
    from orchestrator.results.run_folder import RunPaths

    paths = RunPaths(results.resolve() / matrix.name / "<run id>")
    backend = SlurmBackend(matrix, paths, RunOptions(timeout_s=matrix.settings.timeout_s))
    return backend.submission_lines(list(matrix.cells))


#: The signals that stop a sweep the one way it stops (see :func:`cmd_matrix`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stopper:
    """The handler of :data:`STOP_SIGNALS`: each raises KeyboardInterrupt in the main thread.

    SIGHUP means the terminal is gone: a closed terminal sends it twice (the kernel, then the
    shell), and writing to it fails (EIO). So the first SIGHUP also points stdout and stderr at
    /dev/null where they were that terminal (known from the start: a hung-up terminal no longer
    says it is one), and later ones are ignored: the sweep stops once, quietly."""

    def __init__(self) -> None:
        self.terminal_fds = [fd for fd in (1, 2) if _isatty(fd)]
        self.hung_up = False

    def __call__(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            self.hung_up = True
            _to_devnull(self.terminal_fds)
        raise KeyboardInterrupt

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

