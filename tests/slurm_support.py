"""Pytest fixtures: a real single-node Slurm cluster (slurmctld + slurmd on this machine).

``slurm_cluster`` (session scope) runs ``tests/infra/start-slurm.sh``, which is idempotent: it
writes a slurm.conf with one node ``localhost`` and 4 placeholder GPUs, starts munge, slurmctld
and slurmd, and waits until the node is idle. The fake GPUs only exercise ``--gres`` and
``CUDA_VISIBLE_DEVICES``; no CUDA job can run on them.

Without ``sbatch`` (or without root to start the daemons) the tests are skipped with the reason
shown, unless ``CI=true``: then they fail, because CI must install slurm-wlm.

``no_jobs_left`` wraps it for a test that must leave no job of ours queued.

Registered by ``pytest_plugins`` in tests/conftest.py (some modules also import
``slurm_cluster`` by name).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from service_support import unavailable

START_SCRIPT = Path(__file__).resolve().parent / "infra" / "start-slurm.sh"


def squeue_ids(prefix: str = "orchestrate-") -> list[str]:
    """Ids of the jobs in Slurm's queue whose name starts with ``prefix``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return [line.split("|")[0] for line in out.splitlines()
            if line.split("|")[1].startswith(prefix)]


def job_state(job_id: str) -> str | None:
    """``JobState`` of a job Slurm still remembers (``scontrol show job``), else None."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, timeout=30)
    for word in proc.stdout.split():
        if word.startswith("JobState="):
            return word.partition("=")[2]
    return None


def wait_until_gone(job_ids: list[str], timeout: float = 60.0) -> list[str]:
    """Wait until none of ``job_ids`` is in the queue; returns the ones still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j in squeue_ids() if j in job_ids]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster."""

    node: str = "localhost"
    partition: str = "debug"
    gpus: int = 4


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Start (or reuse) the single-node test cluster."""
    if shutil.which("sbatch") is None:
        unavailable("sbatch not found: apt-get install -y slurm-wlm")
    if os.geteuid() != 0:
        proc = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            unavailable("Slurm is not running and starting it needs root "
                         f"(bash {START_SCRIPT})")
        return SlurmCluster()
    proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True,
                          timeout=180)
    if proc.returncode != 0:
        pytest.fail(f"{START_SCRIPT} failed:\n{proc.stdout}\n{proc.stderr}")
    return SlurmCluster()


@pytest.fixture
def no_jobs_left(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, for a test that must leave no job of ours in Slurm's queue (it fails if it
    does, 30 s after it ends)."""
    before = set(squeue_ids())
    yield slurm_cluster
    left = wait_until_gone([j for j in squeue_ids() if j not in before], timeout=30)
    assert left == [], f"jobs left in Slurm's queue: {left}"
