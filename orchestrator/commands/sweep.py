"""``orchestrate matrix | plan | validate | schema | report``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError
from orchestrator.matrix import Cell, Matrix, filter_cells, load_matrix
from orchestrator.results import (
    CellResult,
    RunPaths,
    Status,
    find_run,
    parse_metric_lines,
    runs_of,
)

if TYPE_CHECKING:
    from rich.progress import TaskID

    from orchestrator.checks import Findings
    from orchestrator.placement import Allocation

log = logging.getLogger(__name__)

DEFAULT_RESULTS = Path("results")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "matrix", help="run a sweep: every cell of a matrix file",
        description="Expand MATRIX.toml into cells and run each one; results land in "
        "RESULTS/<matrix>/<run id>/.",
    )
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.add_argument("--backend", help="process, docker, ssh (default: [matrix] backend)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, metavar="DIR",
                   help="results root (default: ./results)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="run only matching cells (repeatable; same key: any value)")
    p.add_argument("--hosts", type=Path, metavar="HOSTS.toml",
                   help="hosts inventory for --backend ssh (default: [matrix] hosts)")
    p.add_argument("--resume", nargs="?", const="", metavar="RUN_ID",
                   help="re-run, in an earlier run's folder (default: the newest), only the "
                   "cells that did not end ok")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.set_defaults(handler=cmd_matrix)

    p = sub.add_parser("plan", help="print the expanded cells of a matrix")
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE")
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
    p.add_argument("--backend", help="check for this backend (default: [matrix] backend)")
    p.add_argument("--strict", action="store_true",
                   help="warnings are problems too (exit 2)")
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("schema", help="print the JSON Schema of matrix files (for editors)")
    p.set_defaults(handler=cmd_schema)

    p = sub.add_parser("report", help="re-print the summary table of a finished run")
    p.add_argument("matrix", help="matrix name (or a path to its .toml)")
    p.add_argument("--run", help="run id (default: the newest)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, metavar="DIR")
    p.add_argument("--baseline", metavar="KEY=VALUE",
                   help="add each row's ratio to this row, e.g. hardware=v100 "
                   "(default: [matrix] baseline)")
    p.add_argument("--plot", type=Path, metavar="FILE",
                   help="also draw it (png/svg/pdf): scaling vs GPUs, or bars per configuration")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser(
        "history", help="a matrix across runs: trend per cell group, regressions flagged",
        description="Median images/s of each cell group in the last runs of a matrix; the "
        "newest run is compared with the median of the runs before it.",
    )
    p.add_argument("matrix", help="matrix name (or a path to its .toml)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, metavar="DIR")
    p.add_argument("--last", type=int, default=7, metavar="N", help="runs shown (default 7)")
    p.add_argument("--window", type=int, default=5, metavar="N",
                   help="previous runs forming the reference (default 5)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="flag a drop larger than this fraction (default 0.05)")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when a regression is flagged (for nightly jobs)")
    p.add_argument("--plot", type=Path, metavar="FILE", help="also draw the trend (png/svg/pdf)")
    p.set_defaults(handler=cmd_history)


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
    """The matrix and what :mod:`orchestrator.checks` found for ``backend`` (default: its own)."""
    from orchestrator.checks import refuse_unrunnable

    matrix = _load_matrix(path)
    return matrix, refuse_unrunnable(matrix, backend, strict=strict)


def plan_lines(matrix: Matrix) -> list[str]:
    from tabulate import tabulate

    from orchestrator.summary import column_order

    shown = column_order(["hardware", *[k for k in matrix.varying if k != "hardware"]])
    rows = [[c.id, *[c.params.model_dump()[k] for k in shown], c.repeat, c.hash]
            for c in matrix.cells]
    table = tabulate(rows, headers=["cell", *shown, "repeat", "hash"], tablefmt="simple",
                     disable_numparse=True)
    groups = len({c.group for c in matrix.cells})
    head = (f"{matrix.name}: {len(matrix.cells)} cells ({groups} configurations x "
            f"{matrix.settings.repeats} repeats), backend {matrix.settings.backend}")
    return [head, table]


def cmd_plan(args: argparse.Namespace) -> int:
    matrix = _load(args)
    if args.json:
        print(json.dumps([c.to_json() for c in matrix.cells], indent=2))
    else:
        print("\n".join(plan_lines(matrix)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    if args.backend is not None:
        from orchestrator.backends import backend_names

        if args.backend not in backend_names():
            raise ConfigError(f"unknown backend {args.backend!r}; known: "
                              f"{', '.join(backend_names())}", field="--backend")
    matrix, findings = _checked(args.matrix_file, args.backend, strict=args.strict)
    backend = args.backend or matrix.settings.backend
    print(f"{args.matrix_file}: ok ({len(matrix.cells)} cells)")
    for hw, stack in findings.stacks.items():
        print(f"  hardware {hw} ({backend} backend): {stack.label}")
    for problem in findings.warnings:
        print(f"  warning: {problem}")
    for problem in findings.notes:
        print(f"  note: {problem}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _matrix_name(arg: str) -> str:
    """A matrix name from ``NAME`` or ``path/to/NAME.toml``."""
    return Path(arg).stem if arg.endswith(".toml") else arg


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.summary import write_summary

    name = _matrix_name(args.matrix)
    paths = find_run(args.results, name, args.run)
    rows, table = write_summary(paths, baseline=args.baseline)
    print(f"{paths.root}\n{table}")
    if args.plot:
        from orchestrator.plots import plot_run

        print(f"plot: {plot_run(rows, args.plot, f'{name} {paths.run_id}')}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from orchestrator.history import render_history, trends

    name = _matrix_name(args.matrix)
    runs = runs_of(args.results, name)
    if not runs:
        raise ConfigError(f"no runs of {name!r} under {args.results}", field="history")
    # only the runs shown and those the newest is compared with are read
    runs = runs[-max(args.last, args.window + 1):]
    items = trends(runs, args.window, args.threshold)
    shown_runs = runs[-max(1, args.last):]
    print(render_history(shown_runs, items))
    if args.plot:
        from orchestrator.plots import plot_history

        print(f"plot: {plot_history(shown_runs, items, args.plot, name)}")
    flagged = [t for t in items if t.regression]
    if flagged:
        print(f"\n{len(flagged)} regression(s) beyond {args.threshold:.0%} in {runs[-1].run_id}")
    return 1 if flagged and args.fail_on_regression else 0


# --- matrix (the sweep) ----------------------------------------------------------------------


class RichEvents:
    """Progress on the terminal: a bar over the cells, the running cell and its last metric."""

    def __init__(self) -> None:
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
        self.running: dict[str, str] = {}
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
        if len(self.running) == 1:
            return next(iter(self.running.values()))
        return " | ".join(f"{cid}: {last}" for cid, last in self.running.items())[:120]

    def sweep_started(self, paths: RunPaths, cells: list[Cell]) -> None:
        self.console.print(f"run folder: {paths.root}")
        self.progress.start()
        self.task = self.progress.add_task("sweep", total=len(cells), status="")

    def log(self, message: str) -> None:
        self.console.print(f"[dim]{message}[/dim]", highlight=False)

    def cell_started(self, cell: Cell, allocation: Allocation) -> None:
        with self._lock:
            self.running[cell.id] = "starting"
            where = f" on {allocation.host}" if allocation.host else ""
            gpus = f" GPUs {list(allocation.gpu_ids)}" if allocation.gpu_ids else ""
            self.progress.update(self._task, description=f"{cell.id}{where}{gpus}",
                                 status=self._status())

    def cell_output(self, cell_id: str, line: str) -> None:
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
        with self._lock:
            self.running.pop(cell.id, None)
            mark = "[green]ok[/green]" if result.status is Status.OK else \
                f"[red]{result.status.value}[/red]"
            from orchestrator.summary import throughput_key

            ips = result.metrics.get(throughput_key(cell.params.mode))
            detail = f"{ips:,.1f} images/s" if isinstance(ips, int | float) else result.reason
            took = f" ({result.duration_s:.1f} s)" if result.duration_s else ""
            self.console.print(f"{mark} {cell.id}{took}: {detail}", highlight=False)
            self.progress.advance(self._task)
            self.progress.update(self._task, status=self._status())


def cmd_matrix(args: argparse.Namespace) -> int:
    from orchestrator.sweep import backend_for, run_sweep

    matrix = _load(args)
    if args.dry_run:
        backend = backend_for(matrix, args.backend)
        print("\n".join(plan_lines(matrix)))
        if backend in ("docker", "ssh"):
            from orchestrator.build import plan_images

            for hw, plan in plan_images(matrix, list(matrix.cells), backend).items():
                print(f"image for {hw}: {plan.tag} (template {plan.template}, "
                      f"base {plan.base_image})")
        print(f"dry run: would run {len(matrix.cells)} cells with backend "
              f"{backend} into {args.results}/{matrix.name}/<run id>/")
        return 0
    cancel = threading.Event()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with RichEvents() as events:
            outcome = run_sweep(matrix, backend_name=args.backend, results_root=args.results,
                                events=events, cancel=cancel, hosts_file=args.hosts,
                                resume=args.resume)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(outcome.table)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(outcome.counts.items()))
    print(f"\n{len(outcome.results)} cells: {counts}")
    print(f"results: {outcome.paths.root}")
    if outcome.interrupted:
        print("interrupted: cells that did not finish are recorded as cancelled",
              file=sys.stderr)
    elif not outcome.ok:
        failed = [r for r in outcome.results if r.status is not Status.OK]
        for r in failed:
            print(f"  {r.cell_id}: {r.status.value}: {r.reason}", file=sys.stderr)
    return outcome.exit_code


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt

