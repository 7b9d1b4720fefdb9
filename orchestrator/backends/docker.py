"""Docker backend: each cell in a container on this machine's Docker engine, one at a time.

Images are prepared once per sweep, per distinct image
(:class:`~orchestrator.plan.selection.ImageKey`: a profile, and the ``ngc_release`` a cell pins),
before any cell runs, as the ssh backend and ``images refresh`` prepare them
(:func:`orchestrator.images.prepare.prepare_images` on this machine's engine); a profile with
``release = "auto"`` gets the release this machine's driver runs (``nvidia-smi`` / ``hl-smi``).
Each image is pinned to the bits of its base on this engine, and every cell's result records the
image it ran (image ID, base, release: :meth:`DockerBackend.provenance`); the builds are added to
the results folder's image state (:mod:`orchestrator.images.state`, host ``localhost``). A cell's
container is the Docker runtime's (:func:`~orchestrator.runtimes.docker.container_spec` /
:func:`~orchestrator.runtimes.docker.container_kwargs`, shared with the ssh backend); its GPUs
are the allocation's ids, given as a device request. Every container carries the sweep's
labels (:func:`orchestrator.local.engine.container_labels`): :meth:`DockerBackend.close` removes the
run's leftovers, and ``orchestrate clean`` those of a sweep that crashed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend, Execution, RunOptions
from orchestrator.backends.containers import DockerExecution
from orchestrator.backends.target import HERE, Target
from orchestrator.catalog import gpus
from orchestrator.errors import BackendUnavailable, LaunchError, Problem, Requirement
from orchestrator.images import build
from orchestrator.images.prepare import (
    Engine,
    Ledger,
    base_problems,
    plan_problems,
    planned_tag,
    prepare_images,
)
from orchestrator.images.state import ImageRecord
from orchestrator.local.engine import (
    LABEL_CELL,
    LABEL_RUN,
    container_labels,
    docker_client,
    engine_probe,
    remove_containers,
)
from orchestrator.plan import selection
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.folders.run_folder import RunPaths
from orchestrator.runtimes.docker import container_kwargs, container_spec

log = logging.getLogger(__name__)


class DockerBackend(Backend):
    """Run cells in containers on the local Docker engine, one at a time."""

    name = "docker"

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        super().__init__(matrix, paths, options)
        self._client: Any = None
        #: hardware profile -> image tag of its own release (a fallback: cells look up ``images``)
        self.image_tags: dict[str, str] = {}
        #: every image prepared, by key (a profile, and the release a cell pins)
        self.images: dict[selection.ImageKey, ImageRecord] = {}

    @property
    def client(self) -> Any:
        """The local engine's client (connected on first use)."""
        if self._client is None:
            self._client = docker_client()
        return self._client

    @classmethod
    def check_available(cls) -> None:
        docker_client().close()

    @classmethod
    def target_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """This machine's engine, asked once (:func:`orchestrator.local.engine.engine_probe`:
        no Docker SDK for a local engine): no engine is a requirement of kind ``engine``;
        one that answers is asked for the images' base images
        (:func:`orchestrator.images.prepare.base_problems`: a local base that is not there
        stops the sweep's build, so the decision refuses it first)."""
        try:
            engine = engine_probe()
        except BackendUnavailable as exc:
            return [Requirement("", "", str(exc), kind="engine")]
        try:
            cells = list(cells)
            return list(base_problems(matrix, cells, engine, cls._host_driver(matrix, cells)))
        except BackendUnavailable as exc:  # the engine failed a question after answering
            return [Requirement("", "", str(exc), kind="engine")]
        finally:
            engine.close()

    @classmethod
    def prepare_problems(cls, matrix: Matrix, cells: Iterable[Cell],
                         hosts_file: Path | None = None, *, target: Target = HERE
                         ) -> list[Problem]:
        """The images' plans (:func:`orchestrator.images.prepare.plan_problems`; a release
        chosen per driver: the target's, this machine's unless one is declared)."""
        cells = list(cells)
        return plan_problems(matrix, cells, cls.name, cls._host_driver(matrix, cells, target))

    @staticmethod
    def _host_driver(matrix: Matrix, cells: list[Cell], target: Target = HERE
                     ) -> selection.HostDriver | None:
        """The driver that picks an auto release (None: no cell's profile has one)."""
        if not any(selection.is_auto(matrix, hw) for hw in {c.hardware for c in cells}):
            return None
        return selection.HostDriver.from_facts(target.facts or gpus.local_facts())

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Build (or find) every image the cells need, once per distinct image, each pinned to
        its base's bits on this engine (:func:`orchestrator.images.prepare.prepare_images`);
        record them in the results folder's image state."""
        build.check_image_templates(self.matrix, cells, self.name)
        keys = selection.needed_keys(self.matrix, cells)
        ledger = Ledger(self.paths.results_root)
        host = None
        if any(k.ngc_release is None and selection.is_auto(self.matrix, k.hardware)
               for k in keys):
            host = selection.HostDriver.from_facts(gpus.local_facts())
            ledger.saw(host)
        engine = Engine("localhost", self.client, host)
        for prepared in prepare_images(self.matrix, keys, engine, ledger, on_log=on_log,
                                       say=on_log):
            assert prepared.record is not None  # else it raised
            self.images[prepared.key] = prepared.record
        self.image_tags = {k.hardware: r.tag for k, r in self.images.items()
                           if k.ngc_release is None}
        problem = ledger.save()
        if problem and on_log:
            on_log(problem)

    def image_for(self, cell: Cell) -> str | None:
        """The tag of the image ``cell`` runs (None: none was prepared for it)."""
        record = self.images.get(selection.image_key(self.matrix, cell))
        return record.tag if record else self.image_tags.get(cell.hardware)

    def provenance(self, spec: LaunchSpec) -> dict[str, Any]:
        """The base's provenance, and what the image's build recorded (image ID, base, release)."""
        info = super().provenance(spec)
        record = next((r for r in self.images.values() if r.tag == spec.image), None)
        if record is not None:
            info.update(record.provenance())
        return info

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        return self._container(cell, allocation, self.image_for(cell), attempt)

    def _container(self, cell: Cell, allocation: Allocation, image: str | None,
                   attempt: int = 1) -> LaunchSpec:
        return container_spec(
            cell, self.matrix.profile(cell), self.matrix.program(cell),
            image=image,
            output_dir=self.paths.absolute_cell_dir(cell.id),
            labels=container_labels(self.matrix.name, self.paths.run_id, cell.id),
            attempt=attempt,
            gpu_ids=allocation.gpu_ids,
        )

    def dry_spec(self, cell: Cell) -> LaunchSpec:
        """The container ``cell`` would get: its image as planned (the tag covers the build
        context; a build pins it to the base's bits), or, for ``release = "auto"``, the image
        of the release this machine's driver runs."""
        return self._container(cell, self.dry_allocation(cell), planned_tag(
            self.matrix, cell, self._planned_driver, self.image_plans))

    @functools.cached_property
    def _planned_driver(self) -> selection.HostDriver | None:
        """The driver an auto release is planned for, found once (the target's)."""
        if not any(selection.is_auto(self.matrix, hw) for hw in self.matrix.profiles):
            return None
        return selection.HostDriver.from_facts(self.options.target.facts or gpus.local_facts())

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
