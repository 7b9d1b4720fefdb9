"""The sweep pipeline, top to bottom.

``load -> expand -> check -> filter`` (:mod:`orchestrator.plan.matrix`,
:mod:`orchestrator.backends.checks`, called by the CLI), then :func:`run_sweep`: ``refuse what
cannot run, pick the backend (one step: :func:`orchestrator.backends.checks.preflight`) -> open
run -> prepare (build images, reach hosts) -> run cells -> finish run (unrun cells recorded,
tables and plot written)``.

Each step is a plain function over plain values. Running cells (:func:`run_cells`): a cell starts
as soon as the backend can place it (:func:`place`, through
:meth:`~orchestrator.backends.base.Backend.allocate`); every cell runs in a worker thread so the
main thread stays free to notice Ctrl-C / SIGTERM, cancel what runs and record what did not; a
cell that ended is collected (:func:`collect`: its allocation goes back; a profiled cell's
profiler figures are added to its result, :func:`add_profiler_figures`) and recorded
(:func:`record`), or retried when its host was lost (a Slurm job preempted or on a failed
node too; ``[matrix] retries``), or run again when its GPU throttled and ``[matrix]
rerun_throttled`` allows (:func:`orchestrator.results.figures.rerun.should_rerun`). The folder of
the attempt that is not the cell's result goes to ``superseded/``; a retried cell's result names
its lost attempts (``lost_attempts``). Expected failures are results; one bad cell never stops
the sweep.

Every cell given to a sweep ends with exactly one result, on disk: a worker that raised or did
not stop after an interrupt gives a failed result; a result that cannot be written when its cell
ends (a full disk) is written again by :func:`finish_run`, and one that still cannot be is
counted from memory and named in :attr:`SweepOutcome.problems` (the CLI prints it, exit 1). A
results folder that cannot take a run folder at all is a ConfigError on ``--results`` (exit 2)
before anything runs.

May import: errors, config, catalog, plan, results, local, backends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import platform
import secrets
import shutil
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator import __version__
from orchestrator.backends.base import Backend, RunOptions, git_revision
from orchestrator.backends.checks import Decision, preflight
from orchestrator.config.matrix_file import WRAPPING_PROFILERS
from orchestrator.config.overrides import redact_argv
from orchestrator.config.redact import redact_toml
from orchestrator.errors import ConfigError, OrchestratorError, Problem, StopSignal
from orchestrator.local.engine import controller_id
from orchestrator.local.machine_state import load_average
from orchestrator.plan import ordering, profilers
from orchestrator.plan.controls import ControlSchedule, control_allocation, highest_numbers
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.figures.profiler_figures import figures_of_cell
from orchestrator.results.figures.rerun import should_rerun
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.folder_lock import FolderLock
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    check_results_root,
    find_run,
    lock_wait_of,
    read_json,
    write_file,
    write_json,
)
from orchestrator.results.reports.summary import GroupRow, render_table, summarize, write_summary
from orchestrator.results.reports.table_rules import table_rule

log = logging.getLogger(__name__)


class SweepEvents(Protocol):
    """What a sweep reports as it goes (the CLI renders it; tests may record it)."""

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: Mapping[str, float]) -> None: ...
    def log(self, message: str) -> None: ...
    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None:
        """A cell waits for another sweep's locks (``waited_s`` None: the wait begins; the
        message says for what and who holds it) or got them after ``waited_s`` seconds."""
    def cell_started(self, cell: Cell, allocation: Allocation) -> None: ...
    def cell_output(self, cell_id: str, line: str) -> None: ...
    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...


class NullEvents:
    """Report nothing."""

    def sweep_started(self, paths: RunPaths, cells: list[Cell],
                      expected: Mapping[str, float]) -> None: ...
    def log(self, message: str) -> None: ...
    def lock_wait(self, cell_id: str, message: str, waited_s: float | None) -> None: ...
    def cell_started(self, cell: Cell, allocation: Allocation) -> None: ...
    def cell_output(self, cell_id: str, line: str) -> None: ...
    def cell_finished(self, cell: Cell, result: CellResult) -> None: ...


@dataclass
class SweepOutcome:
    """What a sweep did: every cell's result, the table, and what could not be recorded."""

    paths: RunPaths
    results: list[CellResult]
    rows: list[GroupRow]
    table: str
    interrupted: bool = False
    #: What the sweep could not write (a result, the summary, run.json), one line each: the
    #: results concerned are still counted, and the exit status is not 0.
    problems: list[str] = field(default_factory=list)
    #: This machine's load averages (1, 5, 15 minutes) when the run started and ended
    #: (run.json's ``load``): what else shared the machine while the cells measured.
    load: dict[str, Any] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        """How many cells (configurations; control measurements apart) ended in each status."""
        return dict(Counter(r.status.value for r in self.results if r.role != "control"))

    @property
    def control_counts(self) -> dict[str, int]:
        """How many control measurements ended in each status (empty: no control)."""
        return dict(Counter(r.status.value for r in self.results if r.role == "control"))

    @property
    def ok(self) -> bool:
        """Every cell ended ok and everything was recorded."""
        return (not self.interrupted and not self.problems
                and all(r.status is Status.OK for r in self.results))

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 0 if self.ok else 1


