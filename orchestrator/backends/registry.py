"""The backends' registry: what each backend is, known without importing its module.

A backend is one module (a :class:`~orchestrator.backends.base.Backend`) and one
:class:`BackendRecord`, registered here as ReFrame registers a scheduler with its capabilities.
Everything another layer needs of a backend is a field of its record (where its cells run, what
they run in, whether one cell spans machines, what it needs from its target): the checks, the
runtimes' refusals, the GPU checks, the sweep and the CLI read the record and never compare a
backend's name. This module imports nothing of the backends: reading a record costs no import
of the Docker SDK or paramiko.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

from orchestrator.errors import ConfigError

#: How one cell spans several machines: ``nodes`` (the cell's ``nodes`` parameter: nodes of a
#: scheduler's choosing), ``hosts`` (a profile with ``multi_node = true`` and more GPUs than one
#: host has: hosts of the inventory), ``""`` (never: one machine per cell).
MultiNode = Literal["", "nodes", "hosts"]


@dataclass(frozen=True)
class BackendRecord:
    """What a backend is, known without importing its module: every fact of a backend that
    another layer needs is a field here, read instead of comparing names.

    What it needs on its target is said by these fields (a Docker engine where ``images_on``
    says, a hosts inventory, this machine's GPUs where ``here``) and, in detail, by the
    backend class's ``check_available``, ``runtime_problems`` and ``prepare_problems``."""

    #: ``[matrix] backend`` / ``--backend``, and the class's ``name``.
    name: str
    #: ``"module:Class"``: imported only when the backend is used.
    target: str
    #: What a cell runs in when its profile names no runtime (``none``, ``docker``).
    runtime: str
    #: Every runtime it runs (``apptainer`` stands for ``singularity`` too).
    runtimes: tuple[str, ...]
    #: Its cells run on this machine: the GPU checks probe this machine's GPUs
    #: (:mod:`orchestrator.backends.gpu_checks`), and each cell's result records this machine's
    #: state (:attr:`~orchestrator.backends.base.Backend.records_machine`).
    here: bool = False
    #: How one cell spans several machines (:data:`MultiNode`).
    multi_node: MultiNode = ""
    #: It reads a hosts inventory: ``--hosts`` > ``[matrix] hosts`` > ``$ORCHESTRATE_HOSTS`` >
    #: the config file (:func:`orchestrator.backends.checks.inventory_file`).
    inventory: bool = False
    #: Where it builds the Docker images its cells run, in words (``this machine``, ``each
    #: host``); ``""``: it builds none (an Apptainer ``.sif`` is the runtime's).
    images_on: str = ""
    #: Its cells read files from this machine's filesystem (they run here, or on nodes that
    #: share it, as a Slurm cluster's do): the files they need (a command's ``requires``, a
    #: bind mount's source) are checked here
    #: (:func:`orchestrator.backends.checks.requirement_problems`).
    #: The ssh backend's cells run on lab hosts, which ``validate`` does not contact.
    files_here: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


_REGISTRY: dict[str, BackendRecord] = {}


def register(record: BackendRecord) -> BackendRecord:
    """Add ``record`` to the backends of this build (a name registered again is replaced)."""
    _REGISTRY[record.name] = record
    return record


def unregister(name: str) -> None:
    """Take ``name`` out of the registry (a test's backend, after the test)."""
    _REGISTRY.pop(name, None)


register(BackendRecord(
    "process", "orchestrator.backends.process:ProcessBackend", runtime="none",
    runtimes=("none", "apptainer"), here=True, files_here=True))
register(BackendRecord(
    "docker", "orchestrator.backends.docker:DockerBackend", runtime="docker",
    runtimes=("docker",), here=True, images_on="this machine", files_here=True))
register(BackendRecord(
    "ssh", "orchestrator.backends.ssh:SshDockerBackend", runtime="docker",
    runtimes=("docker", "apptainer"), multi_node="hosts", inventory=True,
    images_on="each host"))
register(BackendRecord(
    "slurm", "orchestrator.backends.slurm:SlurmBackend", runtime="none",
    runtimes=("none", "apptainer"), multi_node="nodes", files_here=True))


def records() -> list[BackendRecord]:
    """The records of the backends this build ships (present modules only), in order."""
    return [r for r in _REGISTRY.values() if importlib.util.find_spec(r.module) is not None]


def backend_names() -> list[str]:
    """Names of the backends this build ships (present modules only)."""
    return [r.name for r in records()]


def find_record(name: str) -> BackendRecord | None:
    """The record of backend ``name``; None: no such backend here."""
    return next((r for r in records() if r.name == name), None)


def backend_record(name: str, *, file: str = "", field: str = "--backend") -> BackendRecord:
    """The record of backend ``name``; an unknown name is a :class:`ConfigError` naming where
    the name came from (``--backend``, or ``file`` and ``field``)."""
    record = find_record(name)
    if record is None:
        raise ConfigError(
            f"unknown backend {name!r}; known: {', '.join(backend_names())}", file=file,
            field=field,
        )
    return record


def runs(runtime: str) -> list[str]:
    """The backends that run ``runtime`` (``none``, ``docker``, ``apptainer``), in order."""
    return [r.name for r in records() if runtime in r.runtimes]
