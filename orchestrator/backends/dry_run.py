"""What a sweep would start, cell by cell, without starting anything: ``matrix --dry-run`` and
``plan --json``.

Each cell's launch spec comes from its backend's own code (:meth:`Backend.dry_spec
<orchestrator.backends.base.Backend.dry_spec>`: :meth:`~orchestrator.backends.base.Backend.spec`
on the placement an idle machine would give), so what is shown is what the sweep starts: the
argv with its wrappers (``torchrun``, ``bitfusion run``, ``nsys``/``ncu``, ``apptainer exec``),
the cell's environment (secrets masked, ``$env:NAME`` references as written: what
``command.json`` records), and per backend

* process: the working folder;
* docker: the image (its planned tag) and the ``containers.run`` arguments: environment,
  device requests, devices, mounts (the cell folder's too), IPC, shared memory, ulimits,
  runtime, network, capabilities;
* ssh: the host the cell goes to first (the first host that may run it; the sweep takes
  whichever such host is free) with its SSH target, and the container on it;
* slurm: the batch script.

The run folder reads ``<run id>``. Nothing is built, written, submitted or connected to: the
backend is constructed (an ssh backend reads its inventory and ssh config), never prepared.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.backends import backend_class
from orchestrator.backends.base import Backend, RunOptions
from orchestrator.backends.registry import find_record
from orchestrator.backends.target import HERE, Target
from orchestrator.config.redact import redact_env
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.results.folders.run_folder import RunPaths

#: The run id a dry run's paths show.
RUN_ID = "<run id>"


def dry_backend(matrix: Matrix, backend: str, results_root: Path,
                hosts_file: Path | None = None, target: Target = HERE) -> Backend:
    """The backend a sweep would use, constructed (not prepared) over a ``<run id>`` folder,
    for ``target`` (this machine, or a declared one whose driver picks an auto release)."""
    paths = RunPaths(Path(results_root).resolve() / matrix.name / RUN_ID)
    options = RunOptions(timeout_s=matrix.settings.timeout_s, hosts_file=hosts_file,
                         dry_run=True, target=target)
    return backend_class(backend)(matrix, paths, options)


def launches(matrix: Matrix, backend: str, cells: Iterable[Cell], results_root: Path,
             hosts_file: Path | None = None, target: Target = HERE) -> list[dict[str, Any]]:
    """Every cell's launch, as :func:`describe` says it."""
    return list(launches_on(dry_backend(matrix, backend, results_root, hosts_file, target),
                            cells))


def launches_on(runner: Backend, cells: Iterable[Cell]) -> Iterator[dict[str, Any]]:
    """Every cell's launch on ``runner`` (a :func:`dry_backend`), as :func:`describe` says it,
    one at a time (what is shown of one cell is dropped before the next is made)."""
    inventory = getattr(find_record(runner.name), "inventory", False)
    return (describe(runner, runner.dry_spec(cell), inventory) for cell in cells)


def describe(backend: Backend, spec: LaunchSpec, inventory: bool = False) -> dict[str, Any]:
    """One cell's launch as JSON: ``command.json``'s fields (:meth:`LaunchSpec.to_json`), the
    backend, and what it adds: the ``containers.run`` arguments, the SSH target (``inventory``:
    the backend reads one; ``null`` when no host of it may run the cell), the batch script,
    the other nodes of a multi-node cell."""
    out: dict[str, Any] = {"backend": backend.name, **spec.to_json()}
    if spec.container is not None and spec.image is not None:
        out["docker_run"] = docker_run(spec)
    if spec.host is not None:
        target = getattr(backend, "targets", {}).get(spec.host)
        if target is not None:
            out["ssh"] = {"host": spec.host, "hostname": target.hostname, "port": target.port,
                          "user": target.user}
    elif inventory:  # no host of the inventory (or none given) may run it
        out["ssh"] = None
    if spec.script is not None:
        out["script"] = spec.script
    if spec.peers:
        out["nodes"] = [describe(backend, node, inventory) for node in spec.peers]
    return out


def docker_run(spec: LaunchSpec) -> dict[str, Any]:
    """The arguments of ``client.containers.run`` (:func:`orchestrator.runtimes.docker.
    container_kwargs`: plain values already), as JSON, its environment as written in the spec
    (secrets masked, references unresolved: a dry run resolves no secret)."""
    from orchestrator.runtimes.docker import container_kwargs

    kwargs = container_kwargs(spec)
    resolved = kwargs.pop("environment")
    env = redact_env(spec.env)
    env.update({k: v for k, v in resolved.items() if k not in spec.env})  # added by the runtime
    return {"environment": env, **kwargs}


def lines(launch: dict[str, Any]) -> list[str]:
    """One cell's launch for people: the command line, then what the backend adds."""
    out = [f"{launch['cell_id']}:"]
    out += _command_lines(launch, "  ")
    for i, node in enumerate(launch.get("nodes", []), start=1):
        out.append(f"  node {i}:")
        out += _command_lines(node, "    ")
    return out


def _command_lines(launch: dict[str, Any], pad: str) -> list[str]:
    out = []
    if launch.get("ssh"):
        ssh = launch["ssh"]
        out.append(f"{pad}on host {ssh['host']} ({ssh['user']}@{ssh['hostname']}:{ssh['port']}, "
                   "the first host that may run it)")
    elif "ssh" in launch:
        out.append(f"{pad}on no host: the inventory names none that may run it (the "
                   "requirements say what is missing)")
    env = launch.get("env") or {}
    if "docker_run" in launch:
        run = launch["docker_run"]
        out.append(f"{pad}container of image {run['image']}:")
        out.append(f"{pad}  command: {launch['shell']}")
        out += _env_lines(run["environment"], f"{pad}  ")
        for key in sorted(set(run) - {"image", "command", "environment", "labels", "detach"}):
            out.append(f"{pad}  {key}: {_short(run[key])}")
        return out
    if launch.get("workdir"):
        out.append(f"{pad}in {launch['workdir']}")
    out.append(f"{pad}command: {launch['shell']}")
    out += _env_lines(env, pad)
    if "script" in launch:
        out.append(f"{pad}batch script:")
        out += [f"{pad}  {line}" for line in launch["script"].splitlines()]
    return out


def _env_lines(env: dict[str, str], pad: str) -> list[str]:
    if not env:
        return []
    return [f"{pad}env: " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items()))]


def _short(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return "; ".join(", ".join(f"{k}={v}" for k, v in item.items() if v not in (None, ""))
                         for item in value)
    return str(value)
