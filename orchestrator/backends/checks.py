"""Can this run? The semantic checks of a matrix, before anything is built or launched.

:func:`~orchestrator.plan.matrix.load_matrix` checks a matrix file's structure and types and
expands it into cells; this module asks of every cell whether it can run where it is planned,
and of the matrix whether its comparisons hold. It only decides: the software a profile's cells
run on is :mod:`orchestrator.plan.software`'s (:class:`~orchestrator.plan.software.PlannedStack`),
what each runtime refuses is the runtime's (:mod:`orchestrator.runtimes`: ``check_profile``).

It is the one place for these rules, with one decision (:func:`refuse_unrunnable`) that
``orchestrate validate``, ``plan`` and ``matrix`` (``--dry-run`` too, before a run folder
exists) take, and one entry point for the sweep (:func:`preflight`: that decision, the backend
picked and available, what this machine lacks for the run), so what the run refuses, validate
and ``--dry-run`` refuse too.

A cell's stack: the backends that run images (docker, ssh; Apptainer on process, ssh and slurm)
run the profile's image, whose root base names an NGC PyTorch release, a Habana installer, or
something else (unknown); a cell's ``ngc_release`` replaces its profile's release. A profile
with ``release = "auto"`` has its release chosen per host from the host's driver when the sweep
runs: its cells are checked against every release a host may get; what fails on every one of
them is an error, what fails only on older ones a warning naming them. The backends that run
this machine's Python (process, slurm) run this interpreter's torch: a release there is not
theirs to pick (``ngc_release`` is refused, ``release = "auto"`` noted as unused).

Rules; an error names the file and the field where the value is set (``axes.arch[1]``,
``hardware.v100.image_vars.base_tag``), every problem at once:

* image: docker/ssh need an image template that builds a Docker image (not a Singularity
  definition); an NGC release below the workload's floor is refused with the reason.
* runtime: each runtime's own checks (:mod:`orchestrator.runtimes`): a profile with ``runtime
  = "apptainer"`` (or ``"singularity"``) runs its image (a Singularity definition, a Dockerfile
  template converted, or a ready ``apptainer.sif``) on the process, ssh and slurm backends, not
  on docker; CUDA or CPU profiles only (no Gaudi, no Bitfusion wrapper, no multi-host cells on
  ssh), a release of its own (no ``release = "auto"``); its bind paths are absolute and free of
  apptainer's separators ``,`` and ``:``; a runtime binary missing from this machine's PATH is a
  note (the sweep refuses it where the cells run, with bind sources that do not exist there:
  :func:`orchestrator.runtimes.apptainer.host_problems`). ``runtime = "docker"`` on the process
  or slurm backend is refused.
* arch: a model the workload builds on the stack's torchvision (else ``did you mean``);
  ``pretrained`` is refused for the workload's own DeepLearningExamples models (no weights).
* compile: needs torch >= 2.0 on the stack and, on CUDA, a GPU Triton compiles for (7.0+); on
  Gaudi torch.compile is ``hpu_mode = "compile"``.
* precision: bf16 on CUDA needs compute capability 8.0+; amp (fp16 autocast with a GradScaler)
  is refused on cpu and hpu (Gaudi's mixed precision is bf16: amp would run as bf16).
* cuda_graphs only on CUDA; profiler nsys/ncu only on CUDA and only in an image that ships the
  tool (NGC PyTorch does, Habana's does not); ncu needs compute capability 7.0+.
* hpu_mode only on hpu profiles; ``PT_HPU_LAZY_MODE`` belongs to the cell (from hpu_mode), not
  to a profile's env.
* release: ``ngc_release`` only where the backend runs images and the profile's template takes
  an NGC release it does not fix otherwise (no ``base_image``, no ``release = "auto"``); a
  release below the floor is refused. ``release = "auto"`` needs a template with a release
  family (NGC ``base_tag``, Gaudi ``synapse_version``) that image_vars leave to it.
* baseline: its key is a cell parameter and its value one of that parameter's; some cell has it,
  and some other cell has a row to compare with (equal in every other parameter).
* a cell that runs another program (a ``[commands.NAME]`` template): arch, pretrained, compile,
  precision and cuda_graphs are the template's business (what they mean to the program is its
  mapping), so the workload's rules are not applied; the stack, image and profiler rules are.
  ``profiler = "torch"`` is refused (it lives inside our workload); a wrapping profiler whose
  capture waits for markers the program may not set gets a note. A parameter the matrix varies
  that the template never uses is a warning (its cells would run the same command). Our
  workload's cells must be read by the ``workload`` parser (a ``[figures]`` table meant for
  another program, applied to them, is an error); a command read by the ``workload`` parser
  gets a note.

Warnings (``validate --strict`` makes them errors): a baseline that pairs profiles whose planned
stacks differ (the ratio would mix software and hardware; the table marks such rows too), CUDA
graphs the workload would not capture (with compile, or with several GPUs), what an auto release
cannot do on the older releases a host may get. A baseline on ``ngc_release`` compares releases
on the same hardware by design: a note says so, not a warning (the table labels those ratios as
the release comparison). Notes say what could not be checked (an unknown GPU, a base image
outside the release table, the host's profilers, the release an auto profile gets per host).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from orchestrator.backends import (
    BackendRecord,
    backend_class,
    backend_for,
    backend_record,
    find_record,
    gpu_checks,
    runs,
)
from orchestrator.backends import target as target_module
from orchestrator.backends.target import HERE, Target
from orchestrator.catalog import checkouts, debs, gpus, releases, stacks, templates
from orchestrator.config.defaults import hosts_file
from orchestrator.config.matrix_file import (
    ORCHESTRATOR_PARAMS,
    PARAM_NAMES,
    CellParams,
    CommandRenderError,
    HardwareProfile,
    Program,
    command_values,
    param_type,
    profile_window_problem,
)
from orchestrator.config.redact import missing_references
from orchestrator.config.syntax import param_matches
from orchestrator.errors import SHORT, UNCHECKED, ConfigError, Problem, Requirement
from orchestrator.plan import profilers, selection, software
from orchestrator.plan.launch import hpu_mode
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import holds_local_gpus
from orchestrator.plan.software import NOT_CHECKED, PlannedStack
from orchestrator.runtimes import apptainer, docker, none

if TYPE_CHECKING:
    from orchestrator.backends.base import Backend

log = logging.getLogger(__name__)

_TOOLS = {"nsys": "Nsight Systems (nsys)", "ncu": "Nsight Compute (ncu)", "nvprof": "nvprof"}


@dataclass
class Findings:
    """What :func:`check_matrix` found: errors, warnings, notes (each once), and the stack of
    every hardware profile the cells use."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    stacks: dict[str, PlannedStack] = field(default_factory=dict)
    #: (hardware, ngc_release) -> the stack of cells that pin a release
    release_stacks: dict[tuple[str, str], PlannedStack] = field(default_factory=dict)
    #: hardware -> the GPUs its cells get, in words (where the checks know them)
    gpus: dict[str, str] = field(default_factory=dict)

    def stack_of(self, cell: Cell) -> PlannedStack:
        """The stack ``cell`` runs on: its pinned release's, else its profile's."""
        release = cell.params.ngc_release
        if release is not None and (cell.hardware, release) in self.release_stacks:
            return self.release_stacks[(cell.hardware, release)]
        return self.stacks[cell.hardware]

    def error(self, problem: Problem) -> None:
        if problem not in self.errors:
            self.errors.append(problem)

    def warning(self, problem: Problem) -> None:
        if problem not in self.warnings:
            self.warnings.append(problem)

    def note(self, problem: Problem) -> None:
        if problem not in self.notes:
            self.notes.append(problem)

    def refuse(self, *, strict: bool = False) -> None:
        """Raise a :class:`ConfigError` listing every error (and, ``strict``, every warning);
        :class:`~orchestrator.errors.RequirementsUnmet` where each is the machine's."""
        problems = self.errors + (self.warnings if strict else [])
        if problems:
            raise target_module.refusal(problems)


