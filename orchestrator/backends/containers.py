"""A started Docker container, wherever its engine is: :class:`DockerExecution` (its log stream,
its wait, its end: exit code, OOM kill; its removal).

The docker backend's cells are one each; the ssh backend's
(:class:`~orchestrator.backends.remote_executions.RemoteExecution`) one per node, over SSH. What
the container is (its spec, the arguments of ``containers.run``) is the Docker runtime's
(:mod:`orchestrator.runtimes.docker`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from orchestrator.backends.base import Execution, ExitInfo

log = logging.getLogger(__name__)


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
