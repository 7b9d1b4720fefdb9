"""What the benchmarks that run ``python -m workload`` share: starting a run and stopping it
with everything it started, reading its JSON lines, and printing a table.

Only the standard library, tabulate and this checkout's
``workload``/``orchestrator.results.folders.run_folder``
(both stdlib-only), so it runs on a GPU machine that has PyTorch but no orchestrator install.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
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
        stdout, stderr = stop_session(proc)
        return WorkloadRun(proc.returncode, parse_metric_lines(stdout), stderr, timed_out=True)
    except BaseException:  # the benchmark itself is stopped (SIGTERM: stop_on_sigterm, Ctrl-C)
        stop_session(proc)
        raise
    return WorkloadRun(proc.returncode, parse_metric_lines(stdout), stderr)


def stop_session(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Stop the run ``proc`` started in a session of its own, and only it: SIGTERM to its
    process group (by its id), SIGKILL 15 s later; what it printed."""
    stdout, stderr = "", ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            stdout, stderr = proc.communicate(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
    return stdout, stderr


def stop_on_sigterm() -> None:
    """SIGTERM (a time box's ``timeout``, benchmarks/gpu_session.sh) ends the benchmark as
    Ctrl-C does, through its ``finally`` blocks: the runs it started are stopped by their ids
    (:func:`run_workload`), none is left behind and no one else's process is touched."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


#: The exit status of a benchmark that cannot run on this machine (as the sweep's when the
#: machine lacks a requirement).
CANNOT_RUN = 3


def cannot_run(why: str) -> int:
    """Say why the benchmark cannot run here (one line on stderr); :data:`CANNOT_RUN`."""
    print(f"cannot run here: {why}", file=sys.stderr)
    return CANNOT_RUN


def dry_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--dry``: ``what`` (a few seconds on this machine), or why it cannot run here."""
    parser.add_argument("--dry", action="store_true",
                        help=f"a few seconds' check: {what}; or why it cannot run here "
                        f"(exit {CANNOT_RUN})")


def nvidia_gpus() -> int:
    """GPUs ``nvidia-smi -L`` lists (0 without nvidia-smi): a look that needs no torch."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


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


def docker_problem(image: str | None = None) -> str | None:
    """Why the benchmark's Docker engine (and ``image`` on it) cannot serve here; None when it
    can. Asks the engine only."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # no engine, no permission: the docker package's own errors
        return f"no Docker engine answers ({type(exc).__name__})"
    try:
        if image is not None:
            client.images.get(image)
    except Exception:
        return f"the image {image} is not on this engine"
    finally:
        client.close()
    return None
