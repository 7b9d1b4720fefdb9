"""Shared by the real-service fixtures (Docker, sshd, Slurm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest


def unavailable(reason: str) -> None:
    """Skip the test, or fail it under ``CI=true``, where every service must be running."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def communicate_or_dump(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout)`` of an ``orchestrate`` process; if it does not end in time,
    fail the test with every thread's stack (the CLI prints them on SIGUSR1) and kill it, so that
    a stuck sweep neither goes unexplained nor keeps its locks for the tests after it."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"orchestrate did not end within {timeout:g} s; its threads:\n{err[-20000:]}"
                    f"\n--- stdout:\n{out[-3000:]}")
