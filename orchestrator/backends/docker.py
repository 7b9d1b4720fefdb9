"""Docker backend: each cell in a container on this machine's Docker engine, one at a time.

Images are planned (:func:`orchestrator.build.plan_images`) and built once per sweep, per
distinct template and variables, before any cell runs. A cell's container is
:func:`~orchestrator.backends.containers.container_spec` /
:func:`~orchestrator.backends.containers.container_kwargs`, shared with the ssh backend; its
GPUs are the allocation's ids, given as a device request. Every container carries the sweep's
labels (:func:`orchestrator.engine.container_labels`): :meth:`DockerBackend.close` removes the
run's leftovers, and ``orchestrate clean`` those of a sweep that crashed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator import build
from orchestrator.backends.base import Backend, Execution, RunOptions
from orchestrator.backends.containers import DockerExecution, container_kwargs, container_spec
from orchestrator.engine import (
    LABEL_CELL,
    LABEL_RUN,
    container_labels,
    docker_client,
    remove_containers,
)
from orchestrator.errors import LaunchError
from orchestrator.launch import LaunchSpec
from orchestrator.matrix import Cell, Matrix
from orchestrator.placement import Allocation
from orchestrator.results import RunPaths

log = logging.getLogger(__name__)


class DockerBackend(Backend):
    """Run cells in containers on the local Docker engine, one at a time."""

    name = "docker"

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        super().__init__(matrix, paths, options)
        self._client: Any = None
        self.image_tags: dict[str, str] = {}  # hardware profile -> image tag

    @property
    def client(self) -> Any:
        """The local engine's client (connected on first use)."""
        if self._client is None:
            self._client = docker_client()
        return self._client

    @classmethod
    def check_available(cls) -> None:
        docker_client().close()

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Build (or find) every image the cells need, once per distinct image."""
        by_profile = build.plan_images(self.matrix, cells, self.name)
        self.image_tags = {hw: plan.tag for hw, plan in by_profile.items()}
        plans = {plan.tag: plan for plan in by_profile.values()}
        for tag, plan in plans.items():
            outcome = build.ensure_image(plan, self.client, on_log)
            if on_log:
                on_log(f"image {tag} ({plan.template}): {outcome.summary}")

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        return container_spec(
            cell, self.matrix.profile(cell), self.matrix.program(cell),
            image=self.image_tags.get(cell.hardware),
            output_dir=str(self.paths.cell_dir(cell.id).resolve()),
            labels=container_labels(self.matrix.name, self.paths.run_id, cell.id),
            attempt=attempt,
            gpu_ids=allocation.gpu_ids,
        )

    def launch(self, spec: LaunchSpec) -> Execution:
        import docker

        if spec.image is None:
            raise LaunchError(f"{spec.cell_id}: no image was prepared for it")
        try:
            container = self.client.containers.run(**container_kwargs(spec))
        except docker.errors.APIError as exc:
            remove_containers(self.client, {LABEL_CELL: spec.cell_id, LABEL_RUN: self.paths.run_id})
            raise LaunchError(f"{spec.cell_id}: the engine refused the container: "
                              f"{exc.explanation or exc}") from exc
        return DockerExecution(container)

    def close(self) -> None:
        if self._client is not None:
            remove_containers(self._client, {LABEL_RUN: self.paths.run_id})
            self._client.close()
