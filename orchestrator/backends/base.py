"""The base every backend stands on.

:class:`Backend` owns what is the same everywhere: writing the command, streaming output into the
cell's log, the per-cell timeout, cancellation, timing, and turning an outcome into a
:class:`~orchestrator.results.CellResult`. A backend fills in a few hooks:

- :meth:`Backend.check_available` — can it run here at all (engine, sshd, Slurm)?
- :meth:`Backend.prepare` — work done once per sweep (build the images the cells need).
- :meth:`Backend.spec` — the :class:`~orchestrator.launch.LaunchSpec` of a cell.
- :meth:`Backend.launch` — start it, returning an :class:`Execution` handle.
- :meth:`Backend.finish` — add what only the backend knows to the result (optional).

An :class:`Execution` is the started cell: a subprocess, a container, a remote channel, a job.
"""

from __future__ import annotations

import json
import logging
import os
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
from typing import Any, ClassVar

from orchestrator import __version__
from orchestrator.launch import LaunchSpec
from orchestrator.matrix import Cell, Matrix
from orchestrator.results import (
    CellResult,
    RunPaths,
    Status,
    parse_metric_lines,
    write_json,
)

log = logging.getLogger("orchestrator.backends")

PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Called with (cell id, one line of its output) as the cell runs (progress display).
OutputHook = Callable[[str, str], None]


@dataclass(frozen=True)
class Allocation:
    """Where a cell runs: a host (None: this machine) and the GPU ids given to it."""

    host: str | None = None
    gpu_ids: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()  # multi-node cells: every host, first is the rendezvous


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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the execution holds (remove the container, close the channel)."""


#: Lines of a failed cell's log kept in its result.
TAIL_LINES = 40


@dataclass
class _Capture:
    """What the log pump keeps while it streams: the structured lines and the log's end."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    def line(self, text: str) -> None:
        self.tail.append(text)
        if text.lstrip().startswith("{"):
            self.metrics += parse_metric_lines(text)


@dataclass
class RunOptions:
    """Knobs of one sweep that every backend sees."""

    timeout_s: float
    output_hook: OutputHook | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    poll_interval_s: float = 0.2
    #: Hosts inventory for remote backends (--hosts, else [matrix] hosts).
    hosts_file: Path | None = None


