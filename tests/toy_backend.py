"""A TOY backend, written by following docs/contributing.md's recipe "A backend" and nothing
else: tests/test_backend_recipe.py registers its record and runs sweeps through it.

Each cell's program runs as a plain subprocess of this machine, one cell at a time, with no
container (the ``none`` runtime's argv: :func:`orchestrator.runtimes.none.command`). What every
backend shares comes from the base (placement on this machine, the log, the timeout, the
result, a subprocess's output and end: :class:`~orchestrator.backends.base.PopenExecution`);
this module fills in only :meth:`~orchestrator.backends.base.Backend.spec`,
:meth:`~orchestrator.backends.base.Backend.launch` and how a cell is stopped. It is a real, if
small, backend (no fake: the cells run), and no shipped code names it: the sweep, the checks
and the CLI know it only by its record.
"""

from __future__ import annotations

import os
import subprocess

from orchestrator.backends.base import Backend, Execution, PopenExecution
from orchestrator.config.redact import resolve_env
from orchestrator.errors import LaunchError
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import Allocation
from orchestrator.runtimes import none


class ToyExecution(PopenExecution):
    """A started subprocess (its output, end and exit code: the base's), stopped by SIGKILL."""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ToyBackend(Backend):
    """Cells as plain subprocesses of this machine, one at a time."""

    name = "toy"

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        profile = self.matrix.profile(cell)
        out = str(self.paths.cell_dir(cell.id).resolve())
        command = none.command(cell, profile, self.matrix.program(cell), output_dir=out,
                               gpu_ids=allocation.gpu_ids)
        return LaunchSpec(cell_id=cell.id, argv=tuple(command.argv), env=command.env,
                          device=profile.device, gpu_ids=allocation.gpu_ids,
                          workdir=command.workdir, output_dir=out, attempt=attempt,
                          program=command.program)

    def launch(self, spec: LaunchSpec) -> Execution:
        env = {**os.environ, **resolve_env(spec.env), "PYTHONPATH": none.python_path(os.environ)}
        try:
            proc = subprocess.Popen(list(spec.argv), cwd=spec.workdir, env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
        except OSError as exc:
            raise LaunchError(f"cannot start {spec.argv[0]!r} for {spec.cell_id}: {exc}") from exc
        return ToyExecution(proc)
