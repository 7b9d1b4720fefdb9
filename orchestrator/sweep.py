"""The sweep pipeline, top to bottom.

``load -> expand -> filter -> pick backend -> prepare (build images) -> run cells -> summarize``

Each step is a plain function. Running cells: a cell starts as soon as the backend can place it
(:meth:`~orchestrator.backends.base.Backend.allocate`); every cell runs in a worker thread so the
main thread stays free to notice Ctrl-C / SIGTERM, cancel what runs and record what did not.
Expected failures are results; one bad cell never stops the sweep.
"""

from __future__ import annotations

import importlib.util
import logging
import platform
import shutil
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator import __version__
from orchestrator.backends import backend_class
from orchestrator.backends.base import Backend, RunOptions, git_revision
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.matrix import Cell, Matrix
from orchestrator.placement import Allocation
from orchestrator.results import CellResult, RunPaths, Status, find_run, read_json, write_json
from orchestrator.summary import GroupRow, write_summary

log = logging.getLogger("orchestrator.sweep")


class SweepEvents(Protocol):
    """What a sweep reports as it goes (the CLI renders it; tests may record it)."""

    def sweep_started(self, paths: RunPaths, cells: list[Cell]) -> None: ...
    def log(self, message: str) -> None: ...
    def cell_started(self, cell: Cell, allocation: Allocation) -> None: ...
    def cell_output(self, cell_id: str, line: str) -> None: ...
    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...


class NullEvents:
    """Report nothing."""

    def sweep_started(self, paths: RunPaths, cells: list[Cell]) -> None: ...
    def log(self, message: str) -> None: ...
    def cell_started(self, cell: Cell, allocation: Allocation) -> None: ...
    def cell_output(self, cell_id: str, line: str) -> None: ...
    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...


@dataclass
class SweepOutcome:
    paths: RunPaths
    results: list[CellResult]
    rows: list[GroupRow]
    table: str
    interrupted: bool = False

    @property
    def counts(self) -> dict[str, int]:
        """How many cells ended in each status."""
        return dict(Counter(r.status.value for r in self.results))

    @property
    def ok(self) -> bool:
        return not self.interrupted and all(r.status is Status.OK for r in self.results)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.ok else 1


def backend_for(matrix: Matrix, override: str | None) -> str:
    """The backend name: --backend, else [matrix] backend."""
    return override or matrix.settings.backend


def hosts_file_of(matrix: Matrix) -> Path | None:
    """``[matrix] hosts``, resolved against the matrix file's folder."""
    if not matrix.settings.hosts:
        return None
    return (matrix.path.parent / matrix.settings.hosts).resolve()


def plan_json(matrix: Matrix, backend: str) -> dict[str, Any]:
    return {
        "matrix": matrix.name,
        "source": str(matrix.path),
        "backend": backend,
        "repeats": matrix.settings.repeats,
        "varying": list(matrix.varying),
        "baseline": matrix.settings.baseline,
        "cells": [c.to_json() for c in matrix.cells],
    }