# --- entry points ------------------------------------------------------------------------------


def check_matrix(
    matrix: Matrix, backend: str | None = None, *, comparisons: bool = True,
    machine: gpus.HostFacts | None = None, anywhere: bool = False,
) -> Findings:
    """Check every cell of ``matrix`` against the stack it will run on with ``backend`` (default
    ``[matrix] backend``) and the GPU it will get (:mod:`orchestrator.backends.gpu_checks`),
    and, with ``comparisons``, the matrix's baseline. Pure apart from reading the template,
    release and model tables, this interpreter's torch files and, for the backends that run
    cells here, this machine's GPUs (``machine``: those facts given instead, e.g. by a test;
    ``anywhere``: they are a declared target's, where every backend's cells run)."""
    backend = backend or matrix.settings.backend
    on = find_record(backend)  # None: a backend these checks do not know (notes say so)
    file = str(matrix.path)
    found = Findings()
    for hw in sorted({c.hardware for c in matrix.cells}):
        found.stacks[hw] = _profile_checks(found, file, hw, matrix.profiles[hw], backend, on)
    places = _Places(matrix.raw)
    for hw, release in sorted({(c.hardware, c.params.ngc_release) for c in matrix.cells
                               if c.params.ngc_release is not None}):
        found.release_stacks[(hw, release)] = _release_checks(
            found, file, places, hw, matrix.profiles[hw], release, backend, on)
    configurations = _configurations(matrix.checked_cells)
    for cell in configurations:
        stack = found.stack_of(cell)
        profile = matrix.profiles[cell.hardware]
        program = matrix.program(cell)
        if stack.candidates:
            _check_candidates(found, file, places, cell, profile, stack, program)
        else:
            _CellCheck(found, file, places, cell.params, profile, stack, program).run()
    _program_checks(found, file, matrix, configurations)
    _node_checks(found, file, places, configurations, on)
    _gpu_checks(found, file, places, matrix, on, machine, anywhere)
    if comparisons and matrix.settings.baseline:
        _baseline_checks(found, file, matrix)
    return found


def refuse_unrunnable(
    matrix: Matrix, backend: str | None = None, *, comparisons: bool = True, strict: bool = False,
    machine: gpus.HostFacts | None = None,
) -> Findings:
    """:func:`check_matrix`, raising a :class:`ConfigError` with every error (``strict``: and
    every warning) before anything is built or launched. Returns the findings otherwise.

    The one decision ``validate``, ``plan``, ``matrix --dry-run`` and the sweep
    (:func:`preflight`) all take."""
    found = check_matrix(matrix, backend, comparisons=comparisons, machine=machine)
    found.refuse(strict=strict)
    return found


@dataclass
class Decision:
    """What :func:`preflight` decided, for the command that asked to act on without deciding
    again (the sweep: :func:`orchestrator.sweep.run_sweep`; the dry run; ``plan``): the
    backend the cells run on (its name, class and record), the hosts inventory it reads, the
    checks' findings (their warnings and notes, for the command to show), and what the cells
    need on the target (:mod:`orchestrator.backends.target`: not met, falling short, or to
    check there)."""

    backend: str
    cls: type[Backend]
    findings: Findings
    record: BackendRecord
    #: The inventory the backend reads (:func:`inventory_file`); None: none.
    hosts_file: Path | None = None
    #: Every requirement of the target, with its state and cells.
    requirements: list[Requirement] = field(default_factory=list)
    #: The machine the decision is for (this one, or one declared with ``--target``).
    target: Target = HERE

    @property
    def unmet(self) -> list[Requirement]:
        """What the target lacks: the sweep would not start (exit 3)."""
        return target_module.unmet(self.requirements)

    @property
    def starts(self) -> bool:
        """Whether the sweep would start on the target (nothing unmet)."""
        return not self.unmet

    @property
    def where(self) -> str:
        """Where the cells would run, in words (the requirements' heading)."""
        if self.target.declared:
            return self.target.name
        if self.record.here:
            return "this machine"
        if self.record.inventory:
            return (f"the hosts of {self.hosts_file}" if self.hosts_file
                    else "the hosts of an inventory (none given)") + ", from this machine"
        return f"where the {self.backend} backend runs the cells, from this machine"


def preflight(
    matrix: Matrix, override: str | None = None, *, hosts_file: Path | None = None,
    comparisons: bool = False, strict: bool = False, machine: gpus.HostFacts | None = None,
    target: Target = HERE, refuse: bool = True, selected: Collection[str] | None = None,
) -> Decision:
    """Everything a sweep refuses before its run folder exists: **the one decision** that
    ``validate``, ``plan``, ``matrix --dry-run`` and the sweep
    (:func:`orchestrator.sweep.run_sweep`) take, from this one function, so none of them says
    yes to what another refuses.

    Every problem at once, one :class:`ConfigError`: the backend's name (``override``, else
    ``[matrix] backend``; a backend of this build); the matrix's own problems on that backend,
    its runtime, stack and GPUs (:func:`check_matrix`; ``comparisons``: the baseline too, which
    the sweep leaves out: a ``--only`` subset may lack its rows; ``strict``: warnings too);
    what this machine lacks for the run (:func:`machine_problems`); what preparing the backend
    would refuse, decided without building, connecting or writing
    (:meth:`~orchestrator.backends.base.Backend.prepare_problems`: image templates and their
    variables, the hosts inventory, memory limits, Apptainer images); whether the backend can
    run here at all and what it finds there (:meth:`~orchestrator.backends.base.Backend.
    target_problems`: no engine, no Slurm, a local base image that is not there).
    ``hosts_file``: ``--hosts``, the first place the inventory is looked for where the backend
    reads one (:func:`inventory_file`).

    A problem of the file is a :class:`ConfigError` (exit 2), always raised. What the target
    lacks (:class:`~orchestrator.errors.Requirement`) is a
    :class:`~orchestrator.errors.RequirementsUnmet` (exit 3), raised with ``refuse``; without
    it (``plan``, ``--dry-run``) the decision carries the requirements for the command to show
    after the plan. ``target``: the machine the decision is for (:func:`~orchestrator.backends.
    target.parse_target`; declared: its GPUs and driver are checked, nothing of this machine
    stands for it). ``selected``: the ids of the cells the command acts on (``--only``,
    ``--exclude``; None: all): the file is checked whole, what the target lacks only for those
    cells and the controls of their hardware, so a selection that leaves out the cells needing
    a GPU starts where there is none."""
    name = backend_for(matrix, override)
    where = {} if override else {"file": str(matrix.path), "field": "matrix.backend"}
    record = backend_record(name, **where)
    cls = backend_class(name, **where)
    hosts_file = inventory_file(matrix, record, hosts_file)
    found = check_matrix(matrix, name, comparisons=comparisons,
                         machine=target.facts or machine, anywhere=target.declared)
    cells = matrix.checked_cells
    problems = list(found.errors)
    problems += machine_problems(matrix, cls)
    problems += cls.prepare_problems(matrix, cells, hosts_file, target=target)
    if not target.declared:  # what only this machine can say (its engine, its scheduler)
        problems += cls.target_problems(matrix, cells)
    for short in [p for p in problems if isinstance(p, Requirement) and p.state == SHORT]:
        problems.remove(short)  # not enough for some cells: a warning (the others run)
        found.warning(short)
    problems = _unique(problems + (found.warnings if strict else []))
    requirements = target_module.listed(
        matrix, [*problems, *found.warnings, *found.notes,
                 *_declared_files(matrix, record, target, problems)], record, target)
    if selected is not None:
        requirements = target_module.narrowed(requirements, matrix, selected)
    missing = {(r.file, r.field, r.message) for r in target_module.unmet(requirements)}
    errors = [p for p in problems  # what the file gets wrong (strict: what falls short too)
              if not isinstance(p, Requirement) or p.state == SHORT]
    if errors or (refuse and missing):
        refused = [p for p in problems  # in the order found
                   if p in errors or (p.file, p.field, p.message) in missing]
        raise target_module.refusal(refused)
    return Decision(name, cls, found, record, hosts_file, requirements, target)


