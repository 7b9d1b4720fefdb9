"""Pytest fixtures: a real single-node Slurm cluster (slurmctld + slurmd on this machine).

``slurm_cluster`` (session scope) runs ``tests/infra/start-slurm.sh``, which is idempotent: it
writes a slurm.conf with one node ``localhost`` and 4 placeholder GPUs, starts munge, slurmctld
and slurmd, and waits until the node is idle. The fake GPUs only exercise ``--gres`` and
``CUDA_VISIBLE_DEVICES``; no CUDA job can run on them.

Without ``sbatch`` (or without root to start the daemons) the tests are skipped with the reason
shown, unless ``CI=true``: then they fail, because CI must install slurm-wlm.

``no_jobs_left`` wraps it for a test that must leave no job of ours queued.

``multinode_cluster`` (session scope) runs ``tests/infra/start-slurm-multinode.sh``: a second
cluster beside the first (cluster ``orchestrate-mn``, its own ports and state), two nodes ``mn1``
and ``mn2`` as slurmd in network namespaces of their own (distinct addresses and hostnames, 4
CPUs and 4 fake GPUs each), accounting in slurmdbd (sacct), partitions ``batch`` (default,
preemptable) and ``urgent`` (preempts ``batch``). Tests reach it with
``SLURM_CONF=MultiNodeCluster.conf`` (a profile's ``slurm.conf`` or the environment).

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
MULTINODE_SCRIPT = Path(__file__).resolve().parent / "infra" / "start-slurm-multinode.sh"


def _env(conf: str | None) -> dict[str, str] | None:
    return {**os.environ, "SLURM_CONF": conf} if conf else None


def squeue_ids(prefix: str = "orchestrate-", conf: str | None = None) -> list[str]:
    """Ids of the jobs in Slurm's queue whose name starts with ``prefix`` (``conf``: of that
    cluster)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True,
                         timeout=30, check=True, env=_env(conf)).stdout
    return [line.split("|")[0] for line in out.splitlines()
            if line.split("|")[1].startswith(prefix)]


def job_state(job_id: str, conf: str | None = None) -> str | None:
    """``JobState`` of a job Slurm still remembers (``scontrol show job``), else None."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, timeout=30, env=_env(conf))
    for word in proc.stdout.split():
        if word.startswith("JobState="):
            return word.partition("=")[2]
    return None


def wait_until_gone(job_ids: list[str], timeout: float = 60.0, conf: str | None = None
                    ) -> list[str]:
    """Wait until none of ``job_ids`` is in the queue; returns the ones still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = [j for j in squeue_ids(conf=conf) if j in job_ids]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster."""

    node: str = "localhost"
    partition: str = "debug"
    gpus: int = 4


def _start_or_reuse(script: Path, probe: list[str], not_running: str, *,
                    start_timeout: float) -> None:
    """As root, run the (idempotent) start ``script``, failing the test if it fails; otherwise
    reuse the running cluster (``probe`` exits 0), or mark it unavailable."""
    if os.geteuid() != 0:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            unavailable(f"{not_running} and starting it needs root (bash {script})")
        return
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                          timeout=start_timeout)
    if proc.returncode != 0:
        pytest.fail(f"{script} failed:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """Start (or reuse) the single-node test cluster."""
    if shutil.which("sbatch") is None:
        unavailable("sbatch not found: apt-get install -y slurm-wlm")
    _start_or_reuse(START_SCRIPT, ["sinfo", "-h"], "Slurm is not running", start_timeout=180)
    return SlurmCluster()


@pytest.fixture
def no_jobs_left(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster, for a test that must leave no job of ours in Slurm's queue (it fails if it
    does, 30 s after it ends)."""
    before = set(squeue_ids())
    yield slurm_cluster
    left = wait_until_gone([j for j in squeue_ids() if j not in before], timeout=30)
    assert left == [], f"jobs left in Slurm's queue: {left}"


@dataclass(frozen=True)
class MultiNodeCluster:
    """The running two-node test cluster (tests/infra/start-slurm-multinode.sh)."""

    conf: str = "/etc/orchestrate-slurm-mn/slurm.conf"
    nodes: tuple[str, ...] = ("mn1", "mn2")
    partition: str = "batch"
    urgent: str = "urgent"
    cpus_per_node: int = 4
    gpus_per_node: int = 4

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client of this cluster (``scontrol ...``, ``sacct ...``)."""
        return subprocess.run(list(args), capture_output=True, text=True, timeout=60,
                              check=check, env=_env(self.conf))

    def node_state(self, node: str) -> str:
        return self.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.split()[0]

    def wait_idle(self, timeout: float = 90.0) -> None:
        """Until every node takes jobs again (after a test took one down); resumes them."""
        deadline = time.monotonic() + timeout
        while True:
            states = {n: self.node_state(n) for n in self.nodes}
            if all(s in ("idle", "mixed", "allocated") for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not back: {states}")
            for node, state in states.items():
                if state.startswith(("down", "drain")):
                    self.run("scontrol", "update", f"nodename={node}", "state=resume",
                             check=False)
            time.sleep(1.0)


@pytest.fixture(scope="session")
def multinode_cluster() -> MultiNodeCluster:
    """Start (or reuse) the two-node test cluster."""
    if shutil.which("sbatch") is None or shutil.which("slurmdbd") is None:
        unavailable("the multi-node cluster needs slurm-wlm, slurmdbd and mariadb-server "
                    "(apt-get install -y slurm-wlm slurmdbd mariadb-server)")
    _start_or_reuse(MULTINODE_SCRIPT, ["bash", str(MULTINODE_SCRIPT), "--status"],
                    "the multi-node cluster is not running", start_timeout=300)
    return MultiNodeCluster()