def run_sweep(
    matrix: Matrix,
    *,
    backend_name: str | None = None,
    results_root: Path = Path("results"),
    events: SweepEvents | None = None,
    cancel: threading.Event | None = None,
    hosts_file: Path | None = None,
    resume: str | None = None,
) -> SweepOutcome:
    """Run every cell of ``matrix`` and write the run folder. Returns the outcome.

    ``resume``: a run id, or ``""`` for the newest run of the matrix: run again, in that run's
    folder, only the cells that did not end ok (the matrix must not have changed since).
    """
    events = events or NullEvents()
    name = backend_for(matrix, backend_name)
    if backend_name:
        cls = backend_class(name)
    else:  # the name comes from the matrix file: say where
        cls = backend_class(name, file=str(matrix.path), field="matrix.backend")
    cls.check_available()
    if resume is None:
        paths = RunPaths.create(results_root, matrix.name)
        paths.matrix_file.write_text(matrix.source_text, encoding="utf-8")
        write_json(paths.plan, plan_json(matrix, name))
        cells = list(matrix.cells)
        run_meta: dict[str, Any] = {
            "run_id": paths.run_id, "matrix": matrix.name, "backend": name,
            "started_at": time.time(), "finished_at": None,
            "orchestrate_version": __version__, "git_revision": git_revision(),
            "python": sys.version.split()[0], "controller_host": platform.node(),
            "argv": sys.argv,
        }
    else:
        paths = find_run(results_root, matrix.name, resume or None)
        cells = cells_to_resume(paths, matrix)
        run_meta = read_json(paths.run_meta)
        run_meta.setdefault("resumed", []).append(
            {"at": time.time(), "cells": len(cells), "argv": sys.argv, "backend": name})
    write_json(paths.run_meta, run_meta)

    options = RunOptions(
        timeout_s=matrix.settings.timeout_s,
        output_hook=events.cell_output,
        cancel=cancel or threading.Event(),
        hosts_file=hosts_file or hosts_file_of(matrix),
    )
    backend: Backend | None = None
    try:
        backend = cls(matrix, paths, options)
        if cells:
            backend.prepare(cells, on_log=events.log)
    except BaseException:
        # Nothing ran (bad inventory, failed image build, Ctrl-C during a build): a new run's
        # folder would only be an empty run in `history`.
        if backend is not None:
            backend.close()
        if resume is None:
            shutil.rmtree(paths.root, ignore_errors=True)
        raise
    events.sweep_started(paths, cells)
    interrupted = False
    try:
        results = run_cells(backend, cells, events, retries=matrix.settings.retries)
    except KeyboardInterrupt:
        options.cancel.set()
        interrupted = True
        results = []
    finally:
        backend.close()
    interrupted = interrupted or options.cancel.is_set()
    _record_unrun(paths, cells, results)
    results = paths.results()  # every cell of the run, those of earlier attempts included
    rows, table = write_summary(paths, results=results)
    _plot_if_possible(paths, rows, matrix.name)
    outcome = SweepOutcome(paths, results, rows, table, interrupted)
    run_meta.update(finished_at=time.time(), counts=outcome.counts, interrupted=interrupted)
    write_json(paths.run_meta, run_meta)
    return outcome


def _plot_if_possible(paths: RunPaths, rows: list[GroupRow], name: str) -> None:
    """summary.png in the run folder when matplotlib is installed (the ``plots`` extra)."""
    if importlib.util.find_spec("matplotlib") is None or not any(r.ips for r in rows):
        return
    from orchestrator.plots import plot_run

    try:
        plot_run(rows, paths.root / "summary.png", f"{name} {paths.run_id}")
    except Exception as exc:  # a plot must never cost the results
        log.warning("summary.png not drawn: %s", exc)


def cells_to_resume(paths: RunPaths, matrix: Matrix) -> list[Cell]:
    """The cells of ``matrix`` that did not end ok in run ``paths``; their old files archived.

    Refuses (ConfigError) when the matrix no longer matches the run's plan: resuming would mix
    numbers from two different experiments in one table.
    """
    planned = {c["id"]: c["hash"] for c in read_json(paths.plan)["cells"]}
    changed = [c.id for c in matrix.cells if planned.get(c.id) != c.hash]
    if changed:
        raise ConfigError(
            f"the matrix changed since run {paths.run_id} ({len(changed)} cells differ, e.g. "
            f"{changed[0]}); start a new run instead of --resume", file=str(matrix.path))
    todo = []
    for cell in matrix.cells:
        result = paths.cell_result(cell.id)
        if result.exists() and read_json(result).get("status") == Status.OK.value:
            continue
        cell_dir = paths.cell_dir(cell.id)
        if cell_dir.exists():
            archive = paths.root / "superseded" / f"{cell.id}-{int(time.time() * 1000)}"
            archive.parent.mkdir(exist_ok=True)
            cell_dir.rename(archive)
        todo.append(cell)
    return todo


