"""The Docker engine: a client that answers, and the labels on every container we start.

Rules:

* :func:`docker_client` is the one way to reach the engine of this machine (``DOCKER_HOST`` or the
  local socket); no engine is a :class:`~orchestrator.errors.BackendUnavailable` saying what to
  do, never a traceback. Engines on lab hosts are reached through
  :func:`orchestrator.remote.docker_api.remote_docker_client` instead.
* Every container of a sweep carries :func:`container_labels` (matrix, run id, cell id, and the
  controller that started it: host, pid and the pid's start time), so an interrupted sweep
  removes its own containers and ``orchestrate clean`` removes the leftovers of one that
  crashed (:func:`remove_containers`, :func:`leftover_containers`), on any engine, never those
  of a sweep whose controller still runs (:func:`controller_state`).
* The Docker SDK is imported inside the functions: importing this module costs nothing, so
  planning a matrix never loads the SDK. :func:`engine_probe` asks the engine what the one
  decision needs to know (does it answer, has it an image) over its HTTP API on the local
  socket, without the SDK (it imports requests and paramiko: 0.2 s of a plan's start-up);
  an engine elsewhere (``DOCKER_HOST`` over TCP or SSH) is asked through the SDK's client.
  Nothing here knows about backends or images.
"""

from __future__ import annotations

import functools
import http.client
import logging
import os
import platform
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from orchestrator.errors import BackendUnavailable

log = logging.getLogger(__name__)

LABEL_MATRIX = "io.orchestrate.matrix"
LABEL_RUN = "io.orchestrate.run"
LABEL_CELL = "io.orchestrate.cell"
#: ``host:pid:start``: the orchestrator process that started the container (``start``: the
#: pid's start time in clock ticks since boot, so a reused pid is not taken for it).
LABEL_CONTROLLER = "io.orchestrate.controller"

NO_ENGINE_HINT = (
    "start the engine (`dockerd >/tmp/dockerd.log 2>&1 &`, or tests/infra/start-dockerd.sh), "
    "point DOCKER_HOST at one, or run without containers: --backend process"
)


def docker_client() -> Any:
    """A DockerClient that answers, or :class:`BackendUnavailable` saying what to do."""
    check_sdk()
    import docker

    try:
        client = docker.from_env(version="auto")
        client.ping()
    except Exception as exc:  # DockerException, connection errors, permission denied
        raise BackendUnavailable(f"no Docker engine reachable ({exc}); {NO_ENGINE_HINT}") from exc
    return client


#: The engine's socket when ``DOCKER_HOST`` is not set (docker-py's default too).
DEFAULT_SOCKET = "/var/run/docker.sock"
#: How long a probe waits for the engine (docker-py's default timeout).
PROBE_TIMEOUT_S = 60.0


class EngineProbe(Protocol):
    """What the one decision asks this machine's engine (:func:`engine_probe`)."""

    def image_exists(self, ref: str) -> bool: ...

    def close(self) -> None: ...


def engine_probe() -> EngineProbe:
    """This machine's engine, answering (``/_ping``), to ask which images it has; or
    :class:`BackendUnavailable` saying what to do, as :func:`docker_client`. The engine of
    ``DOCKER_HOST`` (else :data:`DEFAULT_SOCKET`) is asked over its HTTP API where that is a
    local socket (``unix://``), without the SDK; elsewhere through :func:`docker_client`."""
    host = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    if not host.startswith("unix://"):
        return _ClientProbe(docker_client())
    probe = _SocketProbe(host[len("unix://"):])
    try:
        probe.ping()
    except (OSError, http.client.HTTPException) as exc:
        probe.close()
        raise BackendUnavailable(f"no Docker engine reachable ({exc}); {NO_ENGINE_HINT}") from exc
    return probe


class _UnixConnection(http.client.HTTPConnection):
    """An HTTP connection to the engine's Unix socket."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _SocketProbe:
    """The engine's HTTP API on a local socket (the Engine API's ``GET /_ping`` and ``GET
    /images/{name}/json``, unversioned: the engine's own version answers)."""

    def __init__(self, path: str):
        self.path = path
        self._conn = _UnixConnection(path, PROBE_TIMEOUT_S)

    def _get(self, url: str) -> int:
        self._conn.request("GET", url)
        response = self._conn.getresponse()
        response.read()
        return response.status

    def ping(self) -> None:
        status = self._get("/_ping")
        if status != 200:
            raise http.client.HTTPException(f"{self.path} answered /_ping with HTTP {status}")

    def image_exists(self, ref: str) -> bool:
        status = self._get(f"/images/{urllib.parse.quote(ref, safe='/:@')}/json")
        if status not in (200, 404):
            raise BackendUnavailable(f"the Docker engine at {self.path} answered HTTP {status} "
                                     f"when asked for image {ref}; {NO_ENGINE_HINT}")
        return status == 200

    def close(self) -> None:
        self._conn.close()


