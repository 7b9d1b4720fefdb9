"""What every backend that runs cells in Docker containers shares, wherever the engine is.

The local :mod:`~orchestrator.backends.docker` backend and the lab hosts'
:mod:`~orchestrator.backends.ssh` backend both use these, and nothing else of each other:

* :func:`container_spec` — a cell's :class:`~orchestrator.plan.launch.LaunchSpec` in a container:
  its
  program's argv (:func:`~orchestrator.plan.launch.cell_command`: our workload, or a command
  template)
  with the image's Python, its output at :data:`CONTAINER_OUT`, the command's working directory
  (else the image's), the profile's container options, the cell's labels. GPUs come from a
  device request, not the environment.
* :func:`container_kwargs` — what a lab types by hand (``docker run --gpus '"device=0,1"'
  --ipc=host --shm-size=16g --ulimit memlock=-1 -v /data/imagenet:/imagenet ...``) as the
  arguments of ``client.containers.run``: a pure function of the spec, checked by tests as built.
* :class:`DockerExecution` — a started container: its log stream, its wait, its end (exit code,
  OOM kill), its removal.

The engine client (local or over SSH) is the caller's; nothing here connects to anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from orchestrator.backends.base import Execution, ExitInfo
from orchestrator.config.matrix_file import HardwareProfile, Program
from orchestrator.config.redact import resolve_env
from orchestrator.plan.launch import LaunchSpec, NodeRole, cell_command
from orchestrator.plan.matrix import Cell

log = logging.getLogger(__name__)

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
        # Bitfusion: the GPUs are remote (`bitfusion run -n N` picks them), so no local device
        # request: the client VM has no GPU of its own to give the container
        gpu_ids=() if profile.wrapper == "bitfusion" else gpu_ids,
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
    """Arguments of ``client.containers.run`` for a launch spec (pure; tested as built)."""
    from docker.types import DeviceRequest, Mount, Ulimit
    from docker.utils import parse_bytes

    opts = spec.container
    assert opts is not None and spec.image is not None
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.argv),
        "environment": resolve_env(spec.env),  # secrets too: visible to `docker inspect`
        "labels": dict(spec.labels),
        "detach": True,
        "ipc_mode": opts.ipc,
        "shm_size": parse_bytes(opts.shm_size),
        "ulimits": [Ulimit(name=k, soft=v, hard=v) for k, v in opts.ulimits.items()],
        "privileged": opts.privileged,
        "mounts": [
            Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in opts.mounts
        ],
    }
    if spec.output_dir:
        kwargs["mounts"].append(
            Mount(target=CONTAINER_OUT, source=spec.output_dir, type="bind", read_only=False)
        )
    if spec.device == "cuda" and spec.gpu_ids:
        kwargs["device_requests"] = [
            DeviceRequest(driver="nvidia", device_ids=[str(i) for i in spec.gpu_ids],
                          capabilities=[["gpu"]])
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


class DockerExecution(Execution):
    """A running container."""

    def __init__(self, container: Any):
        self.container = container
        self._done = threading.Event()
        self._status: dict[str, Any] | None = None
        self._waiter = threading.Thread(target=self._wait, daemon=True,
                                        name=f"wait-{container.short_id}")
        self._waiter.start()

    def _wait(self) -> None:
        try:
            self._status = self.container.wait()
        except Exception as exc:  # engine gone, container removed under us
            log.warning("waiting for container %s: %s", self.container.short_id, exc)
        finally:
            self._done.set()

    @property
    def wait_status(self) -> dict[str, Any] | None:
        """The engine's answer to the wait (``StatusCode``...); None while running or when the
        wait broke (connection or engine lost)."""
        return self._status

    def output(self) -> Iterator[bytes]:
        yield from self.container.logs(stream=True, follow=True, stdout=True, stderr=True)

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def kill(self) -> None:
        try:
            self.container.kill()
        except Exception as exc:  # already stopped
            log.debug("kill %s: %s", self.container.short_id, exc)
        self._done.wait(10.0)

    def exit_info(self) -> ExitInfo:
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
        except Exception as exc:
            return ExitInfo(code=None, detail=f"container state unavailable: {exc}")
        code = state.get("ExitCode")
        oom = bool(state.get("OOMKilled"))
        detail = state.get("Error") or ""
        if oom:
            limit = self.container.attrs.get("HostConfig", {}).get("Memory") or 0
            detail = "killed by the out-of-memory killer" + (
                f" (container memory limit {limit / 2**20:.0f} MiB)" if limit else "")
        return ExitInfo(code=code, oom=oom, detail=detail)

    def close(self) -> None:
        try:
            self.container.remove(force=True)
        except Exception as exc:
            log.debug("remove %s: %s", self.container.short_id, exc)
