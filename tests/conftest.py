"""Shared fixtures. Docker and SSH fixtures live in their own plugin modules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from standin_support import Standin  # noqa: E402 - tests/ is on sys.path (rootdir conftest)

# The tiers (unit / workload / integration, derived from the fixtures a test uses; see
# tiers_support.py). Fixtures for real services: a Docker engine and a local base image; sshd
# hosts on loopback; the single-node Slurm cluster (and no_jobs_left); stand-in GPUs (gpu_machine);
# an MLflow tracking server and an HTTP collector (mlflow_server, http_collector).
pytest_plugins = ["tiers_support", "docker_support", "ssh_support", "slurm_support",
                  "gpu_support", "publish_support"]

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


@pytest.fixture(scope="session")
def torch() -> Any:
    """The torch module (skipped where torch is not installed): a test that takes it is in the
    workload tier. Test modules never import torch at module level, so that the suite collects
    without torch and the unit tier never pays for importing it."""
    return pytest.importorskip("torch")


@pytest.fixture(scope="session")
def workload_python() -> str:
    """This interpreter, to run the real workload in a subprocess (skipped where torch is not
    installed; torch is found, not imported): a test that takes it is in the workload tier."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the workload extra)")
    return sys.executable


@pytest.fixture(scope="session")
def floor_python() -> str:
    """The floor torch/torchvision interpreter (``ORCHESTRATE_FLOOR_PYTHON``; skipped, or failed
    under ``CI=true``, without it): workload tier."""
    from workload_support import floor_python as find

    return find()


@pytest.fixture(scope="session")
def standin() -> Standin:
    """The STAND-IN workload (tests/standin/workload_standin.py, see standin_support.py): cells
    that run it start processes, so a test that takes it is in the integration tier."""
    return Standin()


@pytest.fixture
def orchestrate_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real console entry point in a fresh interpreter:
    ``orchestrate_cli(*args, cwd=ROOT, env=None, timeout=120, module="orchestrator")`` runs
    ``python -m orchestrator ARGS`` (``env``: added to this environment; ``module=None``: ``python
    ARGS``, e.g. ``-c CODE``). A test that takes it starts processes: integration tier."""

    def run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
            timeout: float = 120, module: str | None = "orchestrator"
            ) -> subprocess.CompletedProcess[str]:
        prefix = [sys.executable] if module is None else [sys.executable, "-m", module]
        return subprocess.run([*prefix, *args], capture_output=True, text=True, cwd=cwd,
                              timeout=timeout, env={**os.environ, **(env or {})})

    return run


@pytest.fixture(scope="session")
def dllogger_program() -> Callable[..., Any]:
    """:func:`dllogger_support.run_program` (the real DLLogger writing a program's logs, in a
    process of its own): a test that takes it is integration-tier."""
    from dllogger_support import run_program

    return run_program


@pytest.fixture
def tmpfs() -> Callable[..., Any]:
    """:func:`fs_support.tmpfs` (mounts a real tmpfs, as root): a test that takes it starts
    processes (``mount``): integration tier."""
    from fs_support import tmpfs

    return tmpfs


@pytest.fixture(autouse=True, scope="session")
def _own_lock_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tests' sweeps lock GPUs in a folder of their own (and their subprocesses too), never
    in the machine's /tmp/orchestrate-locks where a real sweep may be running."""
    os.environ.setdefault("ORCHESTRATE_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))


@pytest.fixture(autouse=True, scope="session")
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The indexes of the read-only results folders the tests read go to a folder of this
    session (and its subprocesses'), never to the user's ~/.cache/orchestrate (a fresh-HOME CI
    run found 17 there)."""
    os.environ["ORCHESTRATE_CACHE"] = str(tmp_path_factory.mktemp("orchestrate-cache"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every sweep records the checkout's git revision (``git rev-parse``, cached per process):
    asked once here, before any test, so that in-process sweeps of the unit tier start no
    process of their own. (Under the floor venv the orchestrator is not importable: nothing
    to ask.)"""
    try:
        from orchestrator.backends.base import git_revision
    except ImportError:
        return
    git_revision()
