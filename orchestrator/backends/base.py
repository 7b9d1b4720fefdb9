"""The base every backend stands on.

:class:`Backend` owns what is the same everywhere: writing the command, streaming output into the
cell's log, the per-cell timeout, cancellation, timing, and turning an outcome into a
:class:`~orchestrator.results.folders.run_folder.CellResult` (:meth:`Backend.run_cell`). A backend
fills in a few
hooks:

- :meth:`Backend.check_available` — can it run here at all (engine, sshd, Slurm)?
- :meth:`Backend.prepare` — work done once per sweep (build the images the cells need).
- :meth:`Backend.unplaceable`, :meth:`Backend.allocate`, :meth:`Backend.release` — placement:
  why a cell can never run here; the :class:`~orchestrator.plan.placement.Allocation` (hosts, GPU
  ids) of a cell that can start now; the end of that allocation. Default: one cell at a time on
  this machine.
- :meth:`Backend.spec` — the :class:`~orchestrator.plan.launch.LaunchSpec` of a cell on its
  allocation: everything :meth:`Backend.launch` needs, decided before it starts.
- :meth:`Backend.launch` — start it, returning an :class:`Execution` handle.
- :meth:`Backend.finish` — add what only the backend knows to the result (optional).
- :meth:`Backend.close` — end of the sweep: remove what is left behind.
- :attr:`Backend.records_machine` — whether the cells run on this machine, so that its state
  (load, CPU and GPU clocks: :mod:`orchestrator.local.machine_state`) at each cell's start and
  end is the cell's machine and goes into its result (``machine``): its record's ``here``
  (process and docker; the ssh and slurm backends run cells elsewhere and do not record it).

- :meth:`Backend.lock_requests` — what the cell holds against other sweeps while it runs
  (:mod:`orchestrator.local.locks`; default: this machine's GPUs of the allocation, else its CPU),
  and
  :meth:`Backend.locker` — where those locks are taken (default: this machine's lock folder).

An :class:`Execution` is the started cell: a subprocess, a container, a remote channel, a job.
How its end becomes a status (ok, failed with the reason, oom, timeout, host lost, cancelled) is
decided here, once, from its :class:`ExitInfo` and its figures of merit: when the cell has
ended, :func:`orchestrator.results.figures.figure_parsers.evaluate` reads this attempt's part of the
log and the cell
folder with the cell's parser (our workload's JSON lines, DLLogger, regex: its program's
``figures``) and judges them (a program that exits 0 without its figures, with a NaN or a
figure out of its bounds, failed). The result's provenance says which program ran
(``program``: the command template, its rendered argv, its parser) and how the figures were
read (``figures``).

:meth:`Backend.run_cell` never raises: whatever goes wrong around a cell (its folder, its
command.json or log cannot be written, the spec or the launch raises, a hook has a bug) makes it
``failed`` with the step and the error as its reason, and a started execution is stopped. The
log keeps draining when it cannot be written (a full disk), and the cell is then failed: its
numbers would have no files. The cell's secret values (:mod:`orchestrator.config.redact`) are
replaced
by ``***`` in its output before anything sees it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from orchestrator import REPO_ROOT, __version__
from orchestrator.backends.registry import find_record
from orchestrator.backends.target import HERE, Target
from orchestrator.config.redact import Scrubber, secret_env
from orchestrator.errors import (
    BackendUnavailable,
    ConfigError,
    OrchestratorError,
    Problem,
    Requirement,
)
from orchestrator.images import build
from orchestrator.images.sif import LocalMachine
from orchestrator.local import locks, machine_state
from orchestrator.local.locks import (
    FileLocker,
    HeldLocks,
    Holder,
    Locker,
    LockRequest,
    LockWaitCancelled,
)
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation, holds_local_gpus
from orchestrator.plan.selection import ImageKey
from orchestrator.results.figures.figure_parsers import CellOutput, evaluate
from orchestrator.results.folders import safejson
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    make_folder,
    open_stream,
    replacing,
    write_json,
)
from orchestrator.runtimes import apptainer

log = logging.getLogger(__name__)


#: Called with (cell id, one line of its output) as the cell runs (progress display).
OutputHook = Callable[[str, str], None]


@dataclass
class ExitInfo:
    """How an execution ended, as far as the backend can tell."""

    code: int | None
    oom: bool = False
    host_lost: bool = False
    detail: str = ""


class Execution(ABC):
    """A started cell."""

    @abstractmethod
    def output(self) -> Iterator[bytes]:
        """Chunks of combined stdout/stderr until the cell's output ends (blocking)."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True once the cell has ended."""

    @abstractmethod
    def kill(self) -> None:
        """Stop the cell and everything it started. Safe to call twice."""

    @abstractmethod
    def exit_info(self) -> ExitInfo:
        """The outcome, once :meth:`wait` returned True (or after :meth:`kill`)."""

    def ended(self) -> None:  # optional hook
        """The cell's main process ended: stop what it left running (a daemon holding its
        output open would keep the log from ending)."""

    def close(self) -> None:  # optional hook
        """Release what the execution holds (remove the container, close the channel)."""


