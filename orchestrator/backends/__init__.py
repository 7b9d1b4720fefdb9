"""Backends: where a cell's workload runs (this machine, a lab host over SSH, a Slurm node).

What the workload runs *in* (this machine's Python, a Docker container, an Apptainer image) is
its runtime (:mod:`orchestrator.runtimes`), an axis beside the backends: a backend asks the
runtime how a cell's argv is wrapped and what the machine needs. Backends are looked up by
name; each lives in its own module and is imported only when used, so planning a matrix never
imports the Docker SDK or paramiko. :mod:`~orchestrator.backends.base` owns what every backend
shares (timeouts, log capture, timing, a result from every outcome); a backend fills in launch
/ poll / logs / cancel. :mod:`~orchestrator.backends.containers` (a started container) and
:mod:`~orchestrator.backends.remote_executions` (a cell's processes on a lab host) are shared by
the docker and ssh backends; :mod:`~orchestrator.backends.slurm_jobs` is the slurm backend's text
(its scripts, Slurm's answers: pure). The backends themselves (process, docker, ssh, slurm)
never import each other. :mod:`~orchestrator.backends.checks` decides, before anything is
built, whether each cell can run on its backend, its runtime and its stack (``validate``,
``--dry-run`` and the sweep's :func:`~orchestrator.backends.checks.preflight` take that one
decision).

May import: errors, config, catalog, plan, results, local, remote, images, runtimes.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend
    from orchestrator.plan.matrix import Matrix

#: name -> "module:Class"
_REGISTRY: dict[str, str] = {
    "process": "orchestrator.backends.process:ProcessBackend",
    "docker": "orchestrator.backends.docker:DockerBackend",
    "ssh": "orchestrator.backends.ssh:SshDockerBackend",
    "slurm": "orchestrator.backends.slurm:SlurmBackend",
}


def backend_names() -> list[str]:
    """Names of the backends this build ships (present modules only)."""
    names = []
    for name, target in _REGISTRY.items():
        module = target.partition(":")[0]
        if importlib.util.find_spec(module) is not None:
            names.append(name)
    return names


def backend_class(name: str, *, file: str = "", field: str = "--backend") -> type[Backend]:
    """The backend class for ``name``; an unknown name is a :class:`ConfigError` naming where
    the name came from (``--backend``, or ``file`` and ``field``)."""
    if name not in backend_names():
        raise ConfigError(
            f"unknown backend {name!r}; known: {', '.join(backend_names())}", file=file,
            field=field,
        )
    module, _, cls = _REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def backend_for(matrix: Matrix, override: str | None = None) -> str:
    """The backend a sweep of ``matrix`` runs on: ``override`` (``--backend``), else
    ``[matrix] backend``."""
    return override or matrix.settings.backend


def pick_backend(matrix: Matrix, override: str | None = None) -> tuple[str, type[Backend]]:
    """The backend's name and class (:func:`backend_for`), checked available here.

    An unknown name is a ConfigError naming where it came from; a backend that cannot run here
    is :class:`~orchestrator.errors.BackendUnavailable`.
    """
    name = backend_for(matrix, override)
    if override:
        cls = backend_class(name)
    else:
        cls = backend_class(name, file=str(matrix.path), field="matrix.backend")
    cls.check_available()
    return name, cls
