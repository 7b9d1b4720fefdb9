"""What the benchmarks that run ``python -m workload`` share: starting a run and stopping it
with everything it started, reading its JSON lines, and printing a table.

Only the standard library, tabulate and this checkout's
``workload``/``orchestrator.results.folders.run_folder``
(both stdlib-only), so it runs on a GPU machine that has PyTorch but no orchestrator install.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tabulate import tabulate

from orchestrator.results.folders.run_folder import parse_metric_lines

REPO = Path(__file__).resolve().parents[1]


@dataclass
class WorkloadRun:
    """A finished (or stopped) workload run."""

    returncode: int | None
    lines: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    timed_out: bool = False

    @property
    def summary(self) -> dict[str, Any] | None:
        """The summary line, if the run ended with one and exited 0."""
        if self.returncode == 0 and self.lines and self.lines[-1].get("type") == "summary":
            return self.lines[-1]
        return None

    def failure(self, timeout: float) -> str:
        """Why there is no summary, in one line."""
        if self.timed_out:
            return f"timed out after {timeout:g} s"
        message = (self.lines[-1].get("message") if self.lines else None) or self.stderr[-300:]
        return f"rc {self.returncode}: {message.strip()}"


def run_workload(
    cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> WorkloadRun:
    """Run ``cmd`` from the checkout in a session of its own and parse its JSON lines.

    At the timeout it gets SIGTERM first: torchrun then stops its ranks, which run in sessions
    of their own and would outlive a SIGKILL of torchrun's group; SIGKILL 15 s later.
    """
    proc = subprocess.Popen(
        list(cmd), cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                stdout, stderr = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        return WorkloadRun(proc.returncode, parse_metric_lines(stdout), stderr, timed_out=True)
    return WorkloadRun(proc.returncode, parse_metric_lines(stdout), stderr)


def gpu_count() -> int:
    """CUDA GPUs visible to torch (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def fmt(value: float | None, digits: int = 1) -> str:
    """A figure for a table cell, '-' when there is none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table."""
    return tabulate(rows, headers=list(header), disable_numparse=True)