class PopenExecution(Execution):
    """A cell started as a subprocess of this machine, its stdout and stderr one binary pipe:
    its output read as it comes, its end waited for, its exit code. A backend adds how it is
    stopped (:meth:`kill`) and what it holds (:meth:`close`)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self._pidfd: int | None = None

    def output(self) -> Iterator[bytes]:
        stdout = self.proc.stdout
        assert isinstance(stdout, io.BufferedReader)  # a binary pipe with the default buffer
        while chunk := stdout.read1(65536):
            yield chunk

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout``, woken the moment the process ends where Linux gives it a
        pidfd (5.3+): :meth:`subprocess.Popen.wait` with a timeout polls, up to 50 ms late
        per cell."""
        if self.proc.returncode is None and timeout > 0:
            fd = self._pid_fd()
            if fd is not None:
                poller = select.poll()  # no FD_SETSIZE limit, unlike select.select
                poller.register(fd, select.POLLIN)
                if not poller.poll(timeout * 1000):
                    return False
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        self.close_pidfd()
        return True

    def _pid_fd(self) -> int | None:
        if self._pidfd is None and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):  # an older kernel; the process reaped already
                self._pidfd = os.pidfd_open(self.proc.pid)
        return self._pidfd

    def close_pidfd(self) -> None:
        """Let go of the process's pidfd (once it ended, or when the execution closes)."""
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None

    def close(self) -> None:
        self.close_pidfd()

    def exit_info(self) -> ExitInfo:
        return ExitInfo(code=self.proc.poll())


#: Lines of a failed cell's log kept in its result.
TAIL_LINES = 40
#: Of a line of a cell's output, the most the log pump keeps for the tail and the progress hook
#: (its end: a ``\r`` progress bar's latest state); the log file keeps every byte.
LINE_KEEP_BYTES = 64 * 1024
#: Of a line kept in the tail (result.json's ``log_tail``, a failure's reason), the most kept.
TAIL_LINE_CHARS = 4000


@dataclass
class _Capture:
    """What the log pump keeps while it streams: the log's end, and the cell's files that could
    not be written (the log on a full disk). Figures are read from the log file once the cell
    ended (:mod:`orchestrator.results.figures.figure_parsers`)."""

    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    file_errors: dict[str, str] = field(default_factory=dict)
    #: Masks the cell's secret values in its output (inactive when it has none).
    scrub: Scrubber = field(default_factory=lambda: Scrubber(()))

    def line(self, text: str) -> None:
        self.tail.append(text if len(text) <= TAIL_LINE_CHARS
                         else f"[... {len(text) - TAIL_LINE_CHARS} characters] "
                              f"{text[-TAIL_LINE_CHARS:]}")

    def write(self, log_file: BinaryIO, chunk: bytes) -> None:
        """Append ``chunk`` to the log; after a failed write, the log is left as it is."""
        if RunPaths.CELL_LOG in self.file_errors:
            return
        try:
            log_file.write(chunk)
            log_file.flush()
        except OSError as exc:
            self.file_errors[RunPaths.CELL_LOG] = str(exc)