def _declared_files(matrix: Matrix, record: BackendRecord, target: Target,
                    found: list[Problem]) -> list[Requirement]:
    """For a declared target, every file the cells read where they run (what this machine
    has of them says nothing of the target): each to check there, but those this machine
    lacks (already said)."""
    if not target.declared or not record.files_here:
        return []
    said = {p.field for p in found}
    return [Requirement(str(matrix.path), req.field, (
        f"{req.host_path} ({req.what}): {len(req.cells)} cell{'s' if len(req.cells) != 1 else ''}"
        " need it where they run (whether the target has it is not checked from here)"),
        kind="data", cells=req.cells, state=UNCHECKED)
        for req in requirements(matrix, matrix.checked_cells, record)
        if req.host_path is not None and req.field not in said]


def inventory_file(matrix: Matrix, backend: BackendRecord, given: Path | None = None
                   ) -> Path | None:
    """The hosts inventory a sweep of ``matrix`` on ``backend`` reads, where its record says it
    reads one: ``given`` (``--hosts``) > ``[matrix] hosts`` (against the matrix file's folder)
    > ``$ORCHESTRATE_HOSTS`` > the user's config file (None: none anywhere). A backend that
    reads none gets ``given`` as it is."""
    if not backend.inventory:
        return given
    matrix_hosts = matrix.path.parent / matrix.settings.hosts if matrix.settings.hosts else None
    return hosts_file(given, matrix_hosts.resolve() if matrix_hosts else None)