def plan_json(matrix: Matrix, backend: str) -> dict[str, Any]:
    """plan.json: the configurations (``cells``, role ``config``) and, with a ``[control]``,
    the control's templates (role ``control``) and its rule; the sweep adds the order it ran
    the cells in (``order``)."""
    out: dict[str, Any] = {
        "matrix": matrix.name,
        "source": str(matrix.path),
        "backend": backend,
        "repeats": matrix.settings.repeats,
        "varying": list(matrix.varying),
        "baseline": matrix.settings.baseline,
        "table_rule": matrix.settings.table_rule,
        "cells": [c.to_json() for c in matrix.cells],
    }
    if matrix.selection:  # history tells a configuration left out by --only from a removed one
        out["only"] = list(matrix.selection)
    if matrix.excluded:  # ... or by --exclude
        out["exclude"] = list(matrix.excluded)
    if matrix.overrides:  # the fields --set changed (secrets masked): a --resume compares them
        out["set"] = [o.shown for o in matrix.overrides]
    if matrix.controls:
        out["control"] = {
            "every": matrix.control_every,
            "rule": CONTROL_RULE.format(every=matrix.control_every),
            "cells": [c.to_json() for c in matrix.controls.values()],
        }
    return out


def selection_record(matrix: Matrix) -> dict[str, list[str]]:
    """What run.json records of the options that made ``matrix`` from its file: ``set`` (the
    ``--set`` overrides, secrets masked), ``only`` and ``exclude``; each only when given."""
    found = {"set": [o.shown for o in matrix.overrides], "only": list(matrix.selection),
             "exclude": list(matrix.excluded)}
    return {key: values for key, values in found.items() if values}


#: How the sweep interleaves the control, in words (plan.json's ``control.rule``).
CONTROL_RULE = ("on each host/GPU set a configuration cell runs on: one control measurement "
                "before its first cell, one after every {every} cells and one after the last; "
                "in the cell's own allocation (same host, its first GPUs)")


def run_sweep(
    matrix: Matrix,
    *,
    decision: Decision | None = None,
    backend_name: str | None = None,
    results_root: Path = Path("results"),
    events: SweepEvents | None = None,
    cancel: threading.Event | None = None,
    hosts_file: Path | None = None,
    resume: str | None = None,
    lock_timeout_s: float | None = None,
    order_seed: int | None = None,
) -> SweepOutcome:
    """Run every cell of ``matrix`` and write the run folder. Returns the outcome.

    ``decision``: the one decision (:func:`orchestrator.backends.checks.preflight`: the
    backend, the hosts inventory it reads) the caller took already, for ``matrix`` or the whole
    matrix it was filtered from (the CLI's); None: taken here, for ``backend_name``
    (``--backend``; None: ``[matrix] backend``) and ``hosts_file`` (``--hosts``).

    ``order_seed``: the seed of the cells' random order (:mod:`orchestrator.plan.ordering`;
    None: a fresh one, recorded in plan.json and run.json). ``--resume`` keeps the order the
    run recorded.

    ``resume``: a run id, or ``""`` for the newest run of the matrix: run again, in that run's
    folder, only the cells that did not end ok (the matrix must not have changed since).
    ``lock_timeout_s``: how long a cell waits for GPUs another sweep holds (None: as long as it
    takes; :mod:`orchestrator.local.locks`).

    The steps: refuse what cannot run and pick the backend
    (:func:`orchestrator.backends.checks.preflight`) -> open the run -> prepare the backend ->
    run the cells -> finish the run (unrun cells recorded, tables and plot written).
    """
    events = events or NullEvents()
    stop = cancel if cancel is not None else StopFlag()
    held, unwinding = ((stop.held, stop.unwinding) if isinstance(stop, StopFlag)
                       else (contextlib.nullcontext, contextlib.nullcontext))
    decision = decision or preflight(matrix, backend_name, hosts_file=hosts_file)  # no folder yet
    check_run(matrix, results_root, resume)
    warm_plots()  # matplotlib's import overlaps the cells: the plot at the end takes ~0.06 s
    name, cls = decision.backend, decision.cls
    with held():
        run = open_run(matrix, name, results_root, resume)
    try:  # the run folder is locked until its run.json is finished (or the sweep failed)
        with held():
            run = expect_durations(run, results_root)
        options = RunOptions(
            timeout_s=matrix.settings.timeout_s,
            output_hook=events.cell_output,
            cancel=stop,
            hosts_file=decision.hosts_file,
            lock_timeout_s=lock_timeout_s,
            on_log=events.log,
            on_lock_wait=events.lock_wait,
        )
        try:
            with unwinding():  # image builds, hosts reached: only an exception stops them
                backend = prepare_backend(cls, matrix, run, options, events)
        except KeyboardInterrupt:
            with held():
                if run.new:  # nothing ran: no run is left (prepare_backend may have removed it)
                    discard_new_run(run)
                    raise
                # a resumed run: its cells to run again are recorded cancelled
                return finish_run(matrix, run, [], interrupted=True)
        with held():  # from here the flag alone stops the sweep: nothing unwinds it
            try:
                order_run(run, order_seed, parallel=can_run_several(backend, run.cells))
            except BaseException:
                backend.close()
                raise
            events.sweep_started(run.paths, run.cells, run.expected)
            controls = ControlSchedule.of(matrix.controls, matrix.control_every,
                                          highest_numbers(run.existing, matrix.controls))
            results, interrupted = run_all(backend, run.cells, events,
                                           retries=matrix.settings.retries, controls=controls)
            return finish_run(matrix, run, results, interrupted)
    finally:
        run.release()


