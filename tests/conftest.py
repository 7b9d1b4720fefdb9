"""Shared fixtures. Docker and SSH fixtures live in their own plugin modules."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Fixtures for real services: a Docker engine and a local base image; sshd hosts on loopback;
# the single-node Slurm cluster (and no_jobs_left).
pytest_plugins = ["docker_support", "ssh_support", "slurm_support", "gpu_support"]

CPU_PROFILE = """
[hardware.cpu]
device = "cpu"
"""


@pytest.fixture
def write_matrix(tmp_path: Path) -> Callable[..., Path]:
    """Write a matrix file from TOML text (dedented); adds a cpu profile unless told not to."""

    def write(text: str, name: str = "m.toml", cpu_profile: bool = True) -> Path:
        body = textwrap.dedent(text)
        if cpu_profile and "[hardware.cpu]" not in body:
            body += CPU_PROFILE
        path = tmp_path / name
        path.write_text(body, encoding="utf-8")
        return path

    return write


@pytest.fixture(autouse=True, scope="session")
def _own_lock_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tests' sweeps lock GPUs in a folder of their own (and their subprocesses too), never
    in the machine's /tmp/orchestrate-locks where a real sweep may be running."""
    import os

    os.environ.setdefault("ORCHESTRATE_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