class Backend(ABC):
    """Runs cells somewhere. Subclasses fill in the hooks named in the module docstring."""

    name: ClassVar[str] = "base"
    #: Cells of this backend may run at once on distinct GPUs/hosts.
    concurrent: ClassVar[bool] = False

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        self.matrix = matrix
        self.paths = paths
        self.options = options
        self._busy = False

    # --- hooks ----------------------------------------------------------------------------

    @classmethod
    def check_available(cls) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~orchestrator.errors.BackendUnavailable` if this backend can't run here."""

    def prepare(  # noqa: B027 - optional hook
        self, cells: list[Cell], on_log: Callable[[str], None] | None = None
    ) -> None:
        """Once per sweep, before any cell runs (e.g. build every image the cells need once)."""

    @abstractmethod
    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        """The launch spec of ``cell`` on ``allocation`` (``attempt`` > 1: a retry)."""

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> Execution:
        """Start the cell. Raise LaunchError if it cannot start at all."""

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """What ran where, beyond what the workload reports itself."""
        info = {
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
        return info

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:  # noqa: B027
        """Complete the result of a cell that ran with what only the backend knows (the
        execution's own account of its end), before the result is written."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """End of the sweep: remove anything left behind."""

    # --- placement (default: one cell at a time on this machine) -----------------------------

    def unplaceable(self, cell: Cell) -> str | None:
        """Why ``cell`` can never run on this backend, or None."""
        profile = self.matrix.profile(cell)
        if profile.device == "cpu" or profile.wrapper != "none":
            return None
        ids = profile.gpu_ids
        if ids is not None:
            where = f"hardware.{cell.hardware}.gpu_ids lists"
        else:
            from orchestrator.gpus import local_accelerator_ids

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
        profile = self.matrix.profile(cell)
        if profile.device == "cpu" or profile.wrapper == "bitfusion":
            return Allocation()
        ids = profile.gpu_ids if profile.gpu_ids is not None else range(cell.params.gpus)
        return Allocation(gpu_ids=tuple(ids)[: cell.params.gpus])

    def release(self, cell: Cell, allocation: Allocation) -> None:
        """The cell that held ``allocation`` ended."""
        self._busy = False

    # --- the run loop -------------------------------------------------------------------------

    def run_cell(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> CellResult:
        """Run one cell to an outcome. Expected failures become results, never exceptions."""
        cell_dir = self.paths.cell_dir(cell.id)
        cell_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec(cell, allocation, attempt)
        write_json(self.paths.cell_command(cell.id), spec.to_json())
        log_path = self.paths.cell_log(cell.id)
        result = CellResult(
            cell_id=cell.id, group=cell.group, repeat=cell.repeat, status=Status.FAILED,
            params=cell.params.model_dump(), attempts=attempt, provenance=self.provenance(spec),
            config_hash=cell.hash,
        )
        result.started_at = time.time()
        t0 = time.monotonic()
        capture = _Capture()
        with log_path.open("ab") as log_file:
            log_file.write(f"# {spec.shell_line()}\n".encode())
        execution = self.launch(spec)  # LaunchError: the sweep records a failed cell
        status, reason, info = self._execute(cell, execution, log_path, capture)
        result.duration_s = round(time.monotonic() - t0, 3)
        result.finished_at = time.time()
        result.exit_code = info.code if info else None
        self._interpret(result, status, reason, info, capture)
        self.finish(cell, result, execution)
        write_json(self.paths.cell_result(cell.id), result.to_json())
        return result

    def _execute(
        self, cell: Cell, execution: Execution, log_path: Path, capture: _Capture
    ) -> tuple[Status | None, str, ExitInfo | None]:
        with log_path.open("ab") as log_file:
            pump = threading.Thread(
                target=self._pump, args=(cell.id, execution, log_file, capture), daemon=True,
                name=f"log-{cell.id}",
            )
            pump.start()
            status: Status | None = None
            reason = ""
            deadline = time.monotonic() + self.options.timeout_s
            try:
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
            finally:
                execution.wait(5.0)
                pump.join(timeout=10.0)
                info = execution.exit_info()
                execution.close()
        return status, reason, info

    def _pump(self, cell_id: str, execution: Execution, log_file, capture: _Capture) -> None:
        """Stream output into the log as it comes; hand each line to the capture and hook."""
        hook = self.options.output_hook
        pending = b""

        def line(raw: bytes) -> None:
            text = raw.decode("utf-8", errors="replace")
            capture.line(text)
            if hook:
                hook(cell_id, text)

        try:
            for chunk in execution.output():
                log_file.write(chunk)
                log_file.flush()
                *lines, pending = (pending + chunk).split(b"\n")
                for raw in lines:
                    line(raw)
        except Exception as exc:  # a broken stream must not kill the sweep
            log.warning("output stream of %s ended: %s", cell_id, exc)
        if pending:
            line(pending)

    def _interpret(
        self, result: CellResult, status: Status | None, reason: str, info: ExitInfo | None,
        capture: _Capture,
    ) -> None:
        lines = capture.metrics
        if lines:
            with self.paths.cell_metrics(result.cell_id).open("w", encoding="utf-8") as fh:
                for obj in lines:
                    fh.write(json.dumps(obj) + "\n")
        summary = next((o for o in reversed(lines) if o["type"] == "summary"), None)
        meta = next((o for o in lines if o["type"] == "meta"), None)
        error = next((o for o in reversed(lines) if o["type"] == "error"), None)
        if summary:
            result.metrics = dict(summary.get("data", {}))
            if "iteration_times" in summary:
                result.metrics["iteration_times"] = summary["iteration_times"]
        result.env = dict((summary or meta or {}).get("env", {}))

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
                reason = _failure_reason(info, error, capture.tail)
            elif summary is None:
                status = Status.FAILED
                reason = "the workload exited 0 but printed no summary line"
            else:
                status = Status.OK
        result.status = status
        result.reason = reason
        if status is not Status.OK:
            result.log_tail = list(capture.tail)


def _failure_reason(info: ExitInfo, error: dict[str, Any] | None, tail: Iterable[str]) -> str:
    code = info.code
    if code is not None and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"exit code {code}"
    if error and error.get("message"):
        return f"{what}: {error['message']}"
    last = [ln for ln in tail if ln.strip()]
    detail = info.detail or (last[-1].strip() if last else "")
    return f"{what}: {detail}" if detail else what


@cache
def git_revision() -> str | None:
    """The project's git revision (with ``-dirty`` when the work tree has changes)."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("ORCHESTRATE_GIT_REVISION")
    return f"{rev}-dirty" if dirty else rev