class StopFlag(threading.Event):
    """A sweep's stop request (the ``cancel`` flag every cell's watcher looks at), and whether
    a stop may also unwind the main thread now.

    A stop signal (the CLI's handler calls :meth:`stop`) sets the flag. Only before the run
    folder exists and while the backend prepares (:meth:`unwinding`: image builds and hosts
    reached, which only an exception stops) may it also raise
    :class:`~orchestrator.errors.StopSignal` (a KeyboardInterrupt), and only the first stop
    does. Everywhere else (:meth:`held`: the run folder opened, cells started,
    settled and recorded, the run finished) the flag alone stops the sweep, which looks at it
    where it waits: a second or third signal, at any moment, can no longer cut the recording
    short (a lost cell, a ``run.json`` left unfinished). A caller that passes a plain Event
    as ``cancel`` keeps Python's own rule (Ctrl-C raises wherever the main thread is)."""

    def __init__(self) -> None:
        super().__init__()
        self.unwinds = True
        #: The first stop signal (None: stopped by :meth:`set`, or not stopped).
        self.signum: int | None = None

    def stop(self, signum: int) -> None:
        """A stop signal arrived: set the flag; raise KeyboardInterrupt if it is the first and
        the sweep may unwind now."""
        first = self.signum is None and not self.is_set()
        if self.signum is None:
            self.signum = signum
        self.set()
        if first and self.unwinds:
            raise StopSignal

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """No stop unwinds the body (the flag is set, and looked at)."""
        before, self.unwinds = self.unwinds, False
        try:
            yield
        finally:
            self.unwinds = before

    @contextlib.contextmanager
    def unwinding(self) -> Iterator[None]:
        """The first stop unwinds the body (KeyboardInterrupt at once if it came already)."""
        before, self.unwinds = self.unwinds, True
        try:
            if self.is_set():
                raise StopSignal
            yield
        finally:
            self.unwinds = before


@dataclass
class OpenRun:
    """A run folder a sweep works in: its paths, the cells to run now, run.json's content."""

    paths: RunPaths
    cells: list[Cell]
    meta: dict[str, Any]
    #: Created by this sweep (removed again when the sweep fails before any cell ran).
    new: bool
    #: Seconds each configuration (content hash) took in earlier runs of the matrix (median).
    expected: dict[str, float] = field(default_factory=dict)
    #: Ids of the cells the run folder already has (a resumed run; control numbers go on).
    existing: list[str] = field(default_factory=list)
    #: The run folder's lock (:func:`lock_run`), held while the sweep works in it.
    lock: FolderLock | None = None

    def release(self) -> None:
        """Let go of the run folder's lock."""
        if self.lock is not None:
            self.lock.release()


#: How long a sweep waits for the results index another process is writing (it only wants
#: the expected durations; the index's own default is 30 s).
INDEX_WAIT_S = 2.0


def expect_durations(run: OpenRun, results_root: Path) -> OpenRun:
    """The durations of earlier runs of the matrix from the results store (none when it cannot
    tell: a sweep never stops for that): the order's duration classes and the ETA."""
    from orchestrator.results.folders.store import open_store

    name = run.meta.get("matrix")
    try:
        with open_store(results_root, [name] if isinstance(name, str) else None,
                        busy_timeout_s=INDEX_WAIT_S) as store:
            run.expected = store.expected_durations(str(name))
    except Exception as exc:  # an unreadable index costs the order, never the sweep
        log.warning("no expected durations from the results store (%s): plan order", exc)
        run.expected = {}
    return run


def can_run_several(backend: Backend, cells: list[Cell], tries: int = 64) -> bool:
    """Whether the backend could run two of ``cells`` at once (it hands out a second
    allocation while holding a first): what makes the order change the sweep's length. Every
    allocation taken here is given back."""
    taken: list[tuple[Cell, Allocation]] = []
    try:
        for cell in cells[:tries]:
            allocation = backend.allocate(cell)
            if allocation is not None:
                taken.append((cell, allocation))
                if len(taken) == 2:
                    return True
        return False
    finally:
        for cell, allocation in reversed(taken):
            backend.release(cell, allocation)


def order_run(run: OpenRun, seed: int | None, parallel: bool) -> None:
    """The run's cells in the order to try them (:func:`~orchestrator.plan.ordering.order_cells`:
    rounds of repeats, each shuffled by the run's seed; longest expected first when
    ``parallel``), recorded in plan.json (``order``) and run.json (``order_seed``). A resumed
    run keeps the order it recorded. Recording fails only with a warning: the order is
    still used."""
    plan = run.paths.plan_data()
    recorded = plan.get("order") if plan is not None else None
    if not run.new and isinstance(recorded, dict) and isinstance(recorded.get("cells"), list):
        run.cells = ordering.recorded_order(run.cells, [str(c) for c in recorded["cells"]])
        return
    if seed is None:
        seed = secrets.randbelow(2**32)
    run.cells = ordering.order_cells(run.cells, run.expected, seed, parallel)
    run.meta["order_seed"] = seed
    if plan is None:
        return
    plan["order"] = {"seed": seed, "parallel": parallel, "rule": ordering.RULE,
                     "cells": [c.id for c in run.cells]}
    try:
        write_json(run.paths.plan, plan)
        write_json(run.paths.run_meta, run.meta)
    except OSError as exc:
        log.warning("the cells' order was not recorded: %s", _os_error(exc))


def open_run(matrix: Matrix, backend: str, results_root: Path, resume: str | None) -> OpenRun:
    """A new run folder with the matrix, plan and run.json; or, with ``resume``, the folder of an
    earlier run with the cells that did not end ok (their old files archived).

    A results folder that cannot be written (read-only, full, a file, no permission) is a
    ConfigError on ``--results`` saying why (as :meth:`RunPaths.create` reports one it cannot
    make the folder in); a new run's partial folder is removed.
    """
    if resume is not None:
        return _reopen_run(matrix, backend, results_root, resume)
    root = Path(results_root) / matrix.name
    paths: RunPaths | None = None
    lock: FolderLock | None = None
    try:
        paths = RunPaths.create(results_root, matrix.name)
        lock = lock_run(paths)  # before plan.json: a --resume of the newest run waits its turn
        write_file(paths.matrix_file, redact_toml(matrix.source_text))
        write_json(paths.plan, plan_json(matrix, backend))
        meta: dict[str, Any] = {
            "run_id": paths.run_id, "matrix": matrix.name, "backend": backend,
            "started_at": time.time(), "finished_at": None,
            "orchestrate_version": __version__, "git_revision": git_revision(),
            "python": sys.version.split()[0], "controller_host": platform.node(),
            "controller": controller_id(), "argv": redact_argv(sys.argv),
            "load": {"start": load_average()},
        }
        meta.update(selection_record(matrix))
        write_json(paths.run_meta, meta)
    except OSError as exc:
        if lock is not None:
            lock.release()
        if paths is not None:
            shutil.rmtree(paths.root, ignore_errors=True)
            with contextlib.suppress(OSError):
                root.rmdir()  # the matrix's folder, when this run was its first
        raise _unwritable(results_root, f"cannot write the run folder under {root}: "
                          f"{_os_error(exc)}; choose a writable folder") from None
    return OpenRun(paths, list(matrix.cells), meta, new=True, lock=lock)