class _ClientProbe:
    """The same questions through the SDK's client (an engine over TCP or SSH)."""

    def __init__(self, client: Any):
        self.client = client

    def image_exists(self, ref: str) -> bool:
        return image_exists(self.client.api, ref)

    def close(self) -> None:
        self.client.close()


def image_exists(api: Any, ref: str) -> bool:
    """Whether ``ref`` exists in the engine behind ``api`` (the SDK's low-level client)."""
    import docker

    try:
        api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def check_sdk() -> None:
    """:class:`BackendUnavailable` if the Docker SDK cannot be imported."""
    try:
        import docker  # noqa: F401
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise BackendUnavailable(f"the docker SDK is not installed ({exc})") from exc


def is_engine_error(exc: BaseException) -> bool:
    """Whether the engine answered with an error (as opposed to the connection failing)."""
    import docker

    return isinstance(exc, docker.errors.APIError)


def container_labels(matrix: str, run_id: str, cell_id: str) -> dict[str, str]:
    """The labels of a cell's container(s)."""
    return {LABEL_MATRIX: matrix, LABEL_RUN: run_id, LABEL_CELL: cell_id,
            LABEL_CONTROLLER: controller_id()}


def _start_ticks(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def controller_id(pid: int | None = None) -> str:
    """``host:pid:start`` of this orchestrator process (or of ``pid`` on this host)."""
    own = os.getpid()
    if pid is None or pid == own:
        return _own_id(own)  # every container of a sweep carries it: read /proc once
    return f"{platform.node()}:{pid}:{_start_ticks(pid) or '?'}"


@functools.cache
def _own_id(pid: int) -> str:
    """:func:`controller_id` of this process, ``pid`` (a forked child is a process of its own,
    with an id of its own)."""
    return f"{platform.node()}:{pid}:{_start_ticks(pid) or '?'}"


ControllerState = Literal["running", "gone", "elsewhere"]


def controller_state(label: str) -> ControllerState:
    """Whether the controller of ``label`` (:func:`controller_id`) still runs: ``elsewhere``
    when it ran on another host (this machine cannot tell)."""
    parts = label.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return "gone"
    host, pid, start = parts
    if host != platform.node():
        return "elsewhere"
    return "running" if _start_ticks(int(pid)) == start else "gone"


@dataclass(frozen=True)
class Leftover:
    """A container of orchestrate found on an engine."""

    container: Any
    run: str
    cell: str
    controller: str | None
    state: ControllerState | None  # None: no controller label (an older orchestrate)

    @property
    def name(self) -> str:
        return str(getattr(self.container, "name", None) or self.container.short_id)


def _labelled(client: Any, labels: dict[str, str] | None) -> list[Any]:
    """Every container (running or not) carrying ``labels`` (default: any of orchestrate's)."""
    filters = [f"{k}={v}" for k, v in (labels or {}).items()] or [LABEL_RUN]
    return list(client.containers.list(all=True, filters={"label": filters}))


def leftover_containers(client: Any, labels: dict[str, str] | None = None) -> list[Leftover]:
    """Every container carrying ``labels`` (default: any orchestrate container), with the
    state of the sweep that started it."""
    found = []
    for container in _labelled(client, labels):
        tags = container.labels or {}
        controller = tags.get(LABEL_CONTROLLER)
        found.append(Leftover(container, tags.get(LABEL_RUN, "?"), tags.get(LABEL_CELL, "?"),
                              controller, controller_state(controller) if controller else None))
    return found


def remove_containers(client: Any, labels: dict[str, str] | None = None) -> int:
    """Remove every container carrying ``labels`` (default: any orchestrate container)."""
    removed = 0
    for container in _labelled(client, labels):
        try:
            container.remove(force=True)
            removed += 1
        except Exception as exc:  # already gone
            log.debug("remove %s: %s", container.short_id, exc)
    return removed
