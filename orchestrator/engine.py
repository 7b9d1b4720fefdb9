"""The Docker engine: a client that answers, and the labels on every container we start.

Rules:

* :func:`docker_client` is the one way to reach the engine of this machine (``DOCKER_HOST`` or the
  local socket); no engine is a :class:`~orchestrator.errors.BackendUnavailable` saying what to
  do, never a traceback. Engines on lab hosts are reached through
  :func:`orchestrator.ssh_docker.remote_docker_client` instead.
* Every container of a sweep carries :func:`container_labels` (matrix, run id, cell id), so an
  interrupted sweep removes its own containers and ``orchestrate clean`` removes the leftovers of
  one that crashed (:func:`remove_containers`), on any engine.
* The Docker SDK is imported inside the functions: importing this module costs nothing, so
  planning a matrix never loads the SDK. Nothing here knows about backends or images.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.errors import BackendUnavailable

log = logging.getLogger(__name__)

LABEL_MATRIX = "io.orchestrate.matrix"
LABEL_RUN = "io.orchestrate.run"
LABEL_CELL = "io.orchestrate.cell"

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
    return {LABEL_MATRIX: matrix, LABEL_RUN: run_id, LABEL_CELL: cell_id}


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
