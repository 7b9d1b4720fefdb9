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
class Need:
    """One thing a backend needs on its target, in words: what (``kind``: ``engine``,
    ``scheduler``, ``python``, ...) and how to meet it. ``on``: ``here`` (the machine the sweep
    runs from: checked there by the backend's ``check_available``), or ``cells`` (where the
    cells run, when that is not the sweep's machine: a lab host, a Slurm node; never contacted
    by ``plan``, ``validate`` or a dry run)."""

    kind: str
    what: str
    how: str = ""
    on: Literal["here", "cells"] = "here"


@dataclass(frozen=True)
class BackendRecord:
    """What a backend is, known without importing its module: every fact of a backend that
    another layer needs is a field here, read instead of comparing names.

    What it needs on its target is said by these fields (a Docker engine where ``images_on``
    says, a hosts inventory, this machine's GPUs where ``here``; ``needs``: the rest, in
    words, for ``plan`` and ``--dry-run`` to list) and, in detail, by the backend class's
    ``check_available``, ``target_problems``, ``runtime_problems`` and ``prepare_problems``."""

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
    #: What it needs on its target beyond the cells' own requirements (:class:`Need`): checked
    #: on this machine where ``on = "here"``; listed for ``plan`` and ``--dry-run`` to say
    #: what a target they do not probe (a declared ``--target``, lab hosts, Slurm nodes) must
    #: have.
    needs: tuple[Need, ...] = ()

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
    runtimes=("none", "apptainer"), here=True, files_here=True, needs=(
        Need("python", "this Python with torch and torchvision (the workload's dependencies)",
             "pip install -e '.[workload]' (or make venv)"),
    )))
register(BackendRecord(
    "docker", "orchestrator.backends.docker:DockerBackend", runtime="docker",
    runtimes=("docker",), here=True, images_on="this machine", files_here=True, needs=(
        Need("engine", "a Docker engine this user may use (DOCKER_HOST, else "
             "/var/run/docker.sock) with the images' base images, and NVIDIA's container "
             "toolkit for GPU cells", "start dockerd, or point DOCKER_HOST at an engine"),
    )))
register(BackendRecord(
    "ssh", "orchestrator.backends.ssh:SshDockerBackend", runtime="docker",
    runtimes=("docker", "apptainer"), multi_node="hosts", inventory=True,
    images_on="each host", needs=(
        Need("python", "the Docker SDK and paramiko in this Python",
             "pip install -e . (they are orchestrate's dependencies)"),
        Need("engine", "on each host of the inventory: SSH access as the inventory says, a "
             "Docker engine, NVIDIA's container toolkit for GPU cells, the images' base "
             "images or a registry", "orchestrate hosts check HOSTS.toml asks each host",
             on="cells"),
    )))
register(BackendRecord(
    "slurm", "orchestrator.backends.slurm:SlurmBackend", runtime="none",
    runtimes=("none", "apptainer"), multi_node="nodes", files_here=True, needs=(
        Need("scheduler", "the Slurm client tools (sbatch, squeue, scancel, scontrol) and a "
             "controller that answers", "run from a login node of the cluster (slurm-client "
             "with its slurm.conf, or SLURM_CONF)"),
        Need("data", "nodes that share this machine's filesystem: this checkout, this Python, "
             "the results folder, the files the cells need",
             "run from a login node whose home or project folder the nodes mount", on="cells"),
    )))


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
