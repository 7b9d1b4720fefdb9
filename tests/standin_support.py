"""The STAND-IN workload in matrices: cells that run ``tests/standin/workload_standin.py``
instead of the real workload, for the plumbing tests (sweeps, resume, interrupts, timeouts,
locks, the Docker, SSH and Slurm backends).

The stand-in speaks the workload's JSON lines, exit codes and files (checked against the real
workload by tests/test_standin.py) but runs no model: a cell takes a fraction of a second
instead of a torch import and a training step. It reaches a cell the way any other program
does, through a ``[commands.standin]`` template (a mechanism users have, nothing test-only in
the product): its figures are read by the workload's own parser (the default for a command),
and the cell's ``program`` says ``standin`` in every result, so nothing it produces can pass
for a real measurement.

Tests take the ``standin`` fixture (:class:`Standin`), which marks them ``subprocess``
(integration tier). The few true end-to-end tests that must run torch use
``workload_support.tiny_matrix`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workload_support import TINY_WORKLOAD

STANDIN_DIR = Path(__file__).resolve().parent / "standin"
STANDIN = STANDIN_DIR / "workload_standin.py"
#: Where containers see STANDIN_DIR (mounted read-only).
CONTAINER_DIR = "/opt/orchestrate-standin"

#: The workload flags the template passes: the cell parameters the workload reads.
FLAGS = ("--arch={arch} --mode={mode} --batch-size={batch_size} --precision={precision} "
         "--image-size={image_size} --warmup={warmup} --iterations={iterations} --data={data} "
         "--num-classes={num_classes} --seed={seed} --output-dir={output_dir}")

#: The parameters of a stand-in cell: workload_support.TINY_WORKLOAD's, so that the tests'
#: ``.replace("iterations = 2", ...)`` edits keep working, run by the stand-in.
STANDIN_WORKLOAD = 'program = "standin"\n' + TINY_WORKLOAD


def command_table(knobs: str = "", *, path: str = str(STANDIN), launcher: str = "self") -> str:
    """The ``[commands.standin]`` table: ``python STANDIN <the workload's flags> <knobs>``.

    ``knobs``: ``--standin-*`` options (see the stand-in's docstring); ``path``: where the cell
    sees the script (:data:`CONTAINER_DIR` in a container); ``launcher``: ``self`` (one process,
    the stand-in starts its own children when asked) or ``torchrun`` (a multi-node cell: one
    stand-in per rank under torch's launcher, which needs torch where the cell runs)."""
    return (
        "\n[commands.standin]\n"
        'description = "STAND-IN for the workload (tests/standin/workload_standin.py): no '
        'model, speaks its JSON lines"\n'
        f'command = "{{python}} {path} {FLAGS} {knobs}"\n'
        f'launcher = "{launcher}"\n'
    )


def standin_matrix(name: str, *, timeout_s: int | None = None, knobs: str = "") -> str:
    """A matrix named ``name`` of one stand-in cell on the ``cpu`` profile (the caller appends
    axes or a profile table), like ``workload_support.tiny_matrix`` for the real workload."""
    timeout = f"timeout_s = {timeout_s}\n" if timeout_s is not None else ""
    return (f'[matrix]\nname = "{name}"\n{timeout}[workload]\nhardware = "cpu"\n'
            f"{STANDIN_WORKLOAD}{command_table(knobs)}")


def container_mount() -> str:
    """The container ``mounts`` entry that shows the stand-in to a cell's container."""
    return f'{{ source = "{STANDIN_DIR}", target = "{CONTAINER_DIR}", read_only = true }}'


@dataclass(frozen=True)
class Standin:
    """What the ``standin`` fixture gives a test (see the module docstring)."""

    path: Path = STANDIN
    workload: str = STANDIN_WORKLOAD

    def matrix(self, name: str, *, timeout_s: int | None = None, knobs: str = "") -> str:
        """:func:`standin_matrix`."""
        return standin_matrix(name, timeout_s=timeout_s, knobs=knobs)

    def command(self, knobs: str = "", *, container: bool = False,
                launcher: str = "self") -> str:
        """:func:`command_table`, in a container at :data:`CONTAINER_DIR` when ``container``."""
        path = f"{CONTAINER_DIR}/{STANDIN.name}" if container else str(STANDIN)
        return command_table(knobs, path=path, launcher=launcher)