def run_cells(
    backend: Backend, cells: list[Cell], events: SweepEvents, retries: int = 0
) -> list[CellResult]:
    """Start each cell as soon as the backend can place it; collect every result."""
    results: list[CellResult] = []
    pending: deque[tuple[Cell, int]] = deque()

    def unplaceable(cell: Cell, attempt: int, reason: str) -> None:
        res = _unrun_result(cell, Status.UNPLACEABLE, reason)
        res.attempts = attempt - 1
        if attempt > 1:
            res.reason = (f"its host was lost (attempt {attempt - 1}) and no other can run "
                          f"it: {reason}")
        write_json(backend.paths.cell_result(cell.id), res.to_json())
        results.append(res)
        events.cell_finished(cell, res)

    for cell in cells:
        reason = backend.unplaceable(cell)
        if reason:
            unplaceable(cell, 1, reason)
        else:
            pending.append((cell, 1))
    running: dict[Future[CellResult], tuple[Cell, Allocation, int]] = {}
    cancel = backend.options.cancel

    def place(pool: ThreadPoolExecutor) -> None:
        """Start every pending cell the backend can place now."""
        for item in list(pending):
            cell, attempt = item
            allocation = backend.allocate(cell)
            if allocation is None:
                # Hosts may have been lost since the sweep began.
                reason = backend.unplaceable(cell)
                if reason:
                    pending.remove(item)
                    unplaceable(cell, attempt, reason)
                continue
            pending.remove(item)
            events.cell_started(cell, allocation)
            fut = pool.submit(backend.run_cell, cell, allocation, attempt)
            running[fut] = (cell, allocation, attempt)

    with ThreadPoolExecutor(max_workers=max(1, len(cells)), thread_name_prefix="cell") as pool:
        try:
            changed = True  # GPUs and hosts free up only when a cell ends: place only then
            while (pending or running) and not cancel.is_set():
                if changed:
                    place(pool)
                if not running:
                    if not pending:
                        break  # the rest became unplaceable
                    raise RuntimeError("no cell can start and none is running")  # a bug
                done, _ = wait(list(running), timeout=0.5, return_when=FIRST_COMPLETED)
                changed = bool(done)
                for fut in done:
                    cell, allocation, attempt = running.pop(fut)
                    backend.release(cell, allocation)
                    res = _result_of(fut, cell, attempt)
                    if res.status is Status.HOST_LOST and attempt <= retries:
                        events.log(f"{cell.id}: {res.reason}; retrying (attempt {attempt + 1})")
                        pending.appendleft((cell, attempt + 1))
                        continue
                    results.append(res)
                    events.cell_finished(cell, res)
        except KeyboardInterrupt:
            cancel.set()
        # Cancelled: running cells see the flag, kill their workload and report.
        for fut, (cell, allocation, attempt) in list(running.items()):
            res = _result_of(fut, cell, attempt, wait_s=60.0)
            backend.release(cell, allocation)
            results.append(res)
            events.cell_finished(cell, res)
    return results


def _result_of(fut: Future[CellResult], cell: Cell, attempt: int, wait_s: float | None = None
               ) -> CellResult:
    try:
        return fut.result(timeout=wait_s)
    except Exception as exc:  # an error starting the cell: a failed result, the sweep goes on
        reason = str(exc) if isinstance(exc, OrchestratorError) else f"{type(exc).__name__}: {exc}"
        res = _unrun_result(cell, Status.FAILED, reason)
        res.attempts = attempt
        return res


def _unrun_result(cell: Cell, status: Status, reason: str) -> CellResult:
    return CellResult(
        cell_id=cell.id, group=cell.group, repeat=cell.repeat, status=status, reason=reason,
        params=cell.params.model_dump(), attempts=0,
    )


def _record_unrun(paths: RunPaths, cells: list[Cell], results: list[CellResult]) -> None:
    """Cells that never ran (interrupted sweep) get a cancelled result on disk too."""
    done = {r.cell_id for r in results}
    for cell in cells:
        if cell.id not in done and not paths.cell_result(cell.id).exists():
            res = _unrun_result(cell, Status.CANCELLED, "not started: the sweep was interrupted")
            write_json(paths.cell_result(cell.id), res.to_json())
