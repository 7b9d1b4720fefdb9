"""The target: the machine a plan is for, and what the cells need there.

A matrix can be right everywhere and still not run here: no GPU, no Docker engine, no
``apptainer``, a lab's checkout under ``/opt/lab`` or a data set under ``/data`` that this machine
does not have. The one decision (:func:`orchestrator.backends.checks.preflight`) tells the two
apart: a problem of the file is a :class:`~orchestrator.errors.Problem` (exit 2, everywhere), a
problem of the machine the cells run on is a :class:`~orchestrator.errors.Requirement` of a kind
(:data:`KINDS`), with the cells that need it. ``validate`` and the sweep refuse an unmet
requirement (:class:`~orchestrator.errors.RequirementsUnmet`, exit 3); ``plan`` and ``matrix
--dry-run`` show the whole plan, every cell's launch, and then the requirements
(:func:`lines`), as ReFrame's ``--dry-run`` and Ramble's ``workspace setup --dry-run`` write
every job script without the system they are for, and exit 3 where the sweep would not start.

The target is this machine (probed: its GPUs once, its engine once, each file and program
once), or one declared with ``--target`` (:func:`parse_target`: ``gpu=V100,gpus=8,
driver=535.104.05``): its GPUs and driver are the declaration's, and nothing of this machine
stands for it: what the cells need there that this machine cannot tell (files, programs, an
engine, environment values) is listed as to check there, never refused. A backend whose cells
run elsewhere (the ssh backend's lab hosts, Slurm's nodes) lists what its record says they need
there (:attr:`~orchestrator.backends.registry.BackendRecord.needs`) the same way.

Pure but for the facts it is handed: no probe of its own.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from orchestrator.backends.registry import BackendRecord
from orchestrator.catalog import gpus
from orchestrator.config.syntax import plural
from orchestrator.errors import (
    MISSING,
    SHORT,
    UNCHECKED,
    ConfigError,
    Problem,
    Requirement,
    RequirementsUnmet,
)
from orchestrator.plan.matrix import Matrix

#: Every kind of requirement, in the order they are listed, with what each is in words.
KINDS: dict[str, str] = {
    "GPUs": "GPUs of a kind and count",
    "driver": "an accelerator driver",
    "python": "this Python's packages",
    "engine": "a container engine",
    "scheduler": "a batch scheduler",
    "binary": "a program on PATH",
    "checkout": "a program's checkout",
    "build file": "a file an image copies in",
    "image": "a container image",
    "data": "a data path",
    "environment": "an environment value",
    "inventory": "a hosts inventory",
    "memory": "a memory cgroup",
}
#: Kinds a declaration answers (``--target gpu=...,driver=...``): the rest of a declared
#: target cannot be told from here.
DECLARED_KINDS = ("GPUs", "driver")

#: How many cell ids a requirement names before counting the rest.
_NAMED = 2


@dataclass(frozen=True)
class Target:
    """The machine a decision is for: this one (``facts`` None: probed where a check needs
    it), or one declared with ``--target`` (its GPUs and driver; nothing else of it known)."""

    facts: gpus.HostFacts | None = None
    #: The declaration as given (``--target``'s text).
    spec: str = ""

    @property
    def declared(self) -> bool:
        return self.facts is not None

    @property
    def name(self) -> str:
        return f"declared: --target {self.spec}" if self.declared else "this machine"


#: This machine.
HERE = Target()

_KEYS = ("gpu", "gpus", "driver")
_DRIVER = re.compile(r"\d+(\.\d+){1,3}(-\d+)?")


def parse_target(text: str) -> Target:
    """``--target``: ``gpu=MODEL[,gpus=N][,driver=VERSION]`` (``gpu=none``: a machine without
    accelerators); a :class:`ConfigError` on ``--target`` naming every problem."""
    problems: list[str] = []
    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            problems.append(f"{part!r} is not KEY=VALUE (keys: {', '.join(_KEYS)})")
        elif key not in _KEYS:
            problems.append(f"unknown key {key!r} (keys: {', '.join(_KEYS)})")
        elif key in values:
            problems.append(f"{key} is given twice")
        else:
            values[key] = value
    model = values.get("gpu", "none")
    accelerator: str | None = None
    if model.lower() not in ("none", "cpu"):
        if gpus.compute_capability(model):
            accelerator = "nvidia"
        elif gpus.gaudi_generation(model):
            accelerator = "gaudi"
        else:
            problems.append(f"unknown GPU {model!r} (known: "
                            f"{', '.join(gpus.known_accelerators())})")
    count = 0 if accelerator is None else 1
    if "gpus" in values:
        try:
            count = int(values["gpus"])
        except ValueError:
            problems.append(f"gpus = {values['gpus']!r} is not a whole number")
        else:
            if not 0 <= count <= 256 or (accelerator is None and count):
                problems.append(f"gpus = {count}: give 1..256 with a gpu model (0 with none)")
    driver = values.get("driver")
    if driver is not None and not _DRIVER.fullmatch(driver):
        problems.append(f"driver = {driver!r} is not a driver version (e.g. 535.104.05)")
    if problems:
        raise ConfigError([Problem("--target", "", p) for p in problems])
    facts = gpus.HostFacts(
        name="the target", reachable=True, accelerator=accelerator, driver=driver,
        gpus=tuple(gpus.GpuInfo(i, model, None) for i in range(count)),
        notes=() if accelerator else ("declared without accelerators",))
    return Target(facts, text)


# --- the requirements of a decision ------------------------------------------------------------


def listed(matrix: Matrix, problems: Iterable[Problem], record: BackendRecord,
           target: Target) -> list[Requirement]:
    """Every requirement the decision found (``problems``: its errors, warnings and notes;
    the requirements among them), the record's needs where they are not probed here, each
    with the cells that need it, in the order of :data:`KINDS`.

    For a declared target, what this machine lacks is no answer for the target: listed as to
    check there (:data:`UNCHECKED`), but for what the declaration says (GPUs, driver)."""
    found: list[Requirement] = []
    for problem in problems:
        if not isinstance(problem, Requirement):
            continue
        if target.declared and problem.state == MISSING and problem.kind not in DECLARED_KINDS:
            problem = dataclasses.replace(problem, state=UNCHECKED, message=(
                f"{problem.message} (whether the target has it is not checked from here)"))
        found.append(problem)
    for need in record.needs:
        if target.declared or need.on == "cells":
            where = "the target" if target.declared else "where the cells run"
            found.append(Requirement("", f"{record.name} backend", (
                f"{where} needs {need.what}" + (f": {need.how}" if need.how else "")),
                kind=need.kind, state=UNCHECKED))
    found = list(dict.fromkeys(with_cells(matrix, found)))
    order = list(KINDS)
    return sorted(found, key=lambda r: order.index(r.kind) if r.kind in order else len(order))


def with_cells(matrix: Matrix, found: Iterable[Requirement]) -> list[Requirement]:
    """Each requirement with the cells that need it: its own, else the cells of the profile
    or program its field names (``hardware.NAME``, ``commands.NAME``), else every cell."""
    cells = matrix.checked_cells
    by_hardware: dict[str, list[str]] = {}
    by_program: dict[str, list[str]] = {}
    for cell in cells:
        by_hardware.setdefault(cell.hardware, []).append(cell.id)
        if matrix.commands:
            by_program.setdefault(matrix.program(cell).name, []).append(cell.id)
    every = tuple(c.id for c in cells)
    out = []
    for req in found:
        if not req.cells:
            head, _, rest = req.field.partition(".")
            name = rest.partition(".")[0]
            ids = (by_hardware.get(name) if head == "hardware" else
                   by_program.get(name) if head == "commands" else None)
            req = dataclasses.replace(req, cells=tuple(ids) if ids else every)
        out.append(req)
    return out


def narrowed(found: Iterable[Requirement], matrix: Matrix, selected: Collection[str]
             ) -> list[Requirement]:
    """The requirements of the cells ``selected`` (``--only``, ``--exclude``) and of the
    controls of their hardware, each with those of its cells only; a requirement no selected
    cell needs is left out (what the sweep of the selection does not need, it does not lack)."""
    hardware = {c.hardware for c in matrix.cells if c.id in selected}
    keep = set(selected) | {c.id for hw, c in matrix.controls.items() if hw in hardware}
    out = []
    for req in found:
        ids = tuple(i for i in req.cells if i in keep)
        if ids:
            out.append(dataclasses.replace(req, cells=ids))
    return out


def unmet(found: Iterable[Requirement]) -> list[Requirement]:
    """The requirements that stop the sweep: checked, and missing."""
    return [r for r in found if r.state == MISSING]


def refusal(problems: Sequence[Problem]) -> ConfigError:
    """The error of a refusal: :class:`~orchestrator.errors.RequirementsUnmet` (exit 3) when
    every problem is a requirement of the target, else a :class:`ConfigError` (exit 2)."""
    if problems and all(isinstance(p, Requirement) for p in problems):
        return RequirementsUnmet(list(problems))
    return ConfigError(list(problems))


# --- shown ---------------------------------------------------------------------------------------

_STATES = {
    MISSING: "not met",
    SHORT: "falls short for some cells (the sweep starts; those cells cannot run as planned)",
    UNCHECKED: "to check on the target (this machine cannot tell)",
}


def who(ids: Sequence[str]) -> str:
    """``cell a`` / ``40 cells: a, b, ...``."""
    if len(ids) == 1:
        return f"cell {ids[0]}"
    more = ", ..." if len(ids) > _NAMED else ""
    return f"{len(ids)} cells: {', '.join(ids[:_NAMED])}{more}"


def verdict(found: Sequence[Requirement], target: Target) -> str:
    """One line: whether the sweep would start on the target."""
    missing = unmet(found)
    where = "on the target, as far as this machine can tell" if target.declared else "here"
    if missing:
        return (f"the sweep would not start {where}: {plural(len(missing), 'requirement')} "
                "not met (exit 3)")
    rest = sum(1 for r in found if r.state == UNCHECKED)
    tail = f" ({plural(rest, 'requirement')} to check on the target)" if rest else ""
    return f"the sweep would start {where}{tail}"


def _names(message: str, cell_id: str) -> bool:
    """Whether ``message`` names cell ``cell_id`` (as a word of its own)."""
    return re.search(rf"(?<![\w.-]){re.escape(cell_id)}(?![\w.-])", message) is not None


def lines(found: Sequence[Requirement], target: Target, where: str = "") -> list[str]:
    """The requirements for people, grouped by state (not met, falls short, to check there),
    each with its kind, the field that asks for it, the cells and what to do; then the
    verdict. ``where``: where the cells run, in words (default: the target's name)."""
    out = [f"requirements of the target ({where or target.name}):" if found else
           f"requirements of the target ({where or target.name}): all met"]
    for state, title in _STATES.items():
        group = [r for r in found if r.state == state]
        if not group:
            continue
        out.append(f"  {title}:")
        for req in group:
            named = req.cells and not _names(req.message, req.cells[0])  # else the message does
            out.append(f"    - {req.kind or 'other'}" + (f" ({who(req.cells)})" if named else ""))
            out.append(f"        {req}")  # file: field: message, as validate's refusal says it
    out.append(verdict(found, target))
    return out
