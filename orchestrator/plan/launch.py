"""From a cell to the command that runs it: the same argv for every backend.

A cell's command is a list of arguments, never a shell string: backends hand it to
``subprocess`` (argv), the Docker SDK (a list ``command``), or quote each element with
:func:`shlex.quote` before a remote shell sees it.

**The program** is one concept, asked the same way by every backend: :func:`cell_command` turns
a cell and its :class:`~orchestrator.config.matrix_file.Program` (our workload, or a
``[commands.NAME]``
template: :meth:`orchestrator.plan.matrix.Matrix.program`) into a :class:`CellCommand` (argv,
environment, working directory, and what ran for the provenance), given what only the backend
knows: the Python where the cell runs, the cell's folder as the program sees it, the local GPU
ids to pin, the node's role in a multi-node cell.

A command is built in layers, each a function of plain values:

1. the program: our workload and its flags (:func:`workload_flags`), or the template rendered
   for the cell (:meth:`~orchestrator.config.matrix_file.CommandTemplate.render`: each value one
   argv
   item, a list mapping several);
2. its launcher: for the workload, ``python -m`` or torchrun for several processes
   (:func:`python_launcher`); for a command, nothing for one process, ``python -m
   torch.distributed.run ... --no_python`` for several (one process per GPU with torchrun's
   environment), nothing either when the command spawns its own ranks (``launcher = "self"``);
   standalone, or as one node of a multi-node cell (:class:`NodeRole`);
3. the profiler and runtime wrappers (nsys/ncu/nvprof under their capture ranges,
   :mod:`orchestrator.plan.profilers`; ``bitfusion run``), the same for every program.

The environment (:func:`workload_env`) pins the local GPUs (``CUDA_VISIBLE_DEVICES``) and the
Gaudi mode for every program; a command adds its own ``env``.
:class:`LaunchSpec` is everything a backend needs to start one cell, decided before it starts.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.matrix_file import (
    WORKLOAD_PROGRAM,
    WRAPPING_PROFILERS,
    CellParams,
    CommandTemplate,
    ContainerOptions,
    HardwareProfile,
    Program,
    command_values,
)
from orchestrator.config.redact import redact_env
from orchestrator.errors import LaunchError
from orchestrator.plan import profilers
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import Allocation, holds_local_gpus

#: Multi-node rendezvous ports: RDZV_PORT_BASE + (a hash of the cell id) % RDZV_PORT_SPAN.
RDZV_PORT_BASE = 29400
RDZV_PORT_SPAN = 500


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a backend needs to start one cell, decided before it starts."""

    cell_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    device: str
    gpu_ids: tuple[int, ...] = ()
    image: str | None = None
    container: ContainerOptions | None = None
    workdir: str | None = None
    output_dir: str | None = None
    host: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: 1, or more when the cell is retried after its host was lost.
    attempt: int = 1
    #: The cell's memory limit (``512m``, ``16g``) where the backend applies it outside a
    #: container (the process backend's cgroup); containers carry theirs in ``container``.
    mem_limit: str | None = None
    #: A multi-node cell's other nodes (1..n-1), each a spec of its own; this spec is node 0.
    peers: tuple[LaunchSpec, ...] = ()
    #: A batch script that runs ``argv`` (Slurm's job.sbatch), rendered with the spec; None where
    #: the backend starts ``argv`` itself. Written beside command.json, not into it.
    script: str | None = field(default=None, repr=False)
    #: What program runs (:attr:`CellCommand.program`): its name, and for a command template
    #: the template, its rendered argv items, launcher and figures parser.
    program: dict[str, Any] = field(default_factory=dict)
    #: The container runtime that runs ``argv`` when the backend starts it as a process
    #: (Apptainer: :func:`orchestrator.runtimes.apptainer.runtime_record`: its name, binary,
    #: image and the prefix of the variables the launcher passes); empty otherwise.
    runtime: dict[str, Any] = field(default_factory=dict)

    @property
    def hosts(self) -> tuple[str, ...]:
        """A multi-node cell's hosts (the first is the rendezvous); empty for one node."""
        if not self.peers:
            return ()
        return tuple(node.host for node in self.nodes if node.host is not None)

    @property
    def nodes(self) -> tuple[LaunchSpec, ...]:
        """This spec and its peers: what runs, one spec per node."""
        return (self, *self.peers)

    def shell_line(self) -> str:
        """The command as one safely quoted line (for logs and remote shells)."""
        return " ".join(map(quote, self.argv))

    def to_json(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "argv": list(self.argv),
            "shell": self.shell_line(),
            "env": redact_env(self.env),  # secrets masked; $env:NAME references as written
            "device": self.device,
            "gpu_ids": list(self.gpu_ids),
            "image": self.image,
            "container": self.container.model_dump() if self.container else None,
            "workdir": self.workdir,
            "output_dir": self.output_dir,
            "host": self.host,
            "hosts": list(self.hosts),
            "attempt": self.attempt,
            "labels": self.labels,
            **({"mem_limit": self.mem_limit} if self.mem_limit else {}),
            **({"program": self.program} if self.program else {}),
            **({"runtime": self.runtime} if self.runtime else {}),
        }