class _Step:
    """The step :meth:`Backend.run_cell` is in (named in the reason when one fails)."""

    name = "starting"


def describe_error(exc: BaseException) -> str:
    """An error as a result's reason: our own errors by their message, others with their type."""
    if isinstance(exc, OrchestratorError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _expected(exc: BaseException) -> bool:
    """Errors of the environment (disk, names, refusals), logged without a traceback."""
    return isinstance(exc, OrchestratorError | OSError | ValueError | OverflowError)


def lock_wait_record(held: HeldLocks) -> dict[str, Any]:
    """What a cell's result records of its wait for another sweep's locks (its provenance):
    ``lock_wait_s``, and ``lock_wait`` with when it began and ended (wall clock) and who held
    the lock, so that the run's own time can leave the wait out
    (:func:`orchestrator.results.folders.run_folder.lock_wait_of`)."""
    began = held.waited_from if held.waited_from is not None else time.time() - held.waited_s
    return {"lock_wait_s": held.waited_s,
            "lock_wait": {"from": round(began, 3), "until": round(began + held.waited_s, 3),
                          "held_by": held.held_by}}


@dataclass
class RunOptions:
    """Knobs of one sweep that every backend sees."""

    timeout_s: float
    output_hook: OutputHook | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    poll_interval_s: float = 0.2
    #: Hosts inventory for remote backends (--hosts, else [matrix] hosts).
    hosts_file: Path | None = None
    #: How long a cell waits for GPUs another sweep holds (None: as long as it takes; 0: not
    #: at all, the cell fails saying who holds them). See :mod:`orchestrator.local.locks`.
    lock_timeout_s: float | None = None
    #: Told what the run loop has to say beyond a cell's output (e.g. a cell waits for GPUs).
    on_log: Callable[[str], None] | None = None
    #: Told when a cell begins to wait for another sweep's locks (``cell id, message, None``:
    #: what it waits for and who holds it) and when it got them (``cell id, message,
    #: seconds waited``); None: the first goes to ``on_log``.
    on_lock_wait: Callable[[str, str, float | None], None] | None = None
    #: A dry run's backend (``plan``, ``--dry-run``): constructed to show each cell's launch,
    #: never prepared; what the target lacks (an inventory) is shown as not there.
    dry_run: bool = False
    #: The machine the cells run on (a dry run may plan for a declared one).
    target: Target = HERE


class Backend(ABC):
    """Runs cells somewhere. Subclasses fill in the hooks named in the module docstring."""

    name: ClassVar[str] = "base"
    #: The cells run on this machine: its state at each cell's start and end is recorded. A
    #: registered backend takes it from its record (:attr:`BackendRecord.here
    #: <orchestrator.backends.BackendRecord.here>`), set when its class is made.
    records_machine: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        record = find_record(cls.__dict__.get("name", ""))
        if record is not None and "records_machine" not in cls.__dict__:
            cls.records_machine = record.here

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        self.matrix = matrix
        self.paths = paths
        self.options = options
        #: Takes the machine's state (:func:`orchestrator.local.machine_state.sample`).
        self.sample_machine: Callable[[], dict[str, Any]] = machine_state.sample
        self._busy = False
        #: The image of each Apptainer profile where its cells run (set by ``prepare``).
        self.sif_paths: dict[ImageKey, str] = {}
        #: The plans of the images the cells run, each made once (what a dry run shows), and
        #: where each Apptainer image would be (a dry run's; by host where it matters).
        self.image_plans = build.ImagePlans(matrix)
        self.planned_sifs: dict[str | None, dict[ImageKey, str]] = {}

    # --- hooks ----------------------------------------------------------------------------

    @classmethod
    def check_available(cls) -> None:  # optional hook
        """Raise :class:`~orchestrator.errors.BackendUnavailable` if this backend can't run here."""

    @classmethod
    def target_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """Before a run folder exists (:func:`orchestrator.backends.checks.preflight`), when the
        target is this machine: what it lacks for this backend, each fact probed once.
        Default: :meth:`check_available`'s refusal, as a requirement of the kind the record's
        first need here names (``engine``, ``scheduler``, ``python``)."""
        try:
            cls.check_available()
        except BackendUnavailable as exc:
            record = find_record(cls.name)
            kinds = [n.kind for n in (record.needs if record else ()) if n.on == "here"]
            return [Requirement("", "", str(exc), kind=kinds[0] if kinds else "engine")]
        return []

    @classmethod
    def runtime_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """Before a run folder exists (:func:`orchestrator.backends.checks.preflight`): what
        the runtime of ``cells`` lacks on this machine. Default: every Apptainer profile whose
        runtime binary is not on this machine's PATH or whose bind source does not exist here
        (the runtime's :func:`~orchestrator.runtimes.apptainer.host_problems`; the process
        backend runs the cells here, the slurm backend on nodes that share this filesystem)."""
        profiles = sorted({c.hardware for c in cells
                           if matrix.profiles[c.hardware].apptainer_runtime})
        return list[Problem](apptainer.host_problems(matrix, profiles, LocalMachine()))

    @classmethod
    def prepare_problems(cls, matrix: Matrix, cells: Iterable[Cell],
                         hosts_file: Path | None = None, *, target: Target = HERE
                         ) -> list[Problem]:
        """Before a run folder exists (:func:`orchestrator.backends.checks.preflight`): what
        :meth:`prepare` would refuse, decided without building, connecting or writing.
        Default: the plans of the Apptainer images the cells need
        (:func:`orchestrator.runtimes.apptainer.plan_sifs`). ``hosts_file``: the inventory a
        remote backend reads; ``target``: the machine the cells run on (a declared one's
        driver picks an auto release)."""
        try:
            apptainer.plan_sifs(matrix, cells)
        except ConfigError as exc:
            return list(exc.problems)
        return []

    def prepare(  # optional hook
        self, cells: list[Cell], on_log: Callable[[str], None] | None = None
    ) -> None:
        """Once per sweep, before any cell runs (e.g. build every image the cells need once)."""

    @abstractmethod
    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        """The launch spec of ``cell`` on ``allocation`` (``attempt`` > 1: a retry)."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> Execution:
        """Start the cell. Raise LaunchError if it cannot start at all."""

    def dry_spec(self, cell: Cell) -> LaunchSpec:
        """The launch spec ``cell`` would get, for a dry run: decided without preparing,
        building, connecting or locking (its GPUs as this backend would place them on an idle
        machine). Default: :meth:`spec` on :meth:`dry_allocation`."""
        return self.spec(cell, self.dry_allocation(cell))

    def dry_allocation(self, cell: Cell) -> Allocation:
        """Where ``cell`` would run on an idle machine (the GPUs :meth:`allocate` gives first)."""
        return self._local_allocation(cell)

    def _local_allocation(self, cell: Cell) -> Allocation:
        """``cell`` on this machine, idle: a cell that computes on its GPUs
        (:func:`~orchestrator.plan.placement.holds_local_gpus`) gets the first ``gpus`` of its
        profile's ``gpu_ids`` (else of 0, 1, ...); a CPU cell holds the GPUs its profile lists,
        if any (kept from other sweeps' cells); a Bitfusion cell holds none."""
        profile = self.matrix.profile(cell)
        if holds_local_gpus(profile):
            ids = profile.gpu_ids if profile.gpu_ids is not None else range(cell.params.gpus)
            return Allocation.local(cell.id, tuple(ids)[: cell.params.gpus])
        return Allocation.local(cell.id, tuple(profile.gpu_ids or ()) if profile.device == "cpu"
                                else ())

    def submission_lines(self, cells: list[Cell]) -> list[str]:
        """What a dry run says of how ``cells`` would be handed over, beyond each cell's launch
        (Slurm: its arrays and jobs); nothing is submitted. Default: nothing to say."""
        return []

    def runtime_image(self, cell: Cell) -> str:
        """The .sif an Apptainer cell runs: the one ``prepare`` made sure of, else (a dry run)
        where it would be on this machine (:func:`orchestrator.runtimes.apptainer.image_path`;
        one whose build input is not here: said so, in a dry run)."""
        return self._dry_image(lambda: apptainer.image_path(
            self.matrix, cell, self.sif_paths, LocalMachine(), self.image_plans,
            self.planned_sifs.setdefault(None, {})))

    def _dry_image(self, find: Callable[[], str]) -> str:
        """``find()``; in a dry run, an image that cannot be planned here (its checkout is not
        on this machine: a requirement the decision lists) is shown as that."""
        try:
            return find()
        except ConfigError as exc:
            if not self.options.dry_run:
                raise
            return f"<image not planned here: {exc.problems[0].message}>"

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """What ran where, beyond what the workload reports itself."""
        info: dict[str, Any] = {
            "host": spec.host or socket.gethostname(),
            "backend": self.name,
            "image": spec.image,
            "gpu_ids": list(spec.gpu_ids),
            "attempt": spec.attempt,
            "orchestrate_version": __version__,
            "git_revision": git_revision(),
        }
        if spec.hosts:
            info["hosts"] = list(spec.hosts)
        if spec.program:
            info["program"] = dict(spec.program)
        if spec.runtime:
            info["runtime"] = dict(spec.runtime)
        return info

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """Complete the result of a cell that ran with what only the backend knows (the
        execution's own account of its end), before the result is written."""

    def close(self) -> None:  # optional hook
        """End of the sweep: remove anything left behind."""

    # --- placement (default: one cell at a time on this machine) -----------------------------

    def unplaceable(self, cell: Cell) -> str | None:
        """Why ``cell`` can never run on this backend, or None."""
        profile = self.matrix.profile(cell)
        if not holds_local_gpus(profile):
            return None
        ids = profile.gpu_ids
        if ids is not None:
            where = f"hardware.{cell.hardware}.gpu_ids lists"
        else:
            from orchestrator.catalog.gpus import local_accelerator_ids

            ids = local_accelerator_ids(profile.device)
            where = "this machine has"
        if ids is not None and cell.params.gpus > len(ids):
            return f"needs {cell.params.gpus} GPUs but {where} {len(ids)}"
        return None

    def allocate(self, cell: Cell) -> Allocation | None:
        """GPUs for ``cell`` if it can start now, else None. Default: serial, local GPUs."""
        if self._busy:
            return None
        self._busy = True
        return self._local_allocation(cell)

    def release(self, cell: Cell, allocation: Allocation) -> None:
        """The cell that held ``allocation`` ended."""
        self._busy = False

    def lock_requests(self, cell: Cell, allocation: Allocation) -> tuple[LockRequest, ...]:
        """What ``cell`` must hold against other sweeps while it runs, one request per machine
        in the order they are taken (empty: nothing). Default: this machine's GPUs of the
        allocation, else its CPU."""
        return (LockRequest("localhost", allocation.gpu_ids),)

    def locker(self, request: LockRequest, holder: Holder) -> Locker:
        """Where ``request``'s locks are taken. Default: this machine's lock folder."""
        return FileLocker(request, holder)

    # --- the run loop -------------------------------------------------------------------------

    def run_cell(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> CellResult:
        """Run one cell to an outcome; always returns its result, never raises.

        Expected failures become results. So does everything else that goes wrong in this frame,
        before or after the launch: the cell folder, ``command.json`` or the log cannot be
        written (a full disk, a name too long), the spec or the launch raises (a
        :class:`~orchestrator.errors.LaunchError`, an invalid environment, any bug), the
        execution cannot report: the cell ends ``failed`` with the step and the error as its
        reason, and a started execution is stopped. The result is written into the cell folder
        when that is possible; the sweep writes it again when it records the cell
        (:func:`orchestrator.sweep.record`) and reports a cell whose result cannot be written.
        """
        result = CellResult(
            cell_id=cell.id, group=cell.group, repeat=cell.repeat, status=Status.FAILED,
            params=cell.params.model_dump(), attempts=attempt,
            config_hash=cell.hash, role=cell.role,
        )
        step = _Step()
        try:
            self._run(cell, allocation, attempt, result, step)
        except LockWaitCancelled as exc:
            result.status, result.reason = Status.CANCELLED, f"the sweep was interrupted: {exc}"
        except Exception as exc:  # whatever it was, the cell gets a result
            result.status = Status.FAILED
            result.reason = f"{step.name}: {describe_error(exc)}"
            if _expected(exc):  # the result says it; the sweep reports it
                log.info("%s: %s", cell.id, result.reason)
            else:  # a bug: its traceback
                log.warning("%s: %s", cell.id, result.reason, exc_info=True)
        try:
            write_json(self.paths.cell_result(cell.id), result.to_json())
        except OSError as exc:  # the sweep writes it again, and reports it if it cannot
            log.debug("%s: result.json not written here: %s", cell.id, exc)
        return result

    def _run(self, cell: Cell, allocation: Allocation, attempt: int, result: CellResult,
             step: _Step) -> None:
        """The steps of :meth:`run_cell`; ``step`` names the one under way (for the reason)."""
        step.name = "making the cell folder"
        self.paths.cells_dir.mkdir(parents=True, exist_ok=True)
        make_folder(self.paths.cell_dir(cell.id))  # never a link planted out of the run
        step.name = "preparing the launch"
        spec = self.spec(cell, allocation, attempt)
        result.provenance = self.provenance(spec)
        step.name = "writing command.json"
        write_json(self.paths.cell_command(cell.id), spec.to_json())
        step.name = "writing log.txt"
        log_path = self.paths.cell_log(cell.id)
        with open_stream(log_path) as log_file:
            log_file.write(f"# {spec.shell_line()}\n".encode())
        log_offset = log_path.stat().st_size  # this attempt's output starts here
        requests = self.lock_requests(cell, allocation)
        step.name = (f"waiting for {' and '.join(r.describe() for r in requests)}" if requests
                     else "launching")
        with self._hold(cell, requests) as held:
            if held is not None and held.waited_s:
                result.provenance.update(lock_wait_record(held))
            self._record_machine(result, "start")
            result.started_at = time.time()
            t0 = time.monotonic()
            capture = _Capture(scrub=Scrubber(secret_env(spec.env).values()))
            step.name = "launching"
            execution = self.launch(spec)
            step.name = "running"
            status, reason, info = self._execute(cell, execution, log_path, capture)
        result.duration_s = round(time.monotonic() - t0, 3)
        result.finished_at = time.time()
        self._record_machine(result, "end")
        result.exit_code = info.code if info else None
        step.name = "reading its figures"
        output = CellOutput.from_cell_dir(self.paths.cell_dir(cell.id), result.params,
                                          log_offset, log_path.name)
        step.name = "recording the outcome"
        self._interpret(cell, result, status, reason, info, capture, output)
        self.finish(cell, result, execution)

    def _record_machine(self, result: CellResult, when: str) -> None:
        """The machine's state as ``result.machine[when]``, where the backend records it; a
        sample that fails is left out (a debug line), never the cell's failure."""
        if not self.records_machine:
            return
        try:
            result.machine[when] = self.sample_machine()
        except Exception as exc:  # telemetry never fails a cell
            log.debug("%s: machine state at %s not recorded: %s", result.cell_id, when, exc)

    @contextlib.contextmanager
    def _hold(self, cell: Cell, requests: tuple[LockRequest, ...]
              ) -> Iterator[HeldLocks | None]:
        """Hold ``requests``' locks (waiting for another sweep's cells) while the body runs."""
        if not requests:
            yield None
            return
        holder = Holder(run=f"{self.matrix.name}/{self.paths.run_id}", cell=cell.id)
        told = self.options.on_lock_wait

        def waiting(message: str) -> None:
            if told is not None:
                told(cell.id, message.removeprefix(f"{cell.id}: "), None)
            elif self.options.on_log is not None:
                self.options.on_log(message)

        held = locks.hold(requests, holder, self.locker, timeout_s=self.options.lock_timeout_s,
                          cancel=self.options.cancel, on_wait=waiting)
        with held:
            if held.waited_s and told is not None:
                what = " and ".join(r.describe() for r in requests)
                told(cell.id, f"got {what} after waiting {held.waited_s:.0f} s", held.waited_s)
            yield held

    def _execute(
        self, cell: Cell, execution: Execution, log_path: Path, capture: _Capture
    ) -> tuple[Status | None, str, ExitInfo | None]:
        info: ExitInfo | None = None
        with open_stream(log_path) as log_file:
            pump = threading.Thread(
                target=self._pump, args=(cell.id, execution, log_file, capture), daemon=True,
                name=f"log-{cell.id}",
            )
            status: Status | None = None
            reason = ""
            try:
                pump.start()
                deadline = time.monotonic() + self.options.timeout_s
                while not execution.wait(self.options.poll_interval_s):
                    if self.options.cancel.is_set():
                        status, reason = Status.CANCELLED, "the sweep was interrupted"
                        execution.kill()
                        break
                    if time.monotonic() > deadline:
                        status = Status.TIMEOUT
                        reason = (f"timed out after {self.options.timeout_s:g} s "
                                  "(raise [matrix] timeout_s if the cell needs longer)")
                        execution.kill()
                        break
            except KeyboardInterrupt:
                execution.kill()
                self.options.cancel.set()
                status, reason = Status.CANCELLED, "the sweep was interrupted"
            except BaseException:
                execution.kill()  # whatever broke here, the cell does not run on unwatched
                raise
            finally:
                try:
                    if execution.wait(5.0):
                        execution.ended()
                    if pump.ident is not None:  # started
                        pump.join(timeout=10.0)
                    info = execution.exit_info()
                finally:
                    execution.close()
        return status, reason, info

    def _pump(self, cell_id: str, execution: Execution, log_file: BinaryIO, capture: _Capture
              ) -> None:
        """Stream output into the log as it comes; hand each line to the capture and hook.

        Linear in the output's size, however long its lines: each chunk is searched for a
        newline once, and of a line still open (a progress bar drawn with ``\\r`` for hours is
        one endless line) only its last :data:`LINE_KEEP_BYTES` are kept for the capture and
        the hook (the log file gets every byte). With secrets to mask the open line is kept
        whole, as masking needs whole lines (a secret split over two chunks is still found).

        A log that cannot be written (a full disk) does not stop the stream: the output is still
        read to its end (a workload blocked on a full pipe would hang until its timeout), its
        lines still captured, and the failure is noted for the result.
        """
        hook = self.options.output_hook
        pending = bytearray()  # the open line (or its end)
        cut = 0  # bytes dropped from the open line's front

        def line(raw: bytes | bytearray, dropped: int) -> None:
            if len(raw) > LINE_KEEP_BYTES:
                dropped += len(raw) - LINE_KEEP_BYTES
                raw = raw[-LINE_KEEP_BYTES:]
            text = bytes(raw).decode("utf-8", errors="replace")
            if dropped:
                text = f"[... {dropped} bytes] {text}"
            capture.line(text)
            if hook:
                hook(cell_id, text)

        scrub = capture.scrub
        try:
            for chunk in execution.output():
                if not scrub:
                    capture.write(log_file, chunk)
                end = chunk.rfind(b"\n")
                if end < 0:
                    pending += chunk
                    if not scrub and len(pending) > LINE_KEEP_BYTES:
                        cut += len(pending) - LINE_KEEP_BYTES
                        del pending[:len(pending) - LINE_KEEP_BYTES]
                    continue
                pending += chunk[:end]
                lines = pending.split(b"\n")
                pending = bytearray(chunk[end + 1:])
                if scrub:
                    lines = [bytearray(scrub(bytes(raw))) for raw in lines]
                    capture.write(log_file, b"".join(bytes(raw) + b"\n" for raw in lines))
                for i, raw in enumerate(lines):
                    line(raw, cut if i == 0 else 0)
                cut = 0
        except Exception as exc:  # a broken stream must not kill the sweep
            log.warning("output stream of %s ended: %s", cell_id, exc)
        if pending:
            if scrub:
                pending = bytearray(scrub(bytes(pending)))
                capture.write(log_file, bytes(pending))
            line(pending, cut)

    def _interpret(
        self, cell: Cell, result: CellResult, status: Status | None, reason: str,
        info: ExitInfo | None, capture: _Capture, output: CellOutput,
    ) -> None:
        """The cell's figures (its program's parser:
        :func:`orchestrator.results.figures.figure_parsers.evaluate`) and its
        status: the backend's account of its end first, then the figures' verdict."""
        exited_ok = (status is None and info is not None and info.code == 0
                     and not info.oom and not info.host_lost)
        evaluation = evaluate(output, self.matrix.program(cell).figures, exited_ok=exited_ok)
        figures = evaluation.figures
        if figures.records:
            try:
                with replacing(self.paths.cell_metrics(result.cell_id)) as fh:
                    fh.writelines(safejson.dumps(obj) + "\n" for obj in figures.records)
            except OSError as exc:
                capture.file_errors[RunPaths.CELL_METRICS] = str(exc)
        result.metrics = dict(figures.metrics)
        result.env = dict(figures.env)
        result.provenance["figures"] = figures.info()

        if status is None:
            if info is None:
                status, reason = Status.FAILED, "the backend reported no outcome"
            elif info.host_lost:
                status, reason = Status.HOST_LOST, info.detail or "the host stopped answering"
            elif info.oom:
                status = Status.OOM
                reason = info.detail or "killed by the out-of-memory killer"
            elif info.code != 0:
                status = Status.FAILED
                reason = _failure_reason(info, figures.program_error, capture.tail)
            elif not evaluation.ok:
                status, reason = Status.FAILED, evaluation.reason
            else:
                status = Status.OK
        if capture.file_errors:  # numbers without their files are not a result to keep
            lost = "; ".join(f"{name}: {err}" for name, err in capture.file_errors.items())
            if status is Status.OK:
                status, reason = Status.FAILED, f"the cell's files could not be written ({lost})"
            else:
                reason = f"{reason}; the cell's files could not be written ({lost})"
        result.status = status
        result.reason = reason
        if status is not Status.OK:
            result.log_tail = list(capture.tail)


def _failure_reason(info: ExitInfo, error: str | None, tail: Iterable[str]) -> str:
    code = info.code
    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exit code {code}"
    if error:
        return f"{what}: {error}"
    last = [ln for ln in tail if ln.strip()]
    detail = info.detail or (last[-1].strip() if last else "")
    return f"{what}: {detail}" if detail else what


@cache
def git_revision(repo: Path | None = None) -> str | None:
    """The project's git revision (with ``-dirty`` when tracked files changed), learned
    read-only: ``git status`` with ``GIT_OPTIONAL_LOCKS=0`` neither refreshes nor rewrites the
    index (without it, every sweep briefly made ``.git/index.lock`` in the checkout, and a
    ``git commit`` there at that moment failed)."""
    where = str(repo or REPO_ROOT)
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        rev = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True, env=env,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, env=env,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("ORCHESTRATE_GIT_REVISION")
    return f"{rev}-dirty" if dirty else rev