def check_run(matrix: Matrix, results_root: Path, resume: str | None) -> RunPaths | None:
    """What a sweep refuses of its own run before it opens a run folder, decided without
    writing anything (``matrix --dry-run`` takes the same decision): the results folder is a
    folder; with ``resume`` (a run id, ``""``: the newest), the run is found, no other sweep
    works in it, its run.json is readable, and the matrix's cells are the ones it planned.
    Returns the run to resume (None: a new run). ConfigError otherwise, naming the option."""
    check_results_root(results_root)
    if resume is None:
        return None
    try:
        paths = find_run(results_root, matrix.name, resume or None)
    except ConfigError as exc:  # said of the option that asked for it
        raise ConfigError([Problem(p.file, "--resume", p.message) for p in exc.problems]
                          ) from None
    holder = folder_lock.holder(paths.lock)
    if holder is not None:
        raise _in_use(paths, holder)
    _run_meta(paths)
    resume_selection(paths, matrix)
    return paths


def _in_use(paths: RunPaths, holder: str) -> ConfigError:
    return ConfigError(
        f"run {paths.run_id} is in use by another sweep ({holder}); wait for it to end "
        "(or stop it: Ctrl-C / kill PID, then --resume)", field="--resume")


def _run_meta(paths: RunPaths) -> dict[str, Any]:
    """A run's run.json, which a resume adds to (damaged: a ConfigError naming it)."""
    meta = read_json(paths.run_meta)
    if not isinstance(meta, dict):
        raise ConfigError("not a JSON object; the file is damaged", file=str(paths.run_meta))
    return meta


def lock_run(paths: RunPaths) -> FolderLock:
    """The run folder's lock (``<run>/.lock``), held by the one sweep working in it: a second
    ``--resume`` of a run that a sweep (or another resume) still works in is refused, naming
    the holder, before it touches anything (it would archive the running cells' folders,
    stop their processes and run every remaining cell twice)."""
    try:
        return folder_lock.acquire(paths.lock)
    except folder_lock.LockHeld as exc:
        raise _in_use(paths, exc.holder) from None


def _reopen_run(matrix: Matrix, backend: str, results_root: Path, resume: str) -> OpenRun:
    """``--resume``: an earlier run's folder and the cells of it that did not end ok."""
    paths = find_run(results_root, matrix.name, resume or None)
    try:
        lock = lock_run(paths)
    except OSError as exc:
        raise _unwritable(results_root, f"cannot resume run {paths.run_id} in {paths.root}: "
                          f"{_os_error(exc)}") from None
    try:
        cells_dir = paths.cells_dir
        existing = sorted(e.name for e in cells_dir.iterdir() if e.is_dir()) if (
            cells_dir.is_dir()) else []
        meta = _run_meta(paths)
        cells = cells_to_resume(paths, matrix)
        meta.setdefault("resumed", []).append(
            {"at": time.time(), "cells": len(cells), "argv": redact_argv(sys.argv),
             "backend": backend, "controller": controller_id(), "load": load_average(),
             **selection_record(matrix)})
        write_json(paths.run_meta, meta)
    except OSError as exc:
        lock.release()
        raise _unwritable(results_root, f"cannot resume run {paths.run_id} in {paths.root}: "
                          f"{_os_error(exc)}") from None
    except BaseException:
        lock.release()
        raise
    return OpenRun(paths, cells, meta, new=False, lock=lock, existing=existing)


def _unwritable(results_root: Path, message: str) -> ConfigError:
    return ConfigError([Problem("--results", str(results_root), message)])


def _os_error(exc: OSError) -> str:
    """An OSError in words: ``No space left on device (/results/x/plan.json)``."""
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def prepare_backend(cls: type[Backend], matrix: Matrix, run: OpenRun, options: RunOptions,
                    events: SweepEvents) -> Backend:
    """The backend, prepared for the run's cells (images built, hosts reached).

    If that fails (bad inventory, failed image build, Ctrl-C during a build) nothing ran: the
    backend is closed and a new run's folder removed (it would only be an empty run in
    ``history``), then the error goes on.
    """
    backend: Backend | None = None
    try:
        backend = cls(matrix, run.paths, options)
        if run.cells:
            controls = [t for t in matrix.controls.values()
                        if any(c.hardware == t.hardware for c in run.cells)]
            backend.prepare(run.cells + controls, on_log=events.log)
    except BaseException:
        if backend is not None:
            backend.close()
        if run.new:
            discard_new_run(run)
        raise
    return backend


def discard_new_run(run: OpenRun) -> None:
    """Remove the folder of a new run in which no cell ran (and the matrix's folder, if this
    run made it): it would only be an empty, unfinished run in ``history``."""
    shutil.rmtree(run.paths.root, ignore_errors=True)
    with contextlib.suppress(OSError):
        run.paths.matrix_dir.rmdir()