@functools.lru_cache(maxsize=65536)
def quote(word: str) -> str:
    """``word`` as one shell word (:func:`shlex.quote`); each word quoted once (the cells of a
    matrix share most of theirs: flags, values, the launcher)."""
    return shlex.quote(word)


def workload_flags(cell: Cell) -> list[str]:
    """``--key value`` for every workload parameter; booleans as ``--flag`` / ``--no-flag``."""
    return list(_flags(cell.params))


@functools.lru_cache(maxsize=8192)
def _flags(params: CellParams) -> tuple[str, ...]:
    """:func:`workload_flags` of ``params``, made once per configuration (its repeats share
    their parameters)."""
    flags: list[str] = []
    for key, value in params.workload_params().items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return tuple(flags)


@dataclass(frozen=True)
class NodeRole:
    """One node's part in a multi-node cell: torchrun with a static rendezvous.

    Node ``rank`` of ``nnodes`` starts ``nproc`` processes; node 0 hosts the rendezvous store at
    ``endpoint`` (``HOST:PORT``); every node names the same ``rdzv_id`` (the cell id). Static
    rendezvous: the node ranks are the ones given, nothing is negotiated.
    """

    nnodes: int
    rank: int
    nproc: int
    endpoint: str
    rdzv_id: str

    def __post_init__(self) -> None:
        if self.nnodes < 2 or not 0 <= self.rank < self.nnodes:
            raise ValueError(f"node rank {self.rank} of {self.nnodes}: a multi-node cell needs "
                             "two or more nodes and a rank below their count")
        if self.nproc < 1:
            raise ValueError(f"node {self.rank} of {self.rdzv_id} has no process to start")

    def torchrun_flags(self) -> list[str]:
        """torchrun's flags for this node."""
        return [
            f"--nnodes={self.nnodes}", f"--node_rank={self.rank}",
            f"--nproc_per_node={self.nproc}", "--rdzv_backend=static",
            f"--rdzv_endpoint={self.endpoint}", f"--rdzv_id={self.rdzv_id}",
        ]


@dataclass(frozen=True)
class ScheduledNodes:
    """Every node of a multi-node cell whose nodes a scheduler picks as the job starts (Slurm).

    All ``nnodes`` nodes run the same argv: torchrun with a static rendezvous, ``nproc``
    processes each, the same ``rdzv_id`` (the cell id). What only the job knows comes from each
    node's environment, as torchrun reads it for a flag not given: ``PET_NODE_RANK`` (its
    ``--node_rank``) and ``PET_RDZV_ENDPOINT`` (``--rdzv_endpoint``, the first node of the
    allocation), both set by the job script (:mod:`orchestrator.backends.slurm`).
    """

    nnodes: int
    nproc: int
    rdzv_id: str

    def __post_init__(self) -> None:
        if self.nnodes < 2:
            raise ValueError(f"{self.rdzv_id}: a multi-node cell needs two or more nodes")
        if self.nproc < 1:
            raise ValueError(f"{self.rdzv_id}: its nodes have no process to start")

    def torchrun_flags(self) -> list[str]:
        """torchrun's flags, the same on every node."""
        return [f"--nnodes={self.nnodes}", f"--nproc_per_node={self.nproc}",
                "--rdzv_backend=static", f"--rdzv_id={self.rdzv_id}"]


#: A node's part in a multi-node cell: placed by us (ssh) or by the scheduler (Slurm).
NodeLaunch = NodeRole | ScheduledNodes


def rdzv_port(cell_id: str) -> int:
    """A stable rendezvous port for a cell (distinct cells rarely share one)."""
    digest = hashlib.sha256(cell_id.encode()).digest()
    return RDZV_PORT_BASE + int.from_bytes(digest[:4], "big") % RDZV_PORT_SPAN


