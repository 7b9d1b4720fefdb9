"""Local process backend: a cell's workload as a subprocess of this machine.

The embedded default: needs nothing but torch in this Python environment. GPUs are selected with
``CUDA_VISIBLE_DEVICES``; several GPUs run under ``torch.distributed.run`` (torchrun). The cell
runs in its own process group, so a timeout or an interrupt stops every rank it started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from orchestrator.backends.base import PROJECT_ROOT, Backend, Execution, ExitInfo
from orchestrator.errors import BackendUnavailable, LaunchError
from orchestrator.launch import LaunchSpec, workload_argv, workload_env
from orchestrator.matrix import Cell
from orchestrator.placement import Allocation


class ProcessExecution(Execution):
    """A local subprocess in its own session (process group)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc

    def output(self) -> Iterator[bytes]:
        stdout = self.proc.stdout
        assert isinstance(stdout, io.BufferedReader)  # a binary pipe with the default buffer
        while chunk := stdout.read1(65536):
            yield chunk

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            if self.wait(grace):
                return

    def exit_info(self) -> ExitInfo:
        return ExitInfo(code=self.proc.poll())

    def close(self) -> None:
        # The leader may be gone while ranks it started linger: end the whole group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.stdout:
            self.proc.stdout.close()


class ProcessBackend(Backend):
    """Run cells as local subprocesses, one at a time (clean benchmark numbers)."""

    name = "process"

    @classmethod
    def check_available(cls) -> None:
        if importlib.util.find_spec("torch") is None:
            raise BackendUnavailable(
                f"the process backend runs the workload with this Python ({sys.executable}), "
                "which has no torch: install it with `pip install -e '.[workload]'` "
                "(or `make venv`), or choose --backend docker"
            )

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        profile = self.matrix.profile(cell)
        out = str(self.paths.cell_dir(cell.id))
        env = workload_env(cell, profile, allocation.gpu_ids)
        return LaunchSpec(
            cell_id=cell.id,
            argv=tuple(workload_argv(cell, profile, python=sys.executable, output_dir=out)),
            env=env,
            device=profile.device,
            gpu_ids=allocation.gpu_ids,
            workdir=str(PROJECT_ROOT),
            output_dir=out,
            attempt=attempt,
        )

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """Adds the Python environment that ran the workload (no image here)."""
        return {
            **super().provenance(spec),
            "python": sys.executable,
            "python_version": sys.version.split()[0],
            "venv": sys.prefix if sys.prefix != sys.base_prefix else None,
        }

    def launch(self, spec: LaunchSpec) -> Execution:
        env = {**os.environ, **spec.env}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        try:
            proc = subprocess.Popen(
                list(spec.argv), cwd=spec.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {spec.argv[0]!r} for {spec.cell_id}: {exc}") from exc
        return ProcessExecution(proc)