def run_all(backend: Backend, cells: list[Cell], events: SweepEvents, retries: int = 0,
            controls: ControlSchedule | None = None) -> tuple[list[CellResult], bool]:
    """Run the cells (:func:`run_cells`), then close the backend whatever happened.

    Returns the results and whether the sweep was interrupted (Ctrl-C, SIGTERM, the cancel flag).
    """
    interrupted = False
    try:
        results = run_cells(backend, cells, events, retries=retries, controls=controls)
    except KeyboardInterrupt:
        backend.options.cancel.set()
        interrupted = True
        results = []
    finally:
        backend.close()
    return results, interrupted or backend.options.cancel.is_set()


def finish_run(matrix: Matrix, run: OpenRun, results: list[CellResult], interrupted: bool
               ) -> SweepOutcome:
    """Record the cells that never ran, write the tables from what is on disk, close run.json
    with the counts, and draw the plot: every file of the run is there when this returns.

    Every result of this sweep is on disk when this returns, or named in the outcome's
    ``problems``: a result that could not be written when its cell ended (a full disk) is
    written again here, and one that still cannot be written is counted from memory.
    """
    paths = run.paths
    problems: list[str] = []
    results = results + _unrun(paths, run.cells, results)
    on_disk = paths.results()
    recorded = {r.cell_id for r in on_disk}
    saved, unsaved = False, []
    for result in results:
        if result.cell_id in recorded:
            continue
        error = save_result(paths, result)
        if error:
            problems.append(f"cell {result.cell_id} ({result.status.value}): its result could "
                            f"not be written: {error}")
            unsaved.append(result)
        else:
            saved = True
    # every cell of the run, earlier attempts' included (read again only if this wrote some)
    every = (paths.results() if saved else on_disk) + unsaved
    try:
        rows, table = write_summary(paths, results=every)
    except OSError as exc:
        problems.append(f"summary.csv / summary.txt not written: {_os_error(exc)}")
        rows = summarize(every, table_rule(matrix.settings.table_rule))
        table = render_table(rows, list(matrix.varying), baseline=matrix.settings.baseline,
                             results=every)
    outcome = SweepOutcome(paths, every, rows, table, interrupted, problems)
    load = run.meta.get("load")
    run.meta["load"] = {**(load if isinstance(load, dict) else {}), "end": load_average()}
    outcome.load = run.meta["load"]
    run.meta.update(finished_at=time.time(), counts=outcome.counts, interrupted=interrupted,
                    lock_wait_s=lock_wait_of(r.to_json() for r in every))
    if outcome.control_counts:
        run.meta["control_counts"] = outcome.control_counts
    if problems:
        run.meta["problems"] = problems
    try:
        write_json(paths.run_meta, run.meta)
    except OSError as exc:
        problems.append(f"run.json not written: {_os_error(exc)}")
    _plot_if_possible(paths, rows, matrix.name)
    return outcome


def save_result(paths: RunPaths, result: CellResult) -> str | None:
    """Write a cell's result.json; the error in words when it cannot be written, else None."""
    try:
        write_json(paths.cell_result(result.cell_id), result.to_json())
    except OSError as exc:
        return _os_error(exc)
    return None


def warm_plots() -> None:
    """Import matplotlib (the ``plots`` extra) in a thread of its own while the cells run:
    its import costs about 0.3-0.5 s of CPU, the summary plot itself about 0.06 s, and the
    plot is drawn before the sweep returns (:func:`_plot_if_possible`; an import not done by
    then is waited for by Python's import lock). Nothing where matplotlib is not installed."""
    if importlib.util.find_spec("matplotlib") is None:
        return
    from orchestrator.results.reports import plots

    threading.Thread(target=plots.warm, name="import-matplotlib", daemon=True).start()


def _plot_if_possible(paths: RunPaths, rows: list[GroupRow], name: str) -> None:
    """summary.png in the run folder when matplotlib is installed (the ``plots`` extra), drawn
    last, from the results on disk (:func:`orchestrator.results.reports.plots.draw_summary`);
    a plot that cannot be drawn costs the run nothing but a warning."""
    if importlib.util.find_spec("matplotlib") is None or not any(r.ips for r in rows):
        return
    from orchestrator.results.reports.plots import draw_summary

    try:
        draw_summary(paths.root, f"{name} {paths.run_id}")
    except Exception as exc:  # a plot must never cost the results
        log.warning("summary.png not drawn: %s", exc)


def cells_to_resume(paths: RunPaths, matrix: Matrix) -> list[Cell]:
    """The cells of ``matrix`` that did not end ok in run ``paths`` (:func:`resume_selection`);
    their old files archived."""
    todo = resume_selection(paths, matrix)
    for cell in todo:
        cell_dir = paths.cell_dir(cell.id)
        if cell_dir.exists():
            archive = paths.superseded(cell.id)
            cell_dir.rename(archive)
    return todo


def resume_selection(paths: RunPaths, matrix: Matrix) -> list[Cell]:
    """The cells of ``matrix`` that did not end ok in run ``paths``; only reads.

    A result that cannot be read (a crash mid-write on an old version, a damaged disk) did not
    end ok. Refuses (ConfigError) when the matrix no longer matches the run's plan: resuming
    would mix numbers from two different experiments in one table.
    """
    try:
        plan = read_json(paths.plan)
        planned = {c["id"]: c["hash"] for c in plan["cells"]}
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as exc:
        raise ConfigError(f"the plan of run {paths.run_id} cannot be read ({exc}); start a new "
                          "run instead of --resume", file=str(paths.plan)) from None
    changed = [c.id for c in matrix.cells if c.id in planned and planned[c.id] != c.hash]
    unplanned = [c.id for c in matrix.cells if c.id not in planned]
    if unplanned and not changed:  # the same matrix, a wider selection than the run had
        raise ConfigError(
            f"{len(unplanned)} of the selected cells are not in run {paths.run_id} (e.g. "
            f"{unplanned[0]}): it ran fewer cells; resume with the options it ran with "
            f"({_ran_with(plan, ('only', 'exclude'))}), or start a new run",
            field="--resume")
    changed += unplanned
    if changed:
        ran = [o.shown for o in matrix.overrides]
        sets = (f"; it ran with {_ran_with(plan, ('set',))}, this sweep with "
                f"{' '.join(f'--set {o}' for o in ran) or 'no --set'}"
                if plan.get("set", []) != ran else "")
        raise ConfigError(
            f"the matrix changed since run {paths.run_id} ({len(changed)} cells differ, e.g. "
            f"{changed[0]}{sets}); start a new run instead of --resume", file=str(matrix.path))
    return [cell for cell in matrix.cells if not _ended_ok(paths.cell_result(cell.id))]