def node_roles(allocation: Allocation, rendezvous_address: str) -> list[NodeRole]:
    """The role of every node of a multi-node ``allocation``, one per slot, in slot order.

    Node 0 (the first slot's host, reached at ``rendezvous_address``) hosts the rendezvous; each
    node starts one process per GPU of its slot.
    """
    endpoint = f"{rendezvous_address}:{rdzv_port(allocation.cell_id)}"
    return [
        NodeRole(len(allocation.slots), rank, len(slot.gpu_ids), endpoint, allocation.cell_id)
        for rank, slot in enumerate(allocation.slots)
    ]


def torchrun(python: str, gpus: int, node: NodeLaunch | None = None) -> list[str]:
    """torchrun and its flags: standalone with one process per GPU, or as ``node`` of a
    multi-node cell (what it starts follows)."""
    flags = node.torchrun_flags() if node is not None else [
        "--standalone", f"--nproc_per_node={gpus}"]
    return [python, "-m", "torch.distributed.run", *flags]


def python_launcher(python: str, gpus: int, node: NodeLaunch | None = None) -> list[str]:
    """How a Python module is started, up to where its name goes: ``python -m`` for one
    process, torchrun for several (standalone, or as ``node`` of a multi-node cell)."""
    if node is not None or gpus > 1:
        return [*torchrun(python, gpus, node), "-m"]
    return [python, "-m"]


@dataclass(frozen=True)
class CellCommand:
    """What a backend starts for a cell, whatever its program."""

    argv: list[str]
    env: dict[str, str]
    #: The program's working directory (a command's ``workdir``, resolved); None: the
    #: backend's own (this checkout, the image's WORKDIR).
    workdir: str | None
    #: For command.json and the result's provenance: the program's name and, for a command
    #: template, the template, its rendered argv items, launcher, working directory and the
    #: parser that reads its figures.
    program: dict[str, Any]


def cell_command(
    cell: Cell,
    profile: HardwareProfile,
    program: Program,
    *,
    python: str = "python",
    output_dir: str | None = None,
    gpu_ids: tuple[int, ...] = (),
    node: NodeLaunch | None = None,
    environ: Mapping[str, str] | None = None,
) -> CellCommand:
    """The command of ``cell`` running ``program``, as every backend starts it.

    ``python``: the interpreter where the cell runs; ``output_dir``: the cell's folder as the
    program sees it; ``gpu_ids``: local GPUs to pin with the environment (none where a device
    request or Slurm picks them); ``node``: this node's role in a multi-node cell;
    ``environ``: where ``$env:NAME`` in a command's ``workdir`` is read (default: this
    process's environment; one that is not set leaves the reference as written:
    :func:`resolve_workdir`).
    """
    env = workload_env(cell, profile, gpu_ids)
    command = program.command
    if command is None:
        argv = workload_argv(cell, profile, python=python, output_dir=output_dir, node=node)
        return CellCommand(argv, env, None, {"name": WORKLOAD_PROGRAM, "parser": program.parser})
    items = command.render(command_values(cell.params, program.name, python=python,
                                          output_dir=output_dir or ".", cell_id=cell.id))
    launcher = command_launcher(command, python, cell.params.gpus, node)
    argv = wrap_command(cell, profile, [*launcher, *items], output_dir, python)
    env.update(command.env)
    workdir = resolve_workdir(command.workdir, environ)
    record = {"name": program.name, "command": command.command, "argv": items,
              "launcher": command.launcher, "workdir": workdir, "parser": program.parser}
    return CellCommand(argv, env, workdir, record)


def command_launcher(command: CommandTemplate, python: str, gpus: int,
                     node: NodeLaunch | None = None) -> list[str]:
    """What starts a command template's argv: nothing for one process or a program that
    spawns its own ranks; torchrun with ``--no_python`` (the argv is run as it is, one process
    per GPU) for several, standalone or as ``node`` of a multi-node cell."""
    if command.launcher == "self":
        if node is not None:
            raise LaunchError("a command with launcher = 'self' runs on one host; this cell "
                              "spans several")
        return []
    if node is not None or gpus > 1:
        return [*torchrun(python, gpus, node), "--no_python"]
    return []


def resolve_workdir(workdir: str | None, environ: Mapping[str, str] | None = None
                    ) -> str | None:
    """A command's ``workdir``: ``$env:NAME`` read from ``environ`` (default: this process's
    environment), which must hold an absolute path. Not set: the reference as written (the
    one decision refuses a sweep whose variable is not set, before any cell's command is made;
    a dry run shows where the program would run)."""
    if workdir is None or not workdir.startswith("$env:"):
        return workdir
    name = workdir[len("$env:"):]
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        return workdir
    if not value.startswith("/"):
        raise LaunchError(f"workdir {workdir!r}: ${name} is {value!r}, not an absolute path")
    return value


