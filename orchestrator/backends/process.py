"""Local process backend: a cell's program as a subprocess of this machine.

The embedded default: needs nothing but torch in this Python environment. The cell's program
runs with no container (:mod:`orchestrator.runtimes.none`: this Python, this checkout, the
command's ``workdir``), its GPUs selected with ``CUDA_VISIBLE_DEVICES``; several GPUs run under
``torch.distributed.run`` (torchrun).

Every process a cell starts is stopped when it ends, is timed out or interrupted, however it
detached (torchrun's ranks each run in a session of their own; a daemon may double-fork):
the cell's processes carry the marker ``ORCHESTRATE_CELL=<matrix>/<run id>/<cell id>`` and,
where this machine allows it (root, or a delegated cgroup v2 subtree), run in a cgroup of their
own (:mod:`orchestrator.local.cell_processes`). A stop is SIGTERM to all, a grace of
:data:`TERM_GRACE_S`, then SIGKILL until a scan finds none; a process that outlives even that
is named in the result's provenance (``leftover_processes``). A resumed run first stops what an
orchestrator killed mid-cell left of it.

``[hardware.NAME.container] mem_limit`` applies here too: the cell's memory cgroup (v2
``memory.max`` or v1 ``memory.limit_in_bytes``, no swap), and a cell the kernel OOM-kills in it
ends ``oom``. Where no memory cgroup can be made the sweep refuses such a profile at once.

A profile with ``runtime = "apptainer"`` (or ``"singularity"``) runs the same program in its
image, as the Apptainer runtime wraps it (:mod:`orchestrator.runtimes.apptainer`): ``apptainer
exec --nv --cleanenv ... IMAGE.sif <argv>``, its GPUs passed as ``--env CUDA_VISIBLE_DEVICES``,
every other value and secret as ``APPTAINERENV_*`` in the launcher's environment (the cell
marker too, so the stop above reaches the processes in the container). ``prepare`` makes sure
of the runtime and the ``.sif`` here (:func:`orchestrator.runtimes.apptainer.prepare`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend, Execution, ExitInfo, PopenExecution
from orchestrator.backends.target import HERE, Target
from orchestrator.config.redact import resolve_env
from orchestrator.errors import BackendUnavailable, LaunchError, Problem, Requirement
from orchestrator.images.sif import LocalMachine
from orchestrator.local import cell_processes
from orchestrator.local.cell_processes import CellProcesses
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.folders.run_folder import CellResult
from orchestrator.runtimes import apptainer, none

log = logging.getLogger(__name__)

#: Seconds between SIGTERM and SIGKILL when a cell is stopped (timeout, interrupt).
TERM_GRACE_S = 5.0


class ProcessExecution(PopenExecution):
    """A local subprocess and everything it starts
    (:class:`~orchestrator.local.cell_processes.CellProcesses`)."""

    def __init__(self, proc: subprocess.Popen[bytes], procs: CellProcesses,
                 mem_limit: int | None = None):
        super().__init__(proc)
        self.procs = procs
        self.mem_limit = mem_limit
        #: Processes of the cell that outlived SIGKILL (normally none).
        self.leftovers: list[str] = []

    def kill(self) -> None:
        self.leftovers = self.procs.stop(grace=TERM_GRACE_S)
        self.wait(5.0)

    def ended(self) -> None:
        self.leftovers = self.leftovers or self.procs.stop(grace=0)

    def exit_info(self) -> ExitInfo:
        code = self.proc.poll()
        if code not in (0, None) and self.procs.oom_kills():
            limit = f" (cell memory limit {self.mem_limit / 2**20:.0f} MiB)" \
                if self.mem_limit else ""
            return ExitInfo(code=code, oom=True,
                            detail=f"killed by the out-of-memory killer{limit}")
        return ExitInfo(code=code)

    def close(self) -> None:
        # The leader may be gone while processes it started linger (ranks, daemons): end them.
        leftovers = self.procs.stop(grace=0)
        self.leftovers = self.leftovers or leftovers
        self.procs.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        super().close()


class ProcessBackend(Backend):
    """Run cells as local subprocesses, one at a time (clean benchmark numbers)."""

    name = "process"

    @classmethod
    def check_available(cls) -> None:
        problem = none.python_problem(cls.name)
        if problem:
            raise BackendUnavailable(problem)

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        """The cell's program with this Python, in this checkout (or the command's ``workdir``),
        its GPUs pinned by the environment (:func:`orchestrator.runtimes.none.command`); under
        Apptainer, the same program in the profile's image
        (:func:`orchestrator.runtimes.apptainer.launch_spec`)."""
        profile = self.matrix.profile(cell)
        out = self.paths.absolute_cell_dir(cell.id)  # the program may run elsewhere
        if profile.apptainer_runtime:
            return self._apptainer_spec(cell, allocation, attempt, out)
        command = none.command(cell, profile, self.matrix.program(cell), output_dir=out,
                               gpu_ids=allocation.gpu_ids)
        return LaunchSpec(
            cell_id=cell.id,
            argv=tuple(command.argv),
            env=command.env,
            device=profile.device,
            gpu_ids=allocation.gpu_ids,
            workdir=command.workdir,
            output_dir=out,
            attempt=attempt,
            mem_limit=profile.container.mem_limit,
            program=command.program,
        )

    def dry_spec(self, cell: Cell) -> LaunchSpec:
        """The base's, with the ``PYTHONPATH`` :meth:`launch` gives the program (this checkout
        first), so the dry run shows the environment it starts with."""
        spec = super().dry_spec(cell)
        if spec.runtime:
            return spec
        return dataclasses.replace(spec, env={**spec.env,
                                              "PYTHONPATH": none.python_path(os.environ)})

    def _apptainer_spec(self, cell: Cell, allocation: Allocation, attempt: int, out: str
                        ) -> LaunchSpec:
        return apptainer.launch_spec(cell, self.matrix.profile(cell), self.matrix.program(cell),
                                     image=self.runtime_image(cell), output_dir=out,
                                     gpu_ids=allocation.gpu_ids, attempt=attempt)

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """Adds the Python environment that ran the workload (none: an Apptainer image's)."""
        if spec.runtime:
            return super().provenance(spec)
        return {**super().provenance(spec), **none.provenance()}

    @classmethod
    def prepare_problems(cls, matrix: Matrix, cells: Iterable[Cell],
                         hosts_file: Path | None = None, *, target: Target = HERE
                         ) -> list[Problem]:
        """A memory limit this machine cannot apply (no memory cgroup can be made), then the
        base's problems (Apptainer images)."""
        cells = list(cells)
        return memory_limit_problems(matrix, cells) + super().prepare_problems(matrix, cells)

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Make sure of the Apptainer images; stop what a killed orchestrator left running of
        this run (a resumed run). What it cannot apply was refused before (preflight's
        :meth:`prepare_problems`)."""
        if any(self.matrix.profile(c).apptainer_runtime for c in cells):
            self.sif_paths = apptainer.prepare(self.matrix, cells, LocalMachine(), on_log=on_log)
        prefix = cell_processes.run_marker_prefix(self.matrix.name, self.paths.run_id)
        stopped = cell_processes.kill_marked(prefix, prefix=True, grace=TERM_GRACE_S)
        if stopped and on_log:
            on_log(f"stopped {len(stopped)} processes left running by an earlier attempt of "
                   f"run {self.paths.run_id}")

    def launch(self, spec: LaunchSpec) -> Execution:
        mem_limit = cell_processes.parse_bytes(spec.mem_limit) if spec.mem_limit else None
        marker = cell_processes.cell_marker(self.matrix.name, self.paths.run_id, spec.cell_id)
        try:
            procs = CellProcesses.create(
                marker, cell_processes.cgroup_name(self.paths.run_id, spec.cell_id), mem_limit)
        except cell_processes.MemoryLimitUnavailable as exc:
            raise LaunchError(f"{spec.cell_id}: cannot apply mem_limit: {exc}") from exc
        env = {**os.environ, **resolve_env(spec.env), **procs.environment()}
        if spec.runtime:  # --cleanenv: what the container gets travels with the runtime's prefix
            env.update(apptainer.launch_env(spec, procs.environment()))
        env["PYTHONPATH"] = none.python_path(os.environ)
        try:
            proc = subprocess.Popen(
                procs.wrap(spec.argv), cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except BaseException as exc:
            procs.close()
            if isinstance(exc, OSError):
                raise LaunchError(f"cannot start {spec.argv[0]!r} for {spec.cell_id}: "
                                  f"{exc}") from exc
            raise
        return ProcessExecution(proc, procs, mem_limit)

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """How the cell's processes were tracked; any that outlived SIGKILL."""
        assert isinstance(execution, ProcessExecution)
        result.provenance["process_tracking"] = execution.procs.tracking
        if execution.leftovers:
            result.provenance["leftover_processes"] = execution.leftovers


def memory_limit_problems(matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
    """Every ``container.mem_limit`` of the cells' profiles that this machine cannot apply to a
    process (unreadable, or no memory cgroup can be made here: a probe cgroup is made and
    removed at once)."""
    limited = sorted({c.hardware for c in cells if matrix.profile(c).container.mem_limit})
    problems = []
    for name in limited:
        text = matrix.profiles[name].container.mem_limit or ""
        where = f"hardware.{name}.container.mem_limit"
        try:
            limit = cell_processes.parse_bytes(text)
            probe = cell_processes.make_cgroups(f"probe-{os.getpid()}", limit)
            if probe is not None:
                probe.remove()
        except ValueError as exc:
            problems.append(Problem(str(matrix.path), where, str(exc)))
        except cell_processes.MemoryLimitUnavailable as exc:
            problems.append(Requirement(str(matrix.path), where, (
                f"the process backend limits a cell's memory with a memory cgroup, and {exc}"),
                kind="memory"))
    return problems
