"""No container: a cell's program runs with this machine's Python, from this checkout.

The process backend starts it here; the slurm backend's batch script runs it on a node that
shares this machine's filesystem (the usual cluster setup).

**How the argv is wrapped**: not at all. The program (our workload, or a ``[commands.NAME]``
template: :func:`orchestrator.plan.launch.cell_command`) runs with this interpreter
(``sys.executable``; several GPUs under torchrun), in the command's ``workdir``, else this
checkout, with this checkout first on ``PYTHONPATH`` (:func:`python_path`) so ``-m workload``
imports this checkout's workload: :func:`command`.

**What it needs from the host**: torch in this Python (:func:`python_problem`; the process
backend refuses to start without it, a Slurm node's is its own).

**What it checks before the run** (:func:`check_profile`): nothing it refuses; a profile's
``image`` and ``release`` are noted as unused (no image runs), and a cell's ``ngc_release``,
which picks an image, is refused (:func:`release_refusal`). The software the cells run on is
this interpreter's torch (:func:`orchestrator.plan.software.host_stack`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

from orchestrator import REPO_ROOT
from orchestrator.config.matrix_file import HardwareProfile, Program
from orchestrator.errors import Problem
from orchestrator.plan.launch import CellCommand, NodeLaunch, cell_command
from orchestrator.plan.matrix import Cell
from orchestrator.runtimes import BackendFacts, Report


def command(cell: Cell, profile: HardwareProfile, program: Program, *, output_dir: str,
            gpu_ids: tuple[int, ...] = (), node: NodeLaunch | None = None) -> CellCommand:
    """The cell's program with this Python, in the command's ``workdir`` else this checkout;
    ``gpu_ids``: the local GPUs to pin (none under Slurm, which sets ``CUDA_VISIBLE_DEVICES``
    for the GPUs it grants); ``node``: the cell's part of a multi-node launch."""
    found = cell_command(cell, profile, program, python=sys.executable, output_dir=output_dir,
                         gpu_ids=gpu_ids, node=node)
    return dataclasses.replace(found, workdir=found.workdir or str(REPO_ROOT))


def python_path(environ: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` of the cell: this checkout, then ``environ``'s own (none: a batch job's
    node, whose environment is not known here)."""
    inherited = (environ or {}).get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(REPO_ROOT), inherited) if p)


def provenance() -> dict[str, Any]:
    """The Python environment that ran the cell (the result's provenance)."""
    return {
        "python": sys.executable,
        "python_version": sys.version.split()[0],
        "venv": sys.prefix if sys.prefix != sys.base_prefix else None,
    }


def python_problem(backend: str) -> str | None:
    """Why this Python cannot run the workload (no torch), said for ``backend``; None: it can."""
    if importlib.util.find_spec("torch") is not None:
        return None
    return (f"the {backend} backend runs the workload with this Python ({sys.executable}), "
            "which has no torch: install it with `pip install -e '.[workload]'` "
            "(or `make venv`), or choose --backend docker")


def check_profile(report: Report, file: str, hw: str, profile: HardwareProfile,
                  on: BackendFacts) -> None:
    """Notes on what a profile sets that no container uses (its image, its release)."""
    where, backend = f"hardware.{hw}", on.name
    if profile.image is not None:
        report.note(Problem(file, f"{where}.image", (
            f"not used: the {backend} backend runs this machine's Python and its torch, not "
            f"the image {profile.image!r}")))
    if profile.release is not None:
        report.note(Problem(file, f"{where}.release", (
            f"not used: the {backend} backend runs this machine's Python, whose torch no "
            "release picks (release = 'auto' applies to the docker and ssh backends)")))


def release_refusal(hw: str, backend: str) -> str:
    """Why cells of ``hw`` cannot pin an ``ngc_release`` on ``backend``: no image runs them."""
    return (f"ngc_release picks the NGC image of hardware {hw!r}'s cells; the {backend} "
            "backend runs this machine's Python instead: remove it, or run with "
            "--backend docker or ssh")
