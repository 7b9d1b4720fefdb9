"""The Docker runtime: a cell's program in a Docker container, on this machine's engine or a lab
host's (the docker and ssh backends).

**How the argv is wrapped**: it is not; the container is. :func:`container_spec` is a cell's
:class:`~orchestrator.plan.launch.LaunchSpec` in a container: its program's argv
(:func:`~orchestrator.plan.launch.cell_command`: our workload, or a command template) with the
image's Python, its output at :data:`CONTAINER_OUT`, the command's working directory (else the
image's), the profile's container options, the cell's labels; a multi-node cell's node on the
host network. GPUs come from a device request, not the environment. :func:`container_kwargs` is
what a lab types by hand (``docker run --gpus '"device=0,1"' --ipc=host --shm-size=16g --ulimit
memlock=-1 -v /data/imagenet:/imagenet ...``) as the arguments of ``client.containers.run``: a
pure function of the spec, checked by tests as built.

**What it needs from the host**: a Docker engine (the backend's client: local, or over SSH) and
the image of each profile on it, built from the profile's Dockerfile template
(:func:`orchestrator.images.prepare.prepare_images`, before the first cell).

**What it checks before the run** (:func:`check_profile`): a profile names an image template,
and one that builds a Docker image (not a Singularity definition); ``runtime = "docker"`` on a
backend whose record does not list it is refused (:func:`refused_on`).

Nothing here connects to anything: the engine client is the backend's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.catalog import templates
from orchestrator.config.matrix_file import HardwareProfile, Program, memory_bytes
from orchestrator.config.redact import resolve_env
from orchestrator.config.syntax import words
from orchestrator.errors import ConfigError, Problem
from orchestrator.plan.launch import LaunchSpec, NodeRole, cell_command
from orchestrator.plan.matrix import Cell
from orchestrator.plan.placement import holds_local_gpus
from orchestrator.runtimes import BackendFacts, Report

#: Where the cell's folder is mounted in the container (the workload's --output-dir).
CONTAINER_OUT = "/orchestrate/out"
#: The interpreter in NGC / Habana images (and the test base image).
CONTAINER_PYTHON = "python3"


def container_spec(
    cell: Cell,
    profile: HardwareProfile,
    program: Program,
    *,
    image: str | None,
    output_dir: str,
    labels: dict[str, str],
    attempt: int = 1,
    host: str | None = None,
    gpu_ids: tuple[int, ...] = (),
    node: NodeRole | None = None,
) -> LaunchSpec:
    """The launch spec of ``cell`` in a container on ``host`` (None: the local engine).

    ``output_dir`` is the folder (on the engine's machine) mounted at :data:`CONTAINER_OUT`.
    ``node``: one node of a multi-node cell; its container uses the host network, where the
    rendezvous and the collectives between hosts go.
    """
    container = profile.container
    if node is not None:
        container = container.model_copy(update={"network": "host"})
    command = cell_command(cell, profile, program, python=CONTAINER_PYTHON,
                           output_dir=CONTAINER_OUT, node=node)  # GPUs: the device request
    return LaunchSpec(
        cell_id=cell.id,
        argv=tuple(command.argv),
        env=command.env,
        device=profile.device,
        # the allocation's GPUs, but for a cell that computes on none of this machine's: a
        # Bitfusion cell's are remote (`bitfusion run -n N` picks them; the client VM has none
        # to give the container); a CPU cell's (held against other cells) are requested by no
        # device request (container_kwargs: CUDA and Gaudi only)
        gpu_ids=gpu_ids if holds_local_gpus(profile) or profile.device == "cpu" else (),
        image=image,
        container=container,
        workdir=command.workdir,
        output_dir=output_dir,
        host=host,
        labels=labels,
        attempt=attempt,
        program=command.program,
    )


def container_kwargs(spec: LaunchSpec) -> dict[str, Any]:
    """Arguments of ``client.containers.run`` for a launch spec (pure; tested as built).

    The mounts, ulimits and device requests are in the Engine API's own form, the dicts that
    docker-py's ``Mount``, ``Ulimit`` and ``DeviceRequest`` are (docker-py takes such dicts as
    they are; tests/test_launch.py compares them with its types), and the shared memory in
    bytes as its ``parse_bytes`` reads it: making them imports no Docker SDK, so a plan or a
    dry run of 10,000 containers never loads it (with requests and paramiko: 0.2 s)."""
    opts = spec.container
    assert opts is not None and spec.image is not None
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.argv),
        "environment": resolve_env(spec.env),  # secrets too: visible to `docker inspect`
        "labels": dict(spec.labels),
        "detach": True,
        "ipc_mode": opts.ipc,
        "shm_size": memory_bytes(opts.shm_size),
        "ulimits": [{"Name": k, "Soft": v, "Hard": v} for k, v in opts.ulimits.items()],
        "privileged": opts.privileged,
        "mounts": [bind_mount(m.target, m.source, m.read_only) for m in opts.mounts],
    }
    if spec.output_dir:
        kwargs["mounts"].append(bind_mount(CONTAINER_OUT, spec.output_dir, False))
    if spec.device == "cuda" and spec.gpu_ids:
        kwargs["device_requests"] = [
            {"Driver": "nvidia", "Count": 0, "DeviceIDs": [str(i) for i in spec.gpu_ids],
             "Capabilities": [["gpu"]], "Options": {}}
        ]
    if spec.device == "hpu" and spec.gpu_ids:
        kwargs["environment"]["HABANA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpu_ids))
    if opts.devices:
        kwargs["devices"] = [f"{d}:{d}:rwm" for d in opts.devices]
    if opts.cap_add:
        kwargs["cap_add"] = list(opts.cap_add)
    if opts.mem_limit:
        kwargs["mem_limit"] = opts.mem_limit
        kwargs["memswap_limit"] = opts.mem_limit  # no swap: an over-limit cell is OOM-killed
    if opts.network:
        kwargs["network_mode"] = opts.network
    if opts.pid:
        kwargs["pid_mode"] = opts.pid
    if opts.runtime:
        kwargs["runtime"] = opts.runtime
    if spec.workdir:
        kwargs["working_dir"] = spec.workdir
    return kwargs


def bind_mount(target: str, source: str, read_only: bool) -> dict[str, Any]:
    """A bind mount as the Engine API takes it (docker-py's ``Mount(target, source,
    type="bind", read_only=...)``)."""
    return {"Target": target, "Source": source, "Type": "bind", "ReadOnly": read_only}


def refused_on(backend: BackendFacts, runs_on: Sequence[str]) -> str | None:
    """Why ``runtime = "docker"`` cannot run on ``backend`` (one that runs this machine's
    Python); None where it can. ``runs_on``: the backends that run it."""
    if "docker" in backend.runtimes:
        return None
    return (f"runtime 'docker' runs on the {words(runs_on)} backends; the {backend.name} "
            "backend runs this machine's Python, or an Apptainer image with runtime = "
            "\"apptainer\"")


def check_profile(report: Report, file: str, hw: str, profile: HardwareProfile,
                  backend: BackendFacts) -> bool:
    """Whether the profile's image template builds a Docker image: an error naming the field
    where it does not (no template, a Singularity definition); False then. A template that
    does not load was reported by the matrix's own validation: False, nothing said."""
    where, name = f"hardware.{hw}", backend.name
    if profile.image is None:
        report.error(Problem(file, f"{where}.image", (
            f"the {name} backend runs each cell in a container: give an image template "
            f"({', '.join(templates.template_names())})")))
        return False
    try:
        template = templates.load_template(profile.image)
    except ConfigError:  # load_matrix reported it
        return False
    if template.kind != "dockerfile":
        docker = [n for n in templates.template_names()
                  if templates.load_template(n).kind == "dockerfile"]
        report.error(Problem(file, f"{where}.image", (
            f"{profile.image!r} is a {template.kind} definition, which the {name} backend "
            f"cannot run (it runs Docker images): pick a Dockerfile template "
            f"({', '.join(docker)})"
            + (", or set runtime = \"apptainer\" to run it with Apptainer"
               if "apptainer" in backend.runtimes else ""))))
        return False
    return True
