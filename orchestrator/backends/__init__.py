"""Backends: where a cell's workload runs (this machine, a lab host over SSH, a Slurm node).

What the workload runs *in* (this machine's Python, a Docker container, an Apptainer image) is
its runtime (:mod:`orchestrator.runtimes`), an axis beside the backends: a backend asks the
runtime how a cell's argv is wrapped and what the machine needs. A backend is one module and
one record: the module (a :class:`~orchestrator.backends.base.Backend`) launches cells, and its
:class:`~orchestrator.backends.registry.BackendRecord`, registered in
:mod:`~orchestrator.backends.registry` as ReFrame registers a scheduler with its capabilities,
says what it is (where its cells run, what they run in, whether one cell spans machines, what it
needs from its target) without importing the module: planning a matrix never imports the Docker
SDK or paramiko, and the checks, the runtimes' refusals, the GPU checks, the sweep and the CLI
read the record, never a backend's name. :mod:`~orchestrator.backends.base` owns what every
backend shares (timeouts, log capture, timing, a result from every outcome); a backend fills in
launch / poll / logs / cancel. :mod:`~orchestrator.backends.containers` (a started container)
and :mod:`~orchestrator.backends.remote_executions` (a cell's processes on a lab host) are
shared by the docker and ssh backends; :mod:`~orchestrator.backends.slurm_jobs` is the slurm
backend's text (its scripts, Slurm's answers: pure). The backends themselves (process, docker,
ssh, slurm) never import each other. :mod:`~orchestrator.backends.checks` decides, before
anything is built, whether each cell can run on its backend, its runtime and its stack
(``validate``, ``--dry-run`` and the sweep's :func:`~orchestrator.backends.checks.preflight`
take that one decision); :mod:`~orchestrator.backends.target` tells what the target lacks
(requirements: refused by ``validate`` and the sweep, listed by ``plan`` and ``--dry-run`` after
the plan) from what the file gets wrong.

May import: errors, config, catalog, plan, results, local, remote, images, runtimes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from orchestrator.backends.registry import (
    BackendRecord,
    MultiNode,
    Need,
    backend_names,
    backend_record,
    find_record,
    records,
    register,
    runs,
    unregister,
)

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend
    from orchestrator.plan.matrix import Matrix

__all__ = [
    "BackendRecord", "MultiNode", "Need", "backend_class", "backend_for", "backend_names",
    "backend_record", "find_record", "records", "register", "runs", "unregister",
]


def backend_class(name: str, *, file: str = "", field: str = "--backend") -> type[Backend]:
    """The backend class for ``name`` (its module imported now); an unknown name is a
    :class:`ConfigError` as :func:`backend_record` says."""
    module, _, cls = backend_record(name, file=file, field=field).target.partition(":")
    return getattr(importlib.import_module(module), cls)


def backend_for(matrix: Matrix, override: str | None = None) -> str:
    """The backend a sweep of ``matrix`` runs on: ``override`` (``--backend``), else
    ``[matrix] backend``."""
    return override or matrix.settings.backend