def _ran_with(plan: dict[str, Any], keys: tuple[str, ...]) -> str:
    """``--set A --only B``: the options of a run's plan.json among ``keys`` (``set``,
    ``only``, ``exclude``), or ``no --set`` where it had none."""
    given = [f"--{key} {value}" for key in keys for value in plan.get(key) or []
             if isinstance(value, str)]
    return " ".join(given) or f"no {' or '.join(f'--{k}' for k in keys)}"


def _ended_ok(result: Path) -> bool:
    """Whether ``result`` is a readable result.json saying ok."""
    if not result.exists():
        return False
    try:
        data = read_json(result)
    except ConfigError as exc:
        log.warning("%s cannot be read (%s): the cell runs again", result, exc)
        return False
    return isinstance(data, dict) and data.get("status") == Status.OK.value


@dataclass(frozen=True)
class Attempt:
    """One try of a cell: the first, a retry after its host was lost, or a re-run after it
    throttled (``reruns`` of them so far). ``lost``: the earlier tries whose host was lost
    (what the cell's result records of them)."""

    cell: Cell
    number: int = 1
    reruns: int = 0
    lost: tuple[dict[str, Any], ...] = ()

    def retry(self, lost: dict[str, Any] | None = None) -> Attempt:
        """The next try of the same cell, after the try ``lost`` (its host was lost)."""
        return Attempt(self.cell, self.number + 1, self.reruns,
                       self.lost + ((lost,) if lost else ()))

    def rerun(self) -> Attempt:
        """The next try after a throttled one."""
        return Attempt(self.cell, self.number + 1, self.reruns + 1, self.lost)

    def record(self, result: CellResult) -> CellResult:
        """``result`` with the tries before it whose host was lost (``lost_attempts`` in its
        provenance: each one's number, reason and where its folder was kept)."""
        if self.lost:
            result.provenance["lost_attempts"] = [dict(entry) for entry in self.lost]
        return result


@dataclass(frozen=True)
class Running:
    """An attempt that was started on ``allocation``.

    ``held`` is the allocation a configuration cell was given (``owner``) and that goes back
    when this attempt ends, unless ``then`` (the configuration attempt a control measurement
    runs before) starts on it next; a control measurement runs inside its owner's allocation
    (:mod:`orchestrator.plan.controls`)."""

    attempt: Attempt
    allocation: Allocation
    held: Allocation
    owner: Cell
    then: Attempt | None = None


#: After an interrupt, how long the sweep waits for a running cell to stop and report.
CANCEL_WAIT_S = 60.0


def run_cells(
    backend: Backend, cells: list[Cell], events: SweepEvents, retries: int = 0,
    controls: ControlSchedule | None = None,
) -> list[CellResult]:
    """Start each cell as soon as the backend can place it; collect and record every result.

    The steps: cells that can never run here are recorded unplaceable; then, whenever a cell
    ends (and at the start), :func:`place` the pending ones, run each placed one in a worker
    thread (:meth:`~orchestrator.backends.base.Backend.run_cell`), and :func:`collect` each one
    that ended: its allocation goes back, and a cell whose host was lost runs again (up to
    ``retries`` times; the lost attempt's folder kept under ``superseded/`` and named in the
    result's ``lost_attempts``) while one that ended otherwise is recorded (:func:`record`:
    written to disk, reported). Cancelled: the running cells see the flag, stop their workload
    and report; one that does not report within :data:`CANCEL_WAIT_S` is recorded failed and
    left behind.

    ``controls``: the matrix's control measurements (:class:`ControlSchedule`), each run in a
    configuration cell's allocation before or after it (the cell's host and GPUs) and recorded
    as a control result.

    Every cell given ends with exactly one recorded result, whatever happened to it.
    """
    loop = CellLoop(backend, events, retries, controls)
    loop.record_unplaceable(cells)
    try:
        loop.run()
    except KeyboardInterrupt:
        backend.options.cancel.set()
    loop.collect_cancelled()
    return loop.results


