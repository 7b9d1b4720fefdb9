"""``orchestrate matrix | plan | validate | schema``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.matrix import Cell, Matrix, filter_cells, load_matrix
from orchestrator.results import CellResult, RunPaths, Status, parse_metric_lines

if TYPE_CHECKING:
    from orchestrator.backends.base import Allocation

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

    p = sub.add_parser("validate", help="check a matrix file; exit 2 listing every problem")
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("schema", help="print the JSON Schema of matrix files (for editors)")
    p.set_defaults(handler=cmd_schema)


# --- plan / validate / schema ----------------------------------------------------------------


def _load(args: argparse.Namespace) -> Matrix:
    return filter_cells(load_matrix(args.matrix_file), getattr(args, "only", []))


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
    matrix = load_matrix(args.matrix_file)
    print(f"{args.matrix_file}: ok ({len(matrix.cells)} cells)")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from orchestrator.config import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


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
        self.task = None
        self.running: dict[str, str] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> RichEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.progress.stop()

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
            self.progress.update(self.task, description=f"{cell.id}{where}{gpus}",
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
            self.progress.update(self.task, status=self._status())

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
            self.progress.advance(self.task)
            self.progress.update(self.task, status=self._status())


def cmd_matrix(args: argparse.Namespace) -> int:
    from orchestrator.sweep import backend_for, run_sweep

    matrix = _load(args)
    if args.dry_run:
        backend = backend_for(matrix, args.backend)
        print("\n".join(plan_lines(matrix)))
        if backend in ("docker", "ssh"):
            from orchestrator.backends.docker import plan_images

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

