"""Runtimes: what a cell's program runs in, on whatever machine its backend placed it.

A backend says *where* a cell runs (this machine, a lab host over SSH, a Slurm node); a runtime
says *in what*: this machine's Python, a Docker container, an Apptainer / SingularityCE image.
ReFrame keeps container platforms apart from schedulers and launchers the same way: the
runtime is an axis beside the backends. A profile's ``runtime`` names it, else its backend's own
is used; which runtimes a backend runs, and its own, are facts of the backend's record
(:class:`orchestrator.backends.BackendRecord`), which the checks hand to the runtimes' checks
as :class:`BackendFacts`: a runtime never names a backend. Each runtime is one module, and each
says the same three things: how a cell's argv is wrapped, what the runtime needs from the host
(made sure of before the first cell), what it checks before the run (``validate``,
``--dry-run`` and the sweep ask the same functions, through
:mod:`orchestrator.backends.checks`):

* :mod:`~orchestrator.runtimes.none` — no container: the program runs with this machine's
  Python from this checkout (process and slurm backends);
* :mod:`~orchestrator.runtimes.docker` — a Docker container on an engine, this machine's or a
  lab host's (docker and ssh backends): the container's spec and ``containers.run`` arguments;
  its images are :mod:`orchestrator.images.prepare`'s;
* :mod:`~orchestrator.runtimes.apptainer` — ``apptainer exec`` of a ``.sif`` (process, ssh and
  slurm backends): the argv and the environment it passes, the ``.sif`` and the binary each
  machine needs.

May import: errors, config, catalog, plan, images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from orchestrator.errors import Problem


class BackendFacts(Protocol):
    """What a runtime's checks know of the backend its cells run on: the facts of its record
    (:class:`orchestrator.backends.BackendRecord`), never its name compared."""

    @property
    def name(self) -> str:
        """The backend's name (for messages)."""

    @property
    def runtimes(self) -> tuple[str, ...]:
        """Every runtime it runs."""

    @property
    def multi_node(self) -> str:
        """How one cell spans several machines (``nodes``, ``hosts``, ``""``: never)."""


class Report(Protocol):
    """Where a runtime's checks put what they find (the checks' findings)."""

    def error(self, problem: Problem) -> None:
        """The cells cannot run so."""

    def note(self, problem: Problem) -> None:
        """Something the checks could not tell, or a value that is not used."""