def _unique(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


def machine_problems(matrix: Matrix, backend: type[Backend]) -> list[Problem]:
    """What this machine lacks for a sweep of ``matrix``'s cells on ``backend``, every problem
    at once: a ``$env:NAME`` value of the profiles and commands the cells use (their ``env``, a
    command's ``workdir``) whose variable is not set here (it is read when each cell starts),
    and what the backend's runtime needs where its cells run, as far as this machine tells
    (:meth:`~orchestrator.backends.base.Backend.runtime_problems`)."""
    refs = [(f"hardware.{hardware}.env", matrix.profiles[hardware].env)
            for hardware in sorted({c.hardware for c in matrix.cells})]
    for name in sorted({p.name for p in map(matrix.program, matrix.cells) if p.command}):
        command = matrix.commands[name]
        refs.append((f"commands.{name}.env", command.env))
        if command.workdir is not None:
            refs.append((f"commands.{name}", {"workdir": command.workdir}))
    problems: list[Problem] = [
        Requirement(str(matrix.path), f"{where}.{name}",
                    f"takes its value from ${source} of this environment (\"$env:{source}\"), "
                    f"which is not set: export {source} before the sweep", kind="environment")
        for where, env in refs
        for name, source in missing_references(env)
    ]
    problems += requirement_problems(matrix, matrix.checked_cells, backend_record(backend.name))
    return problems + backend.runtime_problems(matrix, matrix.checked_cells)


# --- files the cells need where they run ---------------------------------------------------------


@dataclass(frozen=True)
class RequiredFile:
    """A file or folder some cells need when they run (a command's ``requires``, a Docker bind
    mount's source): where the program reads it, where that is on the machine the cells run
    on (``host_path``; None: inside the image), and which cells need it."""

    field: str
    path: str
    host_path: str | None
    what: str
    cells: tuple[str, ...]


def requirements(matrix: Matrix, cells: Iterable[Cell], backend: BackendRecord | None = None
                 ) -> list[RequiredFile]:
    """Every file the cells need where they run on ``backend`` (default ``[matrix] backend``),
    each once with the cells that need it: each Docker profile's bind-mount sources (Docker
    refuses a missing one), then each command's ``requires`` entries as the cells render them
    (through the profile's mounts)."""
    backend = backend or backend_record(matrix.settings.backend, file=str(matrix.path),
                                        field="matrix.backend")
    found: dict[tuple[str, str, str | None], list[str]] = {}
    whats: dict[tuple[str, str, str | None], str] = {}
    for cell in cells:
        profile = matrix.profiles[cell.hardware]
        runtime = _runtime_of(profile, backend)
        docker_mounts = profile.container.mounts if runtime == "docker" else []
        key: tuple[str, str, str | None]
        for i, mount in enumerate(docker_mounts):
            key = (f"hardware.{cell.hardware}.container.mounts[{i}].source", mount.target,
                   mount.source)
            found.setdefault(key, []).append(cell.id)
            whats[key] = f"the source of the bind mount at {mount.target}"
        program = matrix.program(cell)
        if program.command is None or not program.command.requires:
            continue
        values = command_values(cell.params, program.name, python="python", output_dir=".",
                                cell_id=cell.id)
        try:
            paths = program.command.required_paths(values)
        except CommandRenderError:
            continue  # the command's own check reports it
        for i, path in paths:
            if not path.startswith("/"):
                path = "/" + path  # a {data} given relative: the program's root, as it reads it
            key = (f"commands.{program.name}.requires[{i}]", path,
                   _host_path(profile, runtime, path))
            found.setdefault(key, []).append(cell.id)
            whats[key] = program.command.requires[i].what
    return [RequiredFile(field, path, host, whats[(field, path, host)], tuple(ids))
            for (field, path, host), ids in found.items()]


def _runtime_of(profile: HardwareProfile, backend: BackendRecord) -> str:
    """What a profile's cells run in on ``backend``: docker, apptainer or none."""
    if profile.apptainer_runtime:
        return "apptainer"
    return profile.runtime or backend.runtime


def _host_path(profile: HardwareProfile, runtime: str, path: str) -> str | None:
    """Where ``path`` (as the program sees it) is on the machine that runs the cell: through the
    profile's mounts in a container (None: inside the image), itself where the cell runs on the
    machine (runtime none)."""
    if runtime == "none":
        return path
    mounts = list(profile.container.mounts)
    if runtime == "apptainer":
        mounts += profile.apptainer.binds
    for mount in sorted(mounts, key=lambda m: len(m.target), reverse=True):
        target = mount.target.rstrip("/") or "/"
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return mount.source.rstrip("/") + path[len(target.rstrip("/")):]
    return None


def requirement_problems(matrix: Matrix, cells: Iterable[Cell], backend: BackendRecord
                         ) -> list[Requirement]:
    """The files of :func:`requirements` missing on this machine, where ``backend`` runs its
    cells on this machine's filesystem (its record's ``files_here``); one problem per
    file, naming the field that declares it and the cells that need it."""
    if not backend.files_here:
        return []
    problems: list[Requirement] = []
    missing: list[str] = []  # mount sources: what is under one is not said again
    for req in requirements(matrix, cells, backend):
        if req.host_path is None or Path(req.host_path).exists():
            continue
        if any(req.host_path.startswith(m.rstrip("/") + "/") for m in missing):
            continue
        if ".container.mounts[" in req.field:
            missing.append(req.host_path)
        shown = ", ".join(req.cells[:2]) + (", ..." if len(req.cells) > 2 else "")
        what = f" ({req.what})" if req.what else ""
        problems.append(Requirement(str(matrix.path), req.field, (
            f"{req.host_path} does not exist on this machine{what}; "
            f"{len(req.cells)} cell{'s' if len(req.cells) != 1 else ''} ({shown}) need it "
            "when they run: put it there, or fix the path"), kind="data", cells=req.cells))
    return problems


# --- where a value is set ------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


class _Places:
    """Where in the matrix file a parameter's value is set (the field an error names)."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    def of(self, key: str, value: Any) -> list[str]:
        """Every field that sets ``key`` to ``value``; ``workload.KEY`` when none does (the
        value is the default)."""
        raw = self.raw
        found: list[str] = []
        axes = raw.get("axes")
        if isinstance(axes, dict) and isinstance(axes.get(key), list):
            found += [f"axes.{key}[{i}]" for i, v in enumerate(axes[key]) if _same(v, value)]
        for z, group in enumerate(raw.get("zip") or []):
            if isinstance(group, dict) and isinstance(group.get(key), list):
                found += [f"zip[{z}].{key}[{i}]" for i, v in enumerate(group[key])
                          if _same(v, value)]
        for i, entry in enumerate(raw.get("include") or []):
            if isinstance(entry, dict) and key in entry and _same(entry[key], value):
                found.append(f"include[{i}].{key}")
        workload = raw.get("workload")
        if isinstance(workload, dict) and key in workload and _same(workload[key], value):
            found.append(f"workload.{key}")
        return found or [f"workload.{key}"]


def _configurations(cells: Iterable[Cell]) -> list[Cell]:
    """One cell per configuration (repeats share everything checked here)."""
    return list({c.group: c for c in cells}.values())


def _did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=cutoff)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    options = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"; did you mean {options}?"


# --- profiles: their stack -----------------------------------------------------------------------


def _profile_checks(
    found: Findings, file: str, hw: str, profile: HardwareProfile, backend: str,
    on: BackendRecord | None,
) -> PlannedStack:
    """Check a profile against the backend (``on``: its record; None: not known here) and its
    runtime; return the stack its cells run on."""
    where = f"hardware.{hw}"
    _accelerator_checks(found, file, where, profile)
    if profile.device == "hpu" and "PT_HPU_LAZY_MODE" in profile.env:
        found.error(Problem(file, f"{where}.env.PT_HPU_LAZY_MODE", (
            "the Gaudi mode is a per-cell choice: set hpu_mode (eager, lazy or compile) and "
            "remove PT_HPU_LAZY_MODE here (orchestrate sets it in each cell's environment)")))
    if profile.apptainer_runtime:
        return _apptainer_stack(found, file, hw, profile, backend, on)
    if on is None:
        found.note(_unknown_backend(file, where, backend))
        return PlannedStack(f"not checked ({backend} backend)", known=False)
    refusal = docker.refused_on(on, runs("docker")) if profile.runtime == "docker" else None
    if refusal:
        found.error(Problem(file, f"{where}.runtime", refusal))
    if on.runtime == "none":  # this machine's Python, no container
        none.check_profile(found, file, hw, profile, on)
        return software.host_stack()
    if profile.release == selection.AUTO:
        return _auto_stack(found, file, hw, profile)
    stack = _image_stack(found, file, hw, profile, on)
    _bitfusion_client_check(found, file, hw, profile, stack)
    _program_revision_check(found, file, hw, profile)
    return stack


def _program_revision_check(found: Findings, file: str, hw: str, profile: HardwareProfile
                            ) -> None:
    """A program checkout at another commit than the matrix's ``program_revision`` is not the
    seed's program: a warning (``--strict`` refuses it); a folder that is no git checkout, a
    note (its revision cannot be told)."""
    wanted = str(profile.image_vars.get("program_revision") or "")
    folder_value = profile.image_vars.get("program_dir")
    if not wanted or not isinstance(folder_value, str):
        return
    folder = Path(folder_value).expanduser()
    if not folder.is_absolute():
        folder = Path(file).parent / folder
    if not folder.is_dir():
        return  # missing: the build-file check says so
    where = f"hardware.{hw}.image_vars.program_revision"
    actual = checkouts.head_revision(folder)
    if actual is None:
        found.note(Problem(file, where, (
            f"{folder} is not in a git checkout: that it is at {wanted} is not checked")))
    elif not checkouts.same_revision(actual, wanted):
        found.warning(Problem(file, where, (
            f"the checkout at {folder} is at {actual}, not {wanted}: the image would hold "
            f"another revision of the program (check out {wanted}, or change the revision)")))


#: Templates whose image runs another program (its own code): any release of the table may be
#: their base; every other template runs our workload (offered releases only).
PROGRAM_TEMPLATES = ("program", "program-bitfusion", "program-sif")


def _bitfusion_client_check(found: Findings, file: str, hw: str, profile: HardwareProfile,
                            stack: PlannedStack) -> None:
    """A Bitfusion client .deb is built for one Ubuntu release: refuse a base of another, and
    name the bases that fit (seed 000's client is for 20.04; NGC 23.10 is 22.04)."""
    if profile.image is None:
        return
    try:
        template = templates.load_template(profile.image)
    except ConfigError:
        return
    if "client_deb" not in template.variables:
        return
    where = f"hardware.{hw}.image_vars"
    value = str(profile.image_vars.get("client_deb") or template.variables["client_deb"].default)
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = Path(file).parent / path
    deb = debs.deb_ubuntu(path)
    base_ubuntu = stack.ubuntu or profile.image_vars.get("base_ubuntu") or None
    if deb.ubuntu is None or base_ubuntu is None:
        what = ("the client's Ubuntu is not known (" + deb.how + ")" if deb.ubuntu is None
                else f"the base image's Ubuntu is not known ({stack.label}; set base_ubuntu)")
        found.note(Problem(file, f"{where}.client_deb", (
            f"the Bitfusion client and the base image must be of one Ubuntu release; {what}: "
            "not checked (the image's build checks it inside the base)")))
        return
    if deb.ubuntu == base_ubuntu:
        return
    foreign = template.name in PROGRAM_TEMPLATES or (
        template.parent is not None and template.parent.template in PROGRAM_TEMPLATES)
    fits = [r for r in releases.load_releases()
            if r.ubuntu == deb.ubuntu and (foreign or r.offered)]
    if fits:
        use = (f"build on a base of Ubuntu {deb.ubuntu}: base_tag = \"{fits[-1].base_tag}\" "
               f"(NGC releases of Ubuntu {deb.ubuntu}: {', '.join(r.name for r in fits)})")
    else:
        newest = [r.name for r in releases.load_releases() if r.ubuntu == deb.ubuntu]
        use = (f"no NGC release the workload runs on is Ubuntu {deb.ubuntu}"
               + (f" ({', '.join(newest)} are, below its floor: run another program there, "
                  "images/program-bitfusion)" if newest else ""))
    found.error(Problem(file, f"{where}.client_deb", (
        f"the Bitfusion client {path.name} is built for Ubuntu {deb.ubuntu} ({deb.how}); the "
        f"base image ({stack.base or stack.label}) is Ubuntu {base_ubuntu}, whose libraries "
        f"do not satisfy it: {use}, or use the client built for Ubuntu {base_ubuntu}")))


def _unknown_backend(file: str, where: str, backend: str) -> Problem:
    return Problem(file, where, (f"the {backend} backend is not known to these checks: its "
                                 "image and stack are not checked"))


def _accelerator_checks(
    found: Findings, file: str, where: str, profile: HardwareProfile
) -> None:
    if profile.gpu is None or profile.compute_capability is not None:
        return
    known = (gpus.compute_capability(profile.gpu) if profile.device == "cuda"
             else gpus.gaudi_generation(profile.gpu))
    if known is None:
        spelled = _did_you_mean(profile.gpu.upper(), gpus.known_accelerators(), cutoff=0.5)
        hint = ("; give its compute_capability (e.g. \"8.0\") to have it checked"
                if profile.device == "cuda" else "")
        found.note(Problem(file, f"{where}.gpu", (
            f"{profile.gpu!r} is not an accelerator these checks know, so what it can do is not "
            f"checked{spelled}{hint}")))


def _image_stack(
    found: Findings, file: str, hw: str, profile: HardwareProfile, on: BackendRecord
) -> PlannedStack:
    """The stack of a profile whose cells run in its Docker image (the Docker runtime's checks
    first: :func:`orchestrator.runtimes.docker.check_profile`)."""
    if not docker.check_profile(found, file, hw, profile, on):
        return NOT_CHECKED
    assert profile.image is not None  # the check says so
    return _template_stack(found, file, f"hardware.{hw}", profile,
                           templates.load_template(profile.image))


def _apptainer_stack(
    found: Findings, file: str, hw: str, profile: HardwareProfile, backend: str,
    on: BackendRecord | None,
) -> PlannedStack:
    """A profile whose cells run under Apptainer: where it can run and its own checks
    (:func:`orchestrator.runtimes.apptainer.check_profile`), then its image's stack."""
    where = f"hardware.{hw}"
    if on is None:
        found.note(_unknown_backend(file, where, backend))
        return NOT_CHECKED
    refusal = apptainer.refused_on(on, profile, runs("apptainer"))
    if refusal:
        found.error(Problem(file, f"{where}.runtime", refusal))
        return NOT_CHECKED
    apptainer.check_profile(found, file, hw, profile, on)
    if profile.image is None or profile.release == selection.AUTO:
        return NOT_CHECKED
    try:
        template = templates.load_template(profile.image)
    except ConfigError:  # load_matrix reported it
        return NOT_CHECKED
    return _template_stack(found, file, where, profile, template)


def _template_stack(found: Findings, file: str, where: str, profile: HardwareProfile,
                    template: templates.Template) -> PlannedStack:
    """The stack an image template builds on (:func:`orchestrator.plan.software.template_stack`)
    and what it says of the profile: a base that cannot be told, a release below the floor."""
    stack = software.template_stack(profile, template)
    if stack.unknown_why == software.UNRESOLVED:
        found.note(Problem(file, f"{where}.image_vars", f"base image not resolved "
                           f"({stack.detail}): its stack is not checked"))
    elif stack.unknown_why == software.UNKNOWN_BASE:
        found.note(Problem(file, f"{where}.image_vars", (
            f"base image {stack.base!r} is not an NGC PyTorch or Habana release these checks "
            "know: its torch, models and profilers are not checked")))
    else:
        fld = (f"{where}.image_vars.base_tag" if "base_tag" in profile.image_vars
               else f"{where}.image")
        stack = _release_findings(found, file, [fld], stack)
    return stack


def _release_findings(found: Findings, file: str, fields: list[str], stack: PlannedStack
                      ) -> PlannedStack:
    """What an NGC release stack says at ``fields``: one the table does not have is a note; one
    below the workload's floor (unlisted and older than the table, or refused by it) is recorded
    on the stack (``refused`` at ``fields``), for each cell's check to decide: refused for our
    workload, allowed for a program that brings its own code (:meth:`_CellCheck.floor`)."""
    at = tuple(fields)
    if stack.unknown_why == software.UNLISTED:
        name = stack.detail
        oldest = releases.load_releases()[0].name
        floor = releases.floor()["release"]
        for place in at:
            found.note(Problem(file, place, (
                f"{stack.base}: NGC PyTorch {name} is not in "
                "orchestrator/data/ngc_releases.toml: its torch, models and profilers are "
                "not checked")))
        if software.release_key(name) < software.release_key(oldest):
            return dataclasses.replace(stack, refused_at=at, refused=(
                f"{stack.base}: NGC PyTorch {name} is older than the workload's floor (torch "
                f"{releases.floor()['torch']}, NGC {floor}): pick {floor}-py3 or newer"))
        return stack
    release = releases.find_release(stack.release) if stack.release else None
    if release is not None and release.refused:
        return dataclasses.replace(stack, refused_at=at, refused=(
            f"NGC PyTorch {release.name} ({stack.base}) is not offered for the workload: "
            f"{release.refused}"))
    return stack


def _auto_stack(found: Findings, file: str, hw: str, profile: HardwareProfile) -> PlannedStack:
    """The stacks a host may get for a profile whose release is chosen per host
    (:func:`orchestrator.plan.software.auto_stack`), and whether its template lets it choose."""
    where = f"hardware.{hw}"
    assert profile.image is not None  # the profile model requires an image with release = auto
    try:
        template = templates.load_template(profile.image)
    except ConfigError:  # load_matrix reported it
        return NOT_CHECKED
    kind = selection.family(template)
    fixed = selection.fixed_base(template, profile.image_vars)
    if kind is None:
        found.error(Problem(file, f"{where}.release", (
            f"release = 'auto' picks a release of the base image, but the template "
            f"{profile.image!r} names none (it has neither base_tag nor synapse_version/"
            "torch_version)")))
        return NOT_CHECKED
    if fixed:
        found.error(Problem(file, f"{where}.image_vars.{fixed[0]}", (
            f"{fixed[0]} fixes the base image, which release = 'auto' chooses per host from its "
            "driver: remove one of them")))
    stack = software.auto_stack(profile, kind)
    candidates = stack.candidates
    span = f"{candidates[0].release}..{candidates[-1].release}" if candidates else "none"
    found.note(Problem(file, f"{where}.release", (
        f"release = 'auto': each host gets the {selection.FAMILY_LABEL[kind]} release its driver "
        f"runs when the sweep reaches it ({span} possible); the cells are checked against each "
        "of them")))
    return stack


def _check_candidates(found: Findings, file: str, places: _Places, cell: Cell,
                      profile: HardwareProfile, stack: PlannedStack, program: Program) -> None:
    """A cell of an auto profile against every stack a host may get: what fails on the newest
    is an error; what fails only on older ones, a warning naming them."""
    results = []
    for candidate in stack.candidates:
        sub = Findings()
        _CellCheck(sub, file, places, cell.params, profile, candidate, program).run()
        results.append((candidate, sub))
    newest, last = results[-1]
    for problem in last.errors:
        found.error(problem)
    for problem in [*last.warnings, *(n for _, s in results for n in s.notes)]:
        (found.warning if problem in last.warnings else found.note)(problem)
    failing = {p.field for p in last.errors}
    worst: dict[str, tuple[PlannedStack, Problem]] = {}
    for candidate, sub in results[:-1]:
        for problem in sub.errors:
            if problem.field not in failing:
                worst[problem.field] = (candidate, problem)  # the newest release it fails on
    for fld, (candidate, problem) in worst.items():
        found.warning(Problem(file, fld, (
            f"on hosts whose driver gets {candidate.release} or older (release = 'auto'): "
            f"{problem.message}")))


def _release_checks(found: Findings, file: str, places: _Places, hw: str,
                    profile: HardwareProfile, release: str, backend: str,
                    on: BackendRecord | None) -> PlannedStack:
    """The stack of cells of ``hw`` that pin ``ngc_release = release``, and whether they can."""
    unknown = PlannedStack(f"NGC PyTorch {release} (not checked)", known=False)

    def error(message: str) -> PlannedStack:
        for where in places.of("ngc_release", release):
            found.error(Problem(file, where, message))
        return unknown

    if on is not None and on.runtime == "none" and not profile.apptainer_runtime:
        return error(none.release_refusal(hw, backend))
    if on is None or profile.image is None:
        return unknown  # the profile's own checks said so
    try:
        template = templates.load_template(profile.image)
    except ConfigError:
        return unknown
    if selection.family(template) != "ngc":
        return error(f"ngc_release picks an NGC PyTorch base, but hardware {hw!r} builds "
                     f"{profile.image!r}, which takes none")
    if profile.release == selection.AUTO:
        return error(f"hardware {hw!r} has release = 'auto' (each host's driver picks); a cell's "
                     "ngc_release pins one: remove one of them")
    fixed = [v for v in selection.fixed_base(template, profile.image_vars) if v != "base_tag"]
    if fixed:
        found.error(Problem(file, f"hardware.{hw}.image_vars.{fixed[0]}", (
            f"{fixed[0]} fixes the base image, which the cells' ngc_release = {release} is to "
            "pick: remove it (a lab mirror: set base_repository)")))
        return unknown
    stack = software.pinned_stack(profile, template, release)
    if stack.unknown_why == software.UNRESOLVED:
        return unknown
    return _release_findings(found, file, places.of("ngc_release", release), stack)


@dataclass
class _CellCheck:
    """The rules for one cell configuration on its profile and stack."""

    found: Findings
    file: str
    places: _Places
    params: CellParams
    profile: HardwareProfile
    stack: PlannedStack
    program: Program = Program("workload")

    @property
    def hw(self) -> str:
        return self.params.hardware

    @property
    def gpu(self) -> str:
        cc = software.capability(self.profile)
        shown = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
        return f"{self.profile.gpu}, {shown}" if self.profile.gpu else shown

    def error(self, key: str, message: str) -> None:
        for where in self.places.of(key, getattr(self.params, key)):
            self.found.error(Problem(self.file, where, message))

    def warning(self, key: str, message: str) -> None:
        for where in self.places.of(key, getattr(self.params, key)):
            self.found.warning(Problem(self.file, where, message))

    def note(self, message: str) -> None:
        self.found.note(Problem(self.file, f"hardware.{self.hw}", message))

    def run(self) -> None:
        self.floor()
        if self.program.command is None:  # what the workload's flags mean is ours to check
            self.arch()
            self.compile()
            self.precision()
            self.cuda_graphs()
        self.profiler()
        self.gaudi()

    def floor(self) -> None:
        """A stack below the workload's floor: refused for our workload, allowed (a note) for
        another program, which brings its own code (the seeds' DLE on NGC 20.03)."""
        if self.stack.refused is None:
            return
        for place in self.stack.refused_at:
            if self.program.command is None:
                self.found.error(Problem(self.file, place, self.stack.refused))
            else:
                self.found.note(Problem(self.file, place, (
                    f"{self.stack.label} is below the workload's floor; program "
                    f"{self.program.name!r} brings its own code, so it runs there (the "
                    "workload's model, precision and compile rules are not applied to it)")))

    def _torch_lacks(self, feature: str) -> str | None:
        if self.stack.torch is None:
            return None
        try:
            return stacks.feature_missing(feature, self.stack.torch)
        except ValueError:  # a version string the checks cannot read: not checked
            return None

    def _torchvision_in_range(self) -> bool:
        """Whether the stack's torchvision is one the model table covers (below the floor the
        release itself is refused; nothing is recorded there)."""
        version = self.stack.torchvision
        if not version or not software.parses(version):
            return False
        return stacks.series(version) >= stacks.series(stacks.model_range()[0])

    def arch(self) -> None:
        arch = self.params.arch
        known = stacks.known_archs()
        if arch not in known:
            floor, newest = stacks.model_range()
            own = ", ".join(stacks.workload_archs())
            self.error("arch", (
                f"{arch!r} is not a model the workload can build (torchvision {floor}..{newest} "
                f"classification models, or DeepLearningExamples' {own})"
                f"{_did_you_mean(arch, known)}"))
        elif self._torchvision_in_range() and not stacks.arch_available(
                arch, self.stack.torchvision or ""):
            self.error("arch", (
                f"{arch!r} is not in torchvision {self.stack.torchvision}, which hardware "
                f"{self.hw!r} runs ({self.stack.label}): pick a newer image or another arch"))
        if self.params.pretrained and arch in stacks.workload_archs():
            self.error("pretrained", (
                f"{arch!r} is built by the workload (DeepLearningExamples' model) and has no "
                "pretrained weights: set pretrained = false"))

    def compile(self) -> None:
        mode = self.params.compile
        if mode == "none":
            return
        if self.profile.device == "hpu":
            self.error("compile", (
                f"on Gaudi (hardware {self.hw!r}) torch.compile is hpu_mode = \"compile\" "
                "(eager mode with the hpu_backend): set compile = \"none\" and hpu_mode"))
            return
        missing = self._torch_lacks("compile")
        cc = software.capability(self.profile)
        if missing:
            self.error("compile", f"compile = {mode!r} on hardware {self.hw!r}: {missing} "
                                  f"({self.stack.label})")
        elif self.profile.device == "cuda" and cc is not None and cc < (7, 0):
            self.error("compile", (
                f"compile = {mode!r}: torch.compile's GPU compiler (Triton) needs compute "
                f"capability 7.0 or newer; hardware {self.hw!r} is {self.gpu}"))

    def precision(self) -> None:
        precision, device = self.params.precision, self.profile.device
        if precision == "amp" and device == "hpu":
            self.error("precision", (
                f"Gaudi's mixed precision is bf16 (hardware {self.hw!r}): amp would run as bf16 "
                "under an amp label; use precision = \"bf16\""))
        elif precision == "amp" and device == "cpu":
            self.error("precision", (
                f"amp is fp16 autocast with a GradScaler, for CUDA GPUs; on the CPU (hardware "
                f"{self.hw!r}) use bf16 or fp32"))
        elif precision == "bf16" and device == "cuda":
            cc = software.capability(self.profile)
            if cc is None:
                self.note("bf16 not checked: the profile does not say which GPU it is (set gpu "
                          "= \"A100\" or compute_capability = \"8.0\")")
            elif cc < (8, 0):
                self.error("precision", (
                    f"bf16 needs compute capability 8.0 (Ampere) or newer; hardware {self.hw!r}"
                    f" is {self.gpu}: use amp (fp16) or fp32"))

    def cuda_graphs(self) -> None:
        if not self.params.cuda_graphs:
            return
        if self.profile.device != "cuda":
            self.error("cuda_graphs", (
                f"CUDA graphs need a CUDA GPU; hardware {self.hw!r} is device "
                f"{self.profile.device!r}: set cuda_graphs = false"))
        elif self.params.compile != "none":
            self.warning("cuda_graphs", (
                f"with compile = {self.params.compile!r} the workload does not capture CUDA "
                "graphs itself (compile manages graphs): the cell runs as its compile-only twin"))
        elif self.params.gpus > 1:
            self.warning("cuda_graphs", (
                f"with gpus = {self.params.gpus} (DDP) the workload does not capture CUDA graphs:"
                " the cell runs eagerly"))

    def profiler(self) -> None:
        tool = self.params.profiler
        if tool == "none":
            return
        foreign = self.program.command is not None
        if foreign and tool == "torch":
            self.error("profiler", (
                f"profiler = \"torch\" is torch.profiler inside our workload; program "
                f"{self.program.name!r} is another program: use nsys or ncu (they wrap any "
                "command), or profile it its own way"))
            return
        window = "" if foreign else profile_window_problem(self.params)
        if window:
            self.error("profile_start", window)
        if tool not in _TOOLS:
            return
        capture = profilers.options_of(self.profile, tool).capture
        if foreign and capture != "whole":
            marks = "cudaProfilerStart/Stop" if capture == "range" else "NVTX range"
            self.note(f"profiler {tool} with capture = {capture!r} records only between the "
                      f"program's own {marks} (program {self.program.name!r}: orchestrate "
                      "cannot tell whether it sets them); capture = \"whole\" records it start "
                      "to end")
        if self.profile.device != "cuda":
            self.error("profiler", (
                f"{_TOOLS[tool]} profiles CUDA GPUs; hardware {self.hw!r} is device "
                f"{self.profile.device!r}: use profiler = \"torch\""))
            return
        cc = software.capability(self.profile)
        unsupported = profilers.tool_problem(tool, cc, self.stack.cuda)
        if unsupported:  # nvprof on Ampere and later, or on a CUDA 12 stack
            self.error("profiler", f"hardware {self.hw!r} ({self.stack.label}): {unsupported}")
            return
        if self.stack.profilers is None:
            self.note(f"profiler {tool}: whether {self.stack.label} has {tool} is not checked")
        elif tool not in self.stack.profilers:
            self.error("profiler", f"{self.stack.label} does not ship {_TOOLS[tool]} "
                                   f"(hardware {self.hw!r})")
        if tool == "ncu" and cc is not None and cc < (7, 0):
            self.error("profiler", (
                f"Nsight Compute profiles compute capability 7.0 (Volta) and newer; hardware "
                f"{self.hw!r} is {self.gpu} (nvprof is the tool there)"))

    def gaudi(self) -> None:
        mode = self.params.hpu_mode
        if mode is not None and self.profile.device != "hpu":
            self.error("hpu_mode", (
                f"hpu_mode applies to Gaudi profiles (device = \"hpu\"); hardware {self.hw!r} is "
                f"device {self.profile.device!r}"))
            return
        if self.profile.device != "hpu":
            return
        if mode is None:
            self.note(f"hpu_mode not set: its cells run in {hpu_mode(self.params, 'hpu')} mode "
                      "(set hpu_mode = \"eager\", \"lazy\" or \"compile\" to say so)")
        elif mode == "graph" and not _trace_mode_runs(self.stack):
            self.error("hpu_mode", (
                f"hpu_mode = \"graph\" (torch.jit.trace: the graph mode of Habana's 0.13 "
                f"software, as seed 004 ran it) does not run on {self.stack.label}: no Intel "
                "Gaudi software still published has it (Model-References' ResNet trains in "
                "eager and lazy mode only from 1.6.1, the oldest published, on; Intel documents "
                "eager, lazy and torch.compile); use hpu_mode = \"lazy\", Habana's graph mode "
                "since it replaced tracing"))
        elif mode == "compile":
            missing = self._torch_lacks("compile")
            if missing:
                self.error("hpu_mode", f"hpu_mode = \"compile\" on hardware {self.hw!r}: "
                                       f"{missing} ({self.stack.label})")


# --- the machine: the torch a cell runs against the GPU it gets --------------------------------


def _gpu_checks(found: Findings, file: str, places: _Places, matrix: Matrix,
                on: BackendRecord | None, machine: gpus.HostFacts | None,
                anywhere: bool = False) -> None:
    """:class:`~orchestrator.backends.gpu_checks.GpuCheck` for every profile's cells (one
    group per pinned release); this machine's GPUs are probed once, only when asked (a backend
    whose cells run here, a profile whose cells compute on this machine's GPUs).
    ``anywhere``: ``machine`` is the declared target the cells run on, whatever the backend."""
    if on is None:
        return
    profiles: dict[str, dict[str | None, list[Cell]]] = {}
    for cell in matrix.checked_cells:
        profiles.setdefault(cell.hardware, {}).setdefault(cell.params.ngc_release, []).append(cell)
    for hw, groups in sorted(profiles.items()):
        profile = matrix.profiles[hw]
        local = (on.here or anywhere) and holds_local_gpus(profile)
        facts = (machine or gpus.local_facts()) if local else None
        cells = [c for group in groups.values() for c in group]
        found_gpus = gpu_checks.GpuCheck(found, file, hw, profile, found.stacks[hw], cells,
                                         on.name, facts).targets()
        if found_gpus is None:
            continue
        described = gpu_checks.describe(found_gpus, facts)
        if described:
            found.gpus[hw] = described
        for release, group in sorted(groups.items(), key=lambda kv: kv[0] or ""):
            if release is not None:
                fields = tuple(places.of("ngc_release", release))
            elif "base_tag" in profile.image_vars:
                fields = (f"hardware.{hw}.image_vars.base_tag",)
            else:
                fields = (f"hardware.{hw}.image",)
            gpu_checks.GpuCheck(found, file, hw, profile, found.stack_of(group[0]), group,
                                on.name, facts, fields).software(*found_gpus)


#: Intel Gaudi (SynapseAI) software versions whose PyTorch trains a torch.jit.trace'd model (the
#: "graph mode" of Habana's 0.13 ResNet demo, seed 004): 0.13 and older, none of them published
#: any more (vault.habana.ai and docs.habana.ai start at 1.6.1 as far as this project can see).
TRACE_MODE_GAUDI: frozenset[str] = frozenset()
_GAUDI_VERSION = re.compile(r"Habana PyTorch installer (\S+)|Intel Gaudi (\S+)")


def _trace_mode_runs(stack: PlannedStack) -> bool:
    """Whether a Gaudi stack runs torch.jit.trace graph mode (its software version listed in
    :data:`TRACE_MODE_GAUDI`)."""
    found = _GAUDI_VERSION.search(stack.label)
    version = (found[1] or found[2]) if found else None
    return version is not None and version in TRACE_MODE_GAUDI


# --- programs: our workload and command templates ---------------------------------------------

#: Parameters that reach every program without a placeholder: where it runs, how many GPUs,
#: which program, the wrapping profiler.
_ALWAYS_USED = ORCHESTRATOR_PARAMS | {"profiler"}


def _program_checks(found: Findings, file: str, matrix: Matrix, configs: list[Cell]) -> None:
    """Figures parsers against programs; parameters a command never sees."""
    by_program: dict[str, list[Cell]] = {}
    for cell in configs:
        program = matrix.program(cell)
        by_program.setdefault(program.name, []).append(cell)
        if program.command is None and program.parser != "workload":
            profile = matrix.profiles[cell.hardware]
            where = (f"hardware.{cell.hardware}.figures.parser" if profile.figures is not None
                     else "figures.parser")
            found.error(Problem(file, where, (
                f"our workload's cells (hardware {cell.hardware!r}) print JSON lines, which "
                f"parser {program.parser!r} does not read: set parser = \"workload\" here, or "
                "give the other program's figures in its [commands.NAME.figures]")))
    for name, cells in by_program.items():
        command = matrix.commands.get(name)
        if command is None:
            continue
        if matrix.program(cells[0]).parser == "workload":
            found.note(Problem(file, f"commands.{name}", (
                f"no figures declared for program {name!r}: its output is read as our "
                "workload's JSON lines (give [commands." + name + ".figures] parser = "
                "\"dllogger\" or \"regex\" for other programs)")))
        used = command.params_used() | _ALWAYS_USED
        figures = matrix.program(cells[0]).figures
        if figures is not None and figures.parser == "dllogger" and figures.warmup is None:
            used.add("warmup")  # the parser drops the cell's warmup iterations
        dumps = [c.params.model_dump() for c in cells]
        for key in PARAM_NAMES:
            if key in used or len({json.dumps(d[key]) for d in dumps}) < 2:
                continue
            found.warning(Problem(file, f"commands.{name}.command", (
                f"{key} varies among the cells of program {name!r}, but its command never "
                f"uses it ({{{key}}} or a placeholder mapping it): those cells run the same "
                "command")))


def _node_checks(found: Findings, file: str, places: _Places, configs: list[Cell],
                 on: BackendRecord | None) -> None:
    """``nodes > 1`` only where a backend runs a cell over several nodes of its choosing (its
    record's ``multi_node``)."""
    if on is None or on.multi_node == "nodes":
        return
    backend = on.name
    for nodes in sorted({c.params.nodes for c in configs if c.params.nodes > 1}):
        for where in places.of("nodes", nodes):
            found.error(Problem(file, where, (
                f"nodes = {nodes}: the {backend} backend runs a cell on one machine; a cell "
                "spans several nodes on the slurm backend (the ssh backend spans hosts with "
                "[hardware.NAME] multi_node = true and more GPUs than one host has)")))


# --- the matrix: its baseline ------------------------------------------------------------------


def _baseline_checks(found: Findings, file: str, matrix: Matrix) -> None:
    text = matrix.settings.baseline or ""
    key, _, value = (part.strip() for part in text.partition("="))
    where = "matrix.baseline"
    if key not in PARAM_NAMES:
        found.error(Problem(file, where, (
            f"{key!r} is not a cell parameter{_did_you_mean(key, PARAM_NAMES)} (known: "
            f"{', '.join(PARAM_NAMES)})")))
        return
    try:
        TypeAdapter(param_type(key)).validate_strings(value)
    except ValidationError as exc:
        message = exc.errors(include_url=False)[0]["msg"]
        found.error(Problem(file, where, f"{value!r} is not a value of {key}: {message}"))
        return
    configs = _configurations(matrix.cells)
    dumps = {c.group: c.params.model_dump() for c in configs}
    base = [c for c in configs if param_matches(dumps[c.group][key], value)]
    if not base:
        have = sorted({_shown(dumps[c.group][key]) for c in configs})
        found.error(Problem(file, where, (
            f"no cell has {key} = {value} (the cells have {key} {', '.join(have)}): no row "
            "would get a ratio")))
        return

    def others(cell: Cell) -> str:
        return json.dumps({k: v for k, v in dumps[cell.group].items() if k != key},
                          sort_keys=True)

    index = {others(c): c for c in base}
    pairs = [(c, index[others(c)]) for c in configs
             if c not in base and others(c) in index]
    if not pairs:
        found.error(Problem(file, where, (
            f"no cell has a {key} = {value} row to compare with: every cell with another {key} "
            "also differs in other parameters, so no row would get a ratio")))
        return
    if key == selection.RELEASE_PARAM:
        found.note(Problem(file, where, (
            f"compares NGC releases on the same hardware (each row against ngc_release = "
            f"{value}): the stacks differ by design, and the table labels those ratios as the "
            "release comparison")))
        return
    _stack_pairs(found, file, where, pairs)


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _stack_pairs(
    found: Findings, file: str, where: str, pairs: list[tuple[Cell, Cell]]
) -> None:
    """A warning for every pair of profiles a baseline compares whose planned stacks differ."""
    seen: set[tuple[str, str]] = set()
    for cell, ref in pairs:
        names = (cell.hardware, ref.hardware)
        if names[0] == names[1] or names in seen:
            continue
        seen.add(names)
        mine, theirs = found.stack_of(cell), found.stack_of(ref)
        if not (mine.known and theirs.known):
            found.note(Problem(file, where, (
                f"whether hardware {names[0]!r} and {names[1]!r} run the same software stack is "
                "not checked (one of them is not known)")))
        elif mine.identity != theirs.identity:
            found.warning(Problem(file, where, (
                f"compares hardware {names[0]!r} ({mine.label}) with {names[1]!r} "
                f"({theirs.label}): different software stacks, so the ratio mixes software with "
                "hardware; build both on one base (the same image_vars base_tag)")))