@dataclass
class CellLoop:
    """The state of :func:`run_cells` and its steps, one method each: the attempts waiting for
    a place (``pending``), those running (``running``, by their worker's future) and the
    results recorded so far (``results``)."""

    backend: Backend
    events: SweepEvents
    retries: int = 0
    controls: ControlSchedule | None = None
    results: list[CellResult] = field(default_factory=list)
    pending: deque[Attempt] = field(default_factory=deque)
    running: dict[Future[CellResult], Running] = field(default_factory=dict)

    @property
    def cancel(self) -> threading.Event:
        return self.backend.options.cancel

    def record_unplaceable(self, cells: list[Cell]) -> None:
        """Cells that can never run on the backend are recorded unplaceable; the others wait
        for a place, in order."""
        for cell in cells:
            reason = self.backend.unplaceable(cell)
            if reason:
                self.done(Attempt(cell), unplaceable_result(Attempt(cell), reason))
            else:
                self.pending.append(Attempt(cell))

    def run(self) -> None:
        """Until every attempt has ended or the sweep is cancelled: place the pending attempts
        (at the start, and whenever a cell ended: GPUs and hosts free up only then), wait for
        a running one to end, settle each that did."""
        changed = True
        while (self.pending or self.running) and not self.cancel.is_set():
            if changed:
                self.place_pending()
            if not self.running:
                if not self.pending:
                    break  # the rest became unplaceable
                raise RuntimeError("no cell can start and none is running")  # a bug
            finished, _ = wait(list(self.running), timeout=0.5, return_when=FIRST_COMPLETED)
            changed = bool(finished)
            for fut in finished:
                started = self.running.pop(fut)
                self.settle(started, _result_of(fut, started.attempt))

    def place_pending(self) -> None:
        """Start every pending attempt the backend can place now (:func:`place`); record those
        that can no longer run anywhere."""
        for attempt, decision in place(self.backend, self.pending):
            if isinstance(decision, str):
                self.done(attempt, unplaceable_result(attempt, decision))
            else:
                self.launch(attempt, decision)

    def launch(self, attempt: Attempt, allocation: Allocation) -> None:
        """Start ``attempt`` on ``allocation``, after a control measurement there when the
        schedule wants one first."""
        control = self.controls.before(attempt.cell, allocation) if self.controls else None
        if control is not None:
            self.control_on(attempt.cell, allocation, control, attempt)
        else:
            self.start(attempt, allocation, allocation, attempt.cell)

    def control_on(self, cell: Cell, held: Allocation, control: Cell,
                   then: Attempt | None) -> None:
        """Run ``control`` in ``cell``'s allocation ``held`` (then ``then``, if any)."""
        self.start(Attempt(control), control_allocation(control, held), held, cell, then)

    def start(self, attempt: Attempt, allocation: Allocation, held: Allocation, owner: Cell,
              then: Attempt | None = None) -> None:
        """Run ``attempt`` in a worker thread (:meth:`~orchestrator.backends.base.Backend.
        run_cell`)."""
        self.events.cell_started(attempt.cell, allocation)
        fut = _in_worker(f"cell-{attempt.cell.id}", self.backend.run_cell, attempt.cell,
                         allocation, attempt.number)
        self.running[fut] = Running(attempt, allocation, held, owner, then)

    def settle(self, started: Running, result: CellResult) -> None:
        """An attempt ended with ``result``: a control measurement's next step; else the
        profiler's figures added, then run again (throttled), retried (host lost) or recorded,
        and its allocation used for a control measurement or given back."""
        if started.attempt.cell.is_control:
            self.after_control(started, result)
            return
        add_profiler_figures(self.backend, started.attempt.cell, result)
        if self.rerun_throttled(started, result) or self.retry_lost(started, result):
            return
        self.done(started.attempt, result)
        self.after_cell(started, result)

    def after_control(self, started: Running, result: CellResult) -> None:
        """A control measurement ended: recorded; the configuration attempt it ran before
        starts in the same allocation, or the allocation goes back (and that attempt waits for
        another, when the host went away under the control)."""
        self.done(started.attempt, result)
        follow = started.then
        if follow is not None and result.status is not Status.HOST_LOST:
            self.start(follow, started.held, started.held, started.owner)
            return
        self.backend.release(started.owner, started.held)
        if follow is not None:
            self.pending.appendleft(follow)

    def rerun_throttled(self, started: Running, result: CellResult) -> bool:
        """Whether the attempt runs again because its GPU throttled while measuring
        (:func:`~orchestrator.results.figures.rerun.should_rerun`; its folder kept aside)."""
        attempt, backend = started.attempt, self.backend
        if not should_rerun(result, backend.matrix.settings, attempt.reruns) or supersede(
                backend.paths, attempt.cell.id, "throttled") is None:
            return False
        backend.release(started.owner, started.held)
        self.events.log(f"{attempt.cell.id}: the GPU throttled while measuring; running it "
                        f"again (re-run {attempt.reruns + 1} of "
                        f"{backend.matrix.settings.rerun_throttled})")
        self.pending.append(attempt.rerun())
        return True

    def retry_lost(self, started: Running, result: CellResult) -> bool:
        """Whether the attempt is tried again because its host was lost (``retries`` times at
        most; the lost try's folder kept aside: its output never mixes with the next)."""
        attempt = started.attempt
        if result.status is not Status.HOST_LOST or attempt.number - attempt.reruns > self.retries:
            return False
        kept = supersede(self.backend.paths, attempt.cell.id, "host_lost")
        self.backend.release(started.owner, started.held)
        self.events.log(f"{attempt.cell.id}: {result.reason}; retrying "
                        f"(attempt {attempt.number + 1})")
        self.pending.appendleft(attempt.retry({
            "attempt": attempt.number, "status": result.status.value,
            "reason": result.reason, **({"folder": kept} if kept else {})}))
        return True

    def after_cell(self, started: Running, result: CellResult) -> None:
        """A configuration cell was recorded: a control measurement in its allocation when the
        schedule wants one after it, else the allocation goes back."""
        control = None
        if self.controls is not None and result.status is not Status.HOST_LOST:
            control = self.controls.after(started.attempt.cell, started.held,
                                          last=not self.pending)
        if control is not None and not self.cancel.is_set():
            self.control_on(started.attempt.cell, started.held, control, None)
        else:
            self.backend.release(started.owner, started.held)

    def collect_cancelled(self) -> None:
        """After a cancel: the running cells see the flag, stop their workload and report
        (:func:`collect`, waiting up to :data:`CANCEL_WAIT_S`)."""
        for fut, started in list(self.running.items()):
            self.done(started.attempt, collect(self.backend, fut, started, wait_s=CANCEL_WAIT_S))

    def done(self, attempt: Attempt, result: CellResult) -> None:
        """``attempt``'s last word: its result recorded (:func:`record`)."""
        self.results.append(record(self.backend.paths, attempt.cell, attempt.record(result),
                                   self.events))