def workload_argv(
    cell: Cell,
    profile: HardwareProfile,
    *,
    python: str = "python",
    output_dir: str | None = None,
    node: NodeLaunch | None = None,
) -> list[str]:
    """The full command of a cell: profiler and runtime wrappers, the launcher, the workload.

    ``node``: this node's role when the cell spans several hosts (else torchrun is standalone).
    """
    gpus = cell.params.gpus
    launcher = python_launcher(python, gpus, node)
    argv = [*launcher, "workload", *workload_flags(cell), "--device", profile.device]
    mode = hpu_mode(cell.params, profile.device)
    if mode is not None and cell.params.hpu_mode is None:
        argv += ["--hpu-mode", mode]  # the mode the environment below selects, said explicitly
    if output_dir:
        argv += ["--output-dir", output_dir]
    if profile.checkpoint_dir:
        argv += ["--checkpoint-dir", profile.checkpoint_dir]
    return wrap_command(cell, profile, argv, output_dir, python)


def wrap_command(cell: Cell, profile: HardwareProfile, argv: list[str],
                 output_dir: str | None, python: str) -> list[str]:
    """``argv`` under the cell's profiler (:func:`profiler_wrap`), then under ``bitfusion
    run`` (:func:`bitfusion_wrap`) where the profile's wrapper is Bitfusion: the same for
    every program."""
    argv = profiler_wrap(cell, profile, argv, output_dir, python)
    if profile.wrapper == "bitfusion":
        argv = bitfusion_wrap(profile, cell.params.gpus, argv)
    return argv


def bitfusion_wrap(profile: HardwareProfile, gpus: int, argv: list[str]) -> list[str]:
    """``bitfusion run -n GPUS -p PARTIAL [-l SERVERS] -- argv``."""
    opts = profile.bitfusion
    wrapped = ["bitfusion", "run", "-n", str(gpus), "-p", f"{opts.partial:g}"]
    if opts.servers:
        wrapped += ["-l", ",".join(opts.servers)]
    return [*wrapped, *opts.extra_args, "--", *argv]


def profiler_wrap(cell: Cell, profile: HardwareProfile, argv: list[str],
                  output_dir: str | None, python: str = "python") -> list[str]:
    """``argv`` under the cell's wrapping profiler (nsys, ncu, nvprof) with the profile's options
    for it (:func:`orchestrator.plan.profilers.wrap`); unchanged for none and torch."""
    tool = cell.params.profiler
    if tool not in WRAPPING_PROFILERS:
        return argv
    return profilers.wrap(tool, profilers.options_of(profile, tool), output_dir, argv,
                          python=python)


def hpu_mode(params: CellParams, device: str) -> str | None:
    """The Gaudi execution mode of a cell on an ``hpu`` device (None elsewhere): its
    ``hpu_mode``; unset, ``compile`` when the cell asks for torch.compile, else ``lazy``."""
    if device != "hpu":
        return None
    if params.hpu_mode is not None:
        return params.hpu_mode
    return "compile" if params.compile != "none" else "lazy"


#: PT_HPU_LAZY_MODE of each Gaudi mode: lazy mode accumulates graphs (mark_step flushes them);
#: eager mode, with or without torch.compile(backend="hpu_backend"), runs op by op; graph mode
#: (torch.jit.trace) ran the traced graph without lazy accumulation.
HPU_LAZY_MODE = {"eager": "0", "lazy": "1", "compile": "0", "graph": "0"}


def workload_env(cell: Cell, profile: HardwareProfile, gpu_ids: tuple[int, ...]) -> dict[str, str]:
    """Environment of the workload process: the profile's, plus device selection, plus the
    cell's Gaudi mode (``PT_HPU_LAZY_MODE``, per cell: never baked into the image).

    ``gpu_ids`` are picked with ``CUDA_VISIBLE_DEVICES`` / ``HABANA_VISIBLE_MODULES`` (a local
    process); pass none where the GPUs come otherwise (a container's device request, Slurm).
    """
    env = {"PYTHONUNBUFFERED": "1", **profile.env}
    mode = hpu_mode(cell.params, profile.device)
    if mode is not None:
        env["PT_HPU_LAZY_MODE"] = HPU_LAZY_MODE[mode]
    if profile.device == "cuda" and gpu_ids and holds_local_gpus(profile):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    if profile.device == "hpu" and gpu_ids:
        env["HABANA_VISIBLE_MODULES"] = ",".join(map(str, gpu_ids))
    return env
