"""Docker backend: each cell in a container on a Docker engine, through the Docker SDK.

What a lab types by hand (``docker run --gpus '"device=0,1"' --ipc=host --shm-size=16g
--ulimit memlock=-1 -v /data/imagenet:/imagenet ...``) becomes :func:`container_kwargs`, a pure
function of the launch spec, checked by tests as built. Images are built once per sweep (per
distinct template and variables) before any cell runs. Every container carries labels (matrix,
run id, cell id): an interrupted sweep removes its containers, and ``orchestrate clean`` removes
leftovers of one that crashed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Allocation, Backend, Execution, ExitInfo
from orchestrator.errors import BackendUnavailable, ConfigError, LaunchError, Problem
from orchestrator.launch import LaunchSpec, workload_argv, workload_env
from orchestrator.matrix import Cell, Matrix

log = logging.getLogger("orchestrator.backends.docker")

LABEL_MATRIX = "io.orchestrate.matrix"
LABEL_RUN = "io.orchestrate.run"
LABEL_CELL = "io.orchestrate.cell"
#: Where the cell's folder is mounted in the container (the workload's --output-dir).
CONTAINER_OUT = "/orchestrate/out"
#: The interpreter in NGC / Habana images (and the test base image).
CONTAINER_PYTHON = "python3"

NO_ENGINE_HINT = (
    "start the engine (`dockerd >/tmp/dockerd.log 2>&1 &`, or tests/infra/start-dockerd.sh), "
    "point DOCKER_HOST at one, or run without containers: --backend process"
)


def docker_client() -> Any:
    """A DockerClient that answers, or :class:`BackendUnavailable` saying what to do."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise BackendUnavailable(f"the docker SDK is not installed ({exc})") from exc
    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as exc:  # DockerException, connection errors, permission denied
        raise BackendUnavailable(f"no Docker engine reachable ({exc}); {NO_ENGINE_HINT}") from exc
    return client


def container_kwargs(spec: LaunchSpec) -> dict[str, Any]:
    """Arguments of ``client.containers.run`` for a launch spec (pure; tested as built)."""
    from docker.types import DeviceRequest, Mount, Ulimit
    from docker.utils import parse_bytes

    opts = spec.container
    assert opts is not None and spec.image is not None
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": list(spec.argv),
        "environment": dict(spec.env),
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
    if opts.runtime:
        kwargs["runtime"] = opts.runtime
    if spec.workdir:
        kwargs["working_dir"] = spec.workdir
    return kwargs


def plan_images(matrix: Matrix, cells: list[Cell], backend: str) -> dict[str, Any]:
    """The image plan of every hardware profile the cells use (no engine needed).

    A profile without an image template cannot run in a container: a :class:`ConfigError`
    naming each such profile.
    """
    from orchestrator import build

    needed = sorted({c.hardware for c in cells})
    missing = [h for h in needed if matrix.profiles[h].image is None]
    if missing:
        raise ConfigError([
            Problem(str(matrix.path), f"hardware.{h}.image",
                    f"the {backend} backend needs an image template for this profile")
            for h in missing
        ])
    plans = {}
    for hw in needed:
        profile = matrix.profiles[hw]
        try:
            plans[hw] = build.plan_image(profile.image, profile_image_vars(matrix, hw))
        except ConfigError as exc:  # say where in the matrix the variable comes from
            raise ConfigError([
                Problem(str(matrix.path), f"hardware.{hw}.image_vars.{p.field}", p.message)
                for p in exc.problems
            ]) from None
    return plans


def profile_image_vars(matrix: Matrix, hardware: str) -> dict[str, Any]:
    """A profile's image variables; relative paths of file variables (a client .deb, a CA
    certificate) are taken relative to the matrix file's folder, not the current directory."""
    from orchestrator import images

    profile = matrix.profiles[hardware]
    values = dict(profile.image_vars)
    for name, var in images.load_template(profile.image).variables.items():
        value = values.get(name)
        if var.file and isinstance(value, str) and value:
            path = Path(value).expanduser()
            if not path.is_absolute():
                values[name] = str((matrix.path.parent / path).resolve())
    return values


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


class DockerBackend(Backend):
    """Run cells in containers on the local Docker engine, one at a time."""

    name = "docker"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._client: Any = None
        self.image_tags: dict[str, str] = {}  # hardware profile -> image tag

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = docker_client()
        return self._client

    @classmethod
    def check_available(cls) -> None:
        docker_client().close()

    # --- images -------------------------------------------------------------------------------

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Build (or find) every image the cells need, once per distinct image."""
        from orchestrator import build

        by_profile = plan_images(self.matrix, cells, self.name)
        self.image_tags = {hw: plan.tag for hw, plan in by_profile.items()}
        plans = {plan.tag: plan for plan in by_profile.values()}
        for tag, plan in plans.items():
            outcome = build.ensure_image(plan, self.client, on_log)
            if on_log:
                on_log(f"image {tag} ({plan.template}): {outcome.summary}")

    # --- cells --------------------------------------------------------------------------------

    def labels(self, cell: Cell) -> dict[str, str]:
        return {LABEL_MATRIX: self.matrix.name, LABEL_RUN: self.paths.run_id, LABEL_CELL: cell.id}

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        profile = self.matrix.profile(cell)
        return LaunchSpec(
            cell_id=cell.id,
            argv=tuple(workload_argv(cell, profile, python=CONTAINER_PYTHON,
                                     output_dir=CONTAINER_OUT)),
            env=workload_env(cell, profile, ()),  # GPUs: the device request
            device=profile.device,
            gpu_ids=allocation.gpu_ids,
            image=self.image_tags.get(cell.hardware),
            container=profile.container,
            output_dir=str(self.paths.cell_dir(cell.id).resolve()),
            host=allocation.host,
            labels=self.labels(cell),
            attempt=attempt,
            hosts=allocation.hosts if len(allocation.hosts) > 1 else (),
        )

    def launch(self, spec: LaunchSpec) -> Execution:
        import docker

        if spec.image is None:
            raise LaunchError(f"{spec.cell_id}: no image was prepared for it")
        try:
            container = self.client.containers.run(**container_kwargs(spec))
        except docker.errors.APIError as exc:
            self._remove_labelled({LABEL_CELL: spec.cell_id, LABEL_RUN: self.paths.run_id})
            raise LaunchError(f"{spec.cell_id}: the engine refused the container: "
                              f"{exc.explanation or exc}") from exc
        return DockerExecution(container)

    def close(self) -> None:
        if self._client is not None:
            self._remove_labelled({LABEL_RUN: self.paths.run_id})
            self._client.close()

    def _remove_labelled(self, labels: dict[str, str]) -> int:
        return remove_containers(self.client, labels)


def remove_containers(client: Any, labels: dict[str, str] | None = None) -> int:
    """Remove every container carrying ``labels`` (default: any orchestrate container)."""
    filters = [f"{k}={v}" for k, v in (labels or {}).items()] or [LABEL_RUN]
    removed = 0
    for container in client.containers.list(all=True, filters={"label": filters}):
        try:
            container.remove(force=True)
            removed += 1
        except Exception as exc:  # already gone
            log.debug("remove %s: %s", container.short_id, exc)
    return removed