def _in_worker(name: str, fn: Callable[..., CellResult], *args: Any) -> Future[CellResult]:
    """Run ``fn(*args)`` in a daemon thread of its own; its future.

    Not a thread pool: a cell that never returns (a launch stuck in a dead engine) must not keep
    the orchestrator from exiting once the sweep gave up on it.
    """
    fut: Future[CellResult] = Future()

    def work() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # handed to the collector, which records a failed cell
            fut.set_exception(exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return fut


def place(backend: Backend, pending: deque[Attempt]) -> list[tuple[Attempt, Allocation | str]]:
    """Settle, in order, every pending attempt the backend can settle now: the allocation to
    start it on, or why it can never run any more (hosts lost since the sweep began). Settled
    attempts leave ``pending``; the others wait until a cell ends."""
    settled: list[tuple[Attempt, Allocation | str]] = []
    for attempt in list(pending):
        allocation = backend.allocate(attempt.cell)
        if allocation is not None:
            settled.append((attempt, allocation))
        else:
            reason = backend.unplaceable(attempt.cell)
            if not reason:
                continue
            settled.append((attempt, reason))
        pending.remove(attempt)
    return settled


def collect(backend: Backend, fut: Future[CellResult], started: Running,
            wait_s: float | None = None) -> CellResult:
    """The result of a cell that ended (waiting up to ``wait_s``); its allocation goes back.

    A worker that raised, or that did not report within ``wait_s``, gives a failed result."""
    result = _result_of(fut, started.attempt, wait_s)
    backend.release(started.owner, started.held)
    return result


def add_profiler_figures(backend: Backend, cell: Cell, result: CellResult) -> None:
    """A cell run under nsys, ncu or nvprof: the figures of the CSV files the profiler left in
    its folder (:func:`orchestrator.results.figures.profiler_figures.figures_of_cell`) go into its
    result (``metrics``, ``provenance.profiler``) and result.json. Figures that cannot be read or
    written leave the result as it was (with a warning): the cell is still recorded."""
    tool = cell.params.profiler
    cell_dir = backend.paths.cell_dir(cell.id)
    if tool not in WRAPPING_PROFILERS or not cell_dir.is_dir():
        return
    try:
        options = profilers.options_of(backend.matrix.profile(cell), tool)
        figures = figures_of_cell(cell_dir, tool, options)
        result.metrics.update(figures.metrics)
        result.provenance["profiler"] = figures.provenance()
        if backend.paths.cell_result(cell.id).exists():  # the backend recorded the cell
            write_json(backend.paths.cell_result(cell.id), result.to_json())
    except Exception as exc:  # a damaged profile or a full disk must not lose the cell
        log.warning("%s: profiler figures not added: %s", cell.id, exc)


def supersede(paths: RunPaths, cell_id: str, why: str) -> str | None:
    """Move a cell's folder to ``superseded/<cell>-<why>-<ms>`` (an attempt that is not the
    cell's result, kept for the record). Returns that folder relative to the run ("" when the
    cell had none), or None when it cannot be moved (the attempt then stays the cell's
    result)."""
    cell_dir = paths.cell_dir(cell_id)
    try:
        if not cell_dir.exists():
            return ""
        archive = paths.superseded(cell_id, why)
        cell_dir.rename(archive)
    except OSError as exc:
        log.warning("%s: its folder cannot be moved to superseded/ (%s); keeping its result",
                    cell_id, exc)
        return None
    return str(archive.relative_to(paths.root))


def record(paths: RunPaths, cell: Cell, result: CellResult, events: SweepEvents) -> CellResult:
    """A cell's last word: its result written into its folder (again: the backend may have
    written it already) and reported. A result that cannot be written is reported here and
    written again when the run finishes (:func:`finish_run`)."""
    error = save_result(paths, result)
    if error:
        events.log(f"{cell.id}: its result could not be written ({error}); "
                   "trying again when the sweep ends")
    events.cell_finished(cell, result)
    return result


def unplaceable_result(attempt: Attempt, reason: str) -> CellResult:
    """The result of a cell that can never run: no host or GPUs for it, or (a retry) none
    left after its host was lost."""
    result = _unrun_result(attempt.cell, Status.UNPLACEABLE, reason)
    result.attempts = attempt.number - 1
    if attempt.number > 1:
        result.reason = (f"its host was lost (attempt {attempt.number - 1}) and no other can "
                         f"run it: {reason}")
    return result


def _result_of(fut: Future[CellResult], attempt: Attempt, wait_s: float | None = None
               ) -> CellResult:
    try:
        return fut.result(timeout=wait_s)
    except TimeoutError:
        reason = (f"the sweep was interrupted and the cell did not stop within {wait_s:g} s; "
                  "it was left behind (check for its processes or containers)")
    except Exception as exc:  # an error in the worker: a failed result, the sweep goes on
        reason = str(exc) if isinstance(exc, OrchestratorError) else f"{type(exc).__name__}: {exc}"
    res = _unrun_result(attempt.cell, Status.FAILED, reason)
    res.attempts = attempt.number
    return res


def _unrun_result(cell: Cell, status: Status, reason: str) -> CellResult:
    return CellResult(
        cell_id=cell.id, group=cell.group, repeat=cell.repeat, status=status, reason=reason,
        params=cell.params.model_dump(), attempts=0, config_hash=cell.hash, role=cell.role,
    )


def _unrun(paths: RunPaths, cells: list[Cell], results: list[CellResult]) -> list[CellResult]:
    """Cells that never ran (interrupted sweep) and have no result: cancelled results."""
    done = {r.cell_id for r in results}
    return [_unrun_result(cell, Status.CANCELLED, "not started: the sweep was interrupted")
            for cell in cells
            if cell.id not in done and not paths.cell_result(cell.id).exists()]
