"""Matrix expansion: a validated matrix file becomes frozen :class:`Cell` values.

The rules, in order:

1. Every cell starts from :class:`~orchestrator.config.matrix_file.CellParams` defaults, overlaid by
   ``[workload]``.
2. ``[axes]`` (in file order) and each ``[[zip]]`` group (values taken together, index by index)
   are the dimensions; the cells are their cartesian product.
3. ``[[exclude]]`` drops every product cell that matches all of a rule's keys (a list in a rule
   matches any of its values). A rule that matches nothing is an error: it is almost always a typo.
4. ``[[include]]`` adds one cell per entry (``[workload]`` defaults for what it leaves out);
   a duplicate of an existing cell is dropped.
5. ``repeats`` copies every cell; repeat *k* of all cells runs before repeat *k+1* of any, so slow
   drift of a machine (thermals, a noisy neighbour) spreads over the whole matrix, not one cell.

Ids are stable and readable (``v100-g4-bs256-amp-r1``): hardware, then the parameters that vary in
the matrix, then the repeat. The content hash covers the parameters and the hardware profile. An id
longer than :data:`MAX_ID_LENGTH` (a long varying ``data`` path) is cut and ends with its hash, so
it is always a valid folder name.

Size: the axes and zips may multiply to at most
:data:`~orchestrator.config.matrix_file.MAX_COMBINATIONS` combinations and the matrix may plan at
most
:data:`~orchestrator.config.matrix_file.MAX_CELLS` cells; both are checked from the list lengths
before any
cell is built, and the message names the fields that multiply up.

Validation reports every problem of the file at once (types, unknown keys and profiles, image
templates and their variables, rules that match nothing). Whether each cell can run where it is
planned (its model, options, profiler and image on its stack) is
:mod:`orchestrator.backends.checks`' question. This module knows nothing of backends:
``[matrix] backend`` is checked against the names the caller passes to :func:`load_matrix`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator.catalog import templates
from orchestrator.config.figures import FiguresConfig
from orchestrator.config.matrix_file import (
    MAX_CELLS,
    MAX_COMBINATIONS,
    PARAM_NAMES,
    WORKLOAD_PROGRAM,
    CellParams,
    CommandRenderError,
    CommandTemplate,
    HardwareProfile,
    MatrixFile,
    MatrixSettings,
    Program,
    command_values,
    hardware_reference_problems,
    nodes_problem,
    param_type,
    parse_matrix_file,
    parse_overrides,
    program_of,
)
from orchestrator.config.overrides import Override, attribute
from orchestrator.config.syntax import name_problem
from orchestrator.errors import ConfigError, Problem

#: Longest cell group id (the cell id adds ``-rN``; a folder name may have 255 bytes).
MAX_ID_LENGTH = 150


#: A cell's role: a configuration (what the matrix measures) or a control measurement (the
#: pinned reference run between them, :mod:`orchestrator.plan.controls`).
CONFIG = "config"
CONTROL = "control"


@dataclass(frozen=True)
class Cell:
    """One container launch: a full parameter assignment and one repeat of it.

    A control cell (``role == "control"``) is one measurement of the matrix's control; its
    ``repeat`` is its sequence number in the run (0 for the template the plan lists)."""

    id: str
    group: str
    repeat: int
    params: CellParams
    hash: str
    role: str = CONFIG

    @property
    def hardware(self) -> str:
        return self.params.hardware

    @property
    def is_control(self) -> bool:
        return self.role == CONTROL

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "group": self.group,
            "repeat": self.repeat,
            "hash": self.hash,
            "role": self.role,
            "params": self.params.model_dump(),
        }

    def measurement(self, number: int) -> Cell:
        """Control measurement ``number`` (1, 2, ...) of this control template."""
        return Cell(f"{self.group}-c{number}", self.group, number, self.params, self.hash,
                    CONTROL)


@dataclass(frozen=True)
class Matrix:
    """A loaded, validated and expanded matrix."""

    name: str
    path: Path
    settings: MatrixSettings
    profiles: dict[str, HardwareProfile]
    cells: tuple[Cell, ...]
    varying: tuple[str, ...]
    source_text: str = field(repr=False, default="")
    #: ``[commands.NAME]``: the programs cells may run besides our workload.
    commands: dict[str, CommandTemplate] = field(default_factory=dict)
    #: ``[figures]``: how cells' figures are read unless a command or profile says otherwise.
    figures: FiguresConfig | None = None
    #: ``source_text`` as parsed: where the checks find the field that sets a value.
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    #: ``[control]``: one control template cell per hardware profile (hardware -> cell), and
    #: how often it runs (a measurement after every ``control_every`` cells on a host/GPU set).
    controls: dict[str, Cell] = field(default_factory=dict)
    control_every: int = 0
    #: The ``--only`` filters that selected ``cells`` (empty: every cell of the matrix).
    selection: tuple[str, ...] = ()
    #: The ``--exclude`` filters that took cells out of ``cells``.
    excluded: tuple[str, ...] = ()
    #: The ``--set KEY=VALUE`` overrides applied to the file (:mod:`orchestrator.config.overrides`;
    #: recorded as each one's ``shown``, secrets masked).
    overrides: tuple[Override, ...] = ()

    def profile(self, cell: Cell) -> HardwareProfile:
        return self.profiles[cell.hardware]

    def program(self, cell: Cell) -> Program:
        """What ``cell`` runs (our workload or a command template) and how its figures are
        read (:func:`orchestrator.config.matrix_file.program_of`)."""
        return program_of(cell.params, self.profile(cell), self.commands, self.figures)

    def with_cells(self, cells: Iterable[Cell]) -> Matrix:
        return dataclasses.replace(self, cells=tuple(cells))

    @property
    def command_line(self) -> tuple[str, ...]:
        """The options that made this matrix from its file: ``--set``, ``--only`` and
        ``--exclude``, each with its value, as the report's line shows them."""
        return tuple(f"{option} {value}" for option, values in (
            ("--set", [o.shown for o in self.overrides]), ("--only", self.selection),
            ("--exclude", self.excluded)) for value in values)

    def attributed(self, problems: Sequence[Problem]) -> list[Problem]:
        """``problems`` found in this matrix, each that an override may have caused saying
        ``(from --set KEY=VALUE)`` (:func:`orchestrator.config.overrides.attribute`)."""
        return attribute(problems, self.overrides)

    def control_for(self, cell: Cell) -> Cell | None:
        """The control template that calibrates ``cell`` (None: the matrix has no control)."""
        return self.controls.get(cell.hardware)

    @property
    def checked_cells(self) -> tuple[Cell, ...]:
        """The configurations and the control templates: every cell the checks must pass."""
        return self.cells + tuple(self.controls.values())


# --- expansion -------------------------------------------------------------------------------


def _set_keys(model: Any) -> dict[str, Any]:
    """The keys a partial model (axes, zip, include, exclude) actually sets, in file order."""
    return {k: getattr(model, k) for k in model.model_fields_set if getattr(model, k) is not None}


def _ordered(keys: dict[str, Any], raw: dict[str, Any] | None) -> dict[str, Any]:
    order = list(raw) if isinstance(raw, dict) else []
    return dict(sorted(keys.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 999))


def _dimensions(
    mf: MatrixFile, raw: dict[str, Any], file: str
) -> tuple[list[list[dict[str, Any]]], list[Problem]]:
    problems: list[Problem] = []
    dims: list[list[dict[str, Any]]] = []
    axes = _ordered(_set_keys(mf.axes), raw.get("axes"))
    for key, values in axes.items():
        dims.append([{key: v} for v in values])
    seen = set(axes)
    raw_zips: list[Any] = raw["zip"] if isinstance(raw.get("zip"), list) else []
    for i, group in enumerate(mf.zip):
        raw_group = raw_zips[i] if i < len(raw_zips) else None
        values = _ordered(_set_keys(group), raw_group)
        if not values:
            problems.append(Problem(file, f"zip[{i}]", "empty: give at least one parameter"))
            continue
        lengths = {k: len(v) for k, v in values.items()}
        if len(set(lengths.values())) > 1:
            problems.append(Problem(
                file, f"zip[{i}]", f"lists must have the same length, got {lengths}"
            ))
            continue
        for key in values:
            if key in seen:
                problems.append(Problem(
                    file, f"zip[{i}].{key}",
                    "already varied by [axes] or another zip; a parameter belongs to one of them",
                ))
        seen.update(values)
        n = next(iter(lengths.values()))
        dims.append([{k: v[j] for k, v in values.items()} for j in range(n)])
    return dims, problems


def _matches(rule: dict[str, Any], assignment: dict[str, Any]) -> bool:
    for key, wanted in rule.items():
        value = assignment.get(key)
        if isinstance(wanted, list) and not isinstance(value, list):
            if value not in wanted:
                return False
        elif value != wanted:
            return False
    return True


def expand_assignments(
    mf: MatrixFile, raw: dict[str, Any], file: str
) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Expand axes/zip/exclude/include into full parameter assignments (no repeats yet)."""
    defaults = {
        name: info.default for name, info in CellParams.model_fields.items()
        if not info.is_required()
    }
    defaults.update(_set_keys(mf.workload))
    dims, problems = _dimensions(mf, raw, file)

    rules = [_set_keys(rule) for rule in mf.exclude]
    used = [False] * len(rules)
    out: list[dict[str, Any]] = []
    for combo in itertools.product(*dims):
        assignment = dict(defaults)
        for part in combo:
            assignment.update(part)
        hit = [i for i, rule in enumerate(rules) if rule and _matches(rule, assignment)]
        for i in hit:
            used[i] = True
        if not hit:
            out.append(assignment)
    for i, rule in enumerate(rules):
        if not rule:
            problems.append(Problem(file, f"exclude[{i}]", "empty rule: it would drop every cell"))
        elif not used[i]:
            problems.append(Problem(
                file, f"exclude[{i}]",
                f"matches no cell ({_fmt(rule)}); check the values against [axes]",
            ))
    for entry in mf.include:
        out.append({**defaults, **_set_keys(entry)})

    unique: dict[str, dict[str, Any]] = {}
    for assignment in out:
        unique.setdefault(json.dumps(assignment, sort_keys=True), assignment)
    return list(unique.values()), problems


def _fmt(rule: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in rule.items())


def _factors(mf: MatrixFile, raw: dict[str, Any]) -> list[tuple[str, int]]:
    """(field, number of values) of every dimension: the axes, then each zip group."""
    factors = [(f"axes.{k}", len(v)) for k, v in _ordered(_set_keys(mf.axes), raw.get("axes"))
               .items()]
    for i, group in enumerate(mf.zip):
        lengths = {len(v) for v in _set_keys(group).values()}
        if len(lengths) == 1:  # different lengths are reported by the expansion
            factors.append((f"zip[{i}]", lengths.pop()))
    return factors


def _product(factors: list[tuple[str, int]], extra: str = "") -> str:
    parts = [f"{field} ({n} values)" for field, n in factors if n > 1]
    return " x ".join(parts + ([extra] if extra else [])) or "the defaults"


def size_problems(mf: MatrixFile, raw: dict[str, Any], file: str) -> list[Problem]:
    """A problem if the axes multiply past :data:`MAX_COMBINATIONS`, or if even the upper bound
    of the cells is past :data:`MAX_CELLS` without any [[exclude]] to bring it down. Needs only
    the list lengths: refused before anything is expanded."""
    factors = _factors(mf, raw)
    combinations = math.prod(n for _, n in factors)
    if combinations > MAX_COMBINATIONS:
        return [Problem(file, "axes", (
            f"{_product(factors)} multiply up to {combinations:,} combinations, more than the "
            f"{MAX_COMBINATIONS:,} a matrix may have: split it into several matrix files"
        ))]
    repeats = mf.matrix.repeats
    cells = (combinations + len(mf.include)) * repeats
    if cells > MAX_CELLS and not mf.exclude:
        return [_too_many_cells(file, factors, len(mf.include), repeats, cells)]
    return []


def _too_many_cells(
    file: str, factors: list[tuple[str, int]], includes: int, repeats: int, cells: int
) -> Problem:
    extra = f"matrix.repeats ({repeats})" if repeats > 1 else ""
    plus = f" (+ {includes} include)" if includes else ""
    return Problem(file, "axes", (
        f"{_product(factors, extra)}{plus} plan {cells:,} cells, more than the {MAX_CELLS:,} "
        "one run may have: split the matrix into several files or lower matrix.repeats"
    ))


# --- ids and hashes --------------------------------------------------------------------------

_ABBREV = {
    "image_size": "px", "warmup": "w", "iterations": "it", "num_classes": "nc", "workers": "wk",
    "seed": "seed", "ngc_release": "ngc", "nodes": "n",
}


def _slug(value: Any) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", str(value).lower()).strip("_") or "x"


def _id_parts(params: dict[str, Any], varying: Sequence[str], program: str = WORKLOAD_PROGRAM
              ) -> list[str]:
    parts = [_slug(params["hardware"])]
    if "program" in varying:  # the program's name says what it is: h100-dle-g1-...
        parts.append(_slug(program))
    for key in ("arch", "mode"):
        if key in varying:
            parts.append(_slug(params[key]))
    parts += [f"g{params['gpus']}", f"bs{params['batch_size']}", params["precision"]]
    for key in PARAM_NAMES:
        if key not in varying or key in ("hardware", "program", "arch", "mode", "gpus",
                                         "batch_size", "precision"):
            continue
        value = params[key]
        if key == "hpu_mode":  # eager / lazy / compile say what they are
            parts.append(_slug(value))
        elif isinstance(value, bool):
            parts.append(key.replace("_", "") if value else f"no{key.replace('_', '')}")
        elif key in _ABBREV:
            parts.append(f"{_ABBREV[key]}{value}")
        else:
            parts.append(f"{key.replace('_', '')}-{_slug(value)}")
    return parts


#: The hash stays the same across versions of orchestrate for a cell that does not use what a
#: version added (``--resume`` of an older run; its history lines up): a field added after cells
#: were first hashed is left out of the hash while it has its neutral value (the behaviour from
#: before it existed), and a retired field keeps the value it always had there.
HASH_NEUTRAL_PARAMS: dict[str, Any] = {
    "hpu_mode": None, "profile_start": 0, "profile_iterations": 5, "telemetry_interval": 0.5,
    "program": None, "ngc_release": None, "nodes": 1,
}
HASH_NEUTRAL_PROFILE: dict[str, Any] = {
    "gpu": None, "compute_capability": None, "program": None, "figures": None,
    "release": None, "forward_compat": False, "runtime": None,
    **{tool: HardwareProfile.model_fields[tool].get_default(call_default_factory=True)
       for tool in ("nsys", "ncu", "nvprof", "apptainer")},
}
HASH_RETIRED_PROFILE: dict[str, Any] = {"backend": None}
#: Fields added to a profile's sub-tables (its Slurm options, its container options) after
#: cells were first hashed, as HASH_NEUTRAL_PROFILE: a cell that does not use them keeps its hash.
HASH_NEUTRAL_PROFILE_TABLES: dict[str, dict[str, Any]] = {
    "slurm": {"conf": None, "arrays": True, "array_limit": None},
    "container": {"pid": None},
}
#: The same for the fields a version added inside a figures table.
HASH_NEUTRAL_FIGURES: dict[str, Any] = {"variant": None, "file": None, "telemetry": None}


def _hashed(dump: dict[str, Any], neutral: dict[str, Any]) -> dict[str, Any]:
    def plain(value: Any) -> Any:
        return value.model_dump() if hasattr(value, "model_dump") else value

    return {k: v for k, v in dump.items() if not (k in neutral and v == plain(neutral[k]))}


def content_hash(params: CellParams, profile: HardwareProfile, program: Program | None = None
                 ) -> str:
    """A short hash of everything that defines a cell's run (not its repeat): its parameters,
    its hardware profile and, where it is not our workload's default, its ``program`` (the
    command template it runs, the figures parser that reads it)."""
    return _hash(params, profile_content(profile), program_content(program), program)


def profile_content(profile: HardwareProfile) -> str:
    """What :func:`content_hash` covers of a profile, as JSON text (the same for every cell of
    the profile: a matrix makes it once per profile)."""
    profile_dump = profile.model_dump()
    for table, neutral in HASH_NEUTRAL_PROFILE_TABLES.items():
        profile_dump[table] = _hashed(profile_dump[table], neutral)
    if isinstance(profile_dump.get("figures"), dict):
        profile_dump["figures"] = _hashed(profile_dump["figures"], HASH_NEUTRAL_FIGURES)
    return json.dumps({**_hashed(profile_dump, HASH_NEUTRAL_PROFILE), **HASH_RETIRED_PROFILE},
                      sort_keys=True)


def program_content(program: Program | None) -> dict[str, str]:
    """What :func:`content_hash` covers of a program where it is not our workload's default
    (its command template, its figures parser), each part as JSON text, by key."""
    parts: dict[str, str] = {}
    if program is not None and program.command is not None:
        command = program.command.model_dump()
        command.pop("requires", None)  # what the cell needs beforehand, not what it runs
        if isinstance(command.get("figures"), dict):
            command["figures"] = _hashed(command["figures"], HASH_NEUTRAL_FIGURES)
        parts["command"] = json.dumps({"name": program.name, **command}, sort_keys=True)
    if program is not None and program.figures is not None:
        parts["figures"] = json.dumps(_hashed(program.figures.model_dump(), HASH_NEUTRAL_FIGURES),
                                      sort_keys=True)
    return parts


def _hash(params: CellParams, profile: str, program: dict[str, str],
          program_of_cell: Program | None) -> str:
    """:func:`content_hash` from the parts made once per profile and program: the JSON text of
    ``{"command": ..., "figures": ..., "params": ..., "profile": ...}`` with sorted keys, as
    ``json.dumps(content, sort_keys=True)`` writes it (a nested value is written the same
    alone as inside)."""
    dump = params.model_dump()
    if program_of_cell is not None and program_of_cell.command is None:
        dump["program"] = None  # our workload, however it was named: as before programs
    parts = {**program, "params": json.dumps(_hashed(dump, HASH_NEUTRAL_PARAMS), sort_keys=True),
             "profile": profile}
    blob = "{" + ", ".join(f"{json.dumps(key)}: {parts[key]}" for key in sorted(parts)) + "}"
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _short(group: str, digest: str) -> str:
    """``group``, or its first characters and the hash when it is longer than MAX_ID_LENGTH."""
    if len(group) <= MAX_ID_LENGTH:
        return group
    return f"{group[:MAX_ID_LENGTH - 13].rstrip('-_.')}-{digest}"


def _varies(values: list[Any]) -> bool:
    """Whether ``values`` hold two that differ as JSON says (``1`` is neither ``1.0`` nor
    ``true``); decided at the first difference."""
    first = values[0] if values else None
    kind = type(first)
    if kind in (str, int, float, bool, type(None)):
        return any(type(v) is not kind or v != first for v in values)
    return len({json.dumps(v) for v in values}) > 1


def make_cells(
    assignments: list[CellParams], profiles: dict[str, HardwareProfile], repeats: int,
    commands: dict[str, CommandTemplate] | None = None, figures: FiguresConfig | None = None,
) -> tuple[list[Cell], tuple[str, ...]]:
    """Give every assignment a stable id and hash, then copy it ``repeats`` times."""
    dumped = [a.model_dump() for a in assignments]
    varying = tuple(k for k in PARAM_NAMES if _varies([d[k] for d in dumped]))
    groups: list[tuple[str, CellParams, str]] = []
    seen: dict[str, int] = {}
    profile_parts = {name: profile_content(profile) for name, profile in profiles.items()
                     if any(a.hardware == name for a in assignments)}
    program_parts: dict[str, dict[str, str]] = {}  # by program name and profile
    for params, d in zip(assignments, dumped, strict=True):
        profile = profiles[params.hardware]
        program = program_of(params, profile, commands or {}, figures)
        key = f"{program.name}\0{params.hardware}"
        if key not in program_parts:
            program_parts[key] = program_content(program)
        digest = _hash(params, profile_parts[params.hardware], program_parts[key], program)
        group = "-".join(_id_parts(d, varying, program.name))
        seen[group] = seen.get(group, 0) + 1
        groups.append((group, params, digest))
    groups = [(_short(g if seen[g] == 1 else f"{g}-{h[:6]}", h), p, h) for g, p, h in groups]
    cells = [
        Cell(id=f"{g}-r{r}", group=g, repeat=r, params=p, hash=h)
        for r in range(1, repeats + 1)
        for g, p, h in groups
    ]
    return cells, varying


# --- semantic checks -------------------------------------------------------------------------


def _check_backend(mf: MatrixFile, file: str, backends: Collection[str] | None) -> list[Problem]:
    """``[matrix] backend`` against the backend names the caller knows (None: not checked)."""
    if backends is None or mf.matrix.backend in backends:
        return []
    return [Problem(file, "matrix.backend",
                    f"unknown backend {mf.matrix.backend!r}; known: {', '.join(backends)}")]


def _check_profiles(mf: MatrixFile, file: str) -> list[Problem]:
    problems = []
    for name, profile in mf.hardware.items():
        if profile.image is not None:
            problems += _check_image(file, f"hardware.{name}", profile)
    return problems


def _check_image(file: str, where: str, profile: HardwareProfile) -> list[Problem]:
    names = templates.template_names()
    if profile.image is None or profile.image not in names:
        return [Problem(
            file, f"{where}.image",
            f"unknown image template {profile.image!r}; known: {', '.join(names)}",
        )]
    return [
        Problem(file, f"{where}.image_vars", message)
        for message in templates.check_vars(profile.image, profile.image_vars)
    ]


def _check_commands(mf: MatrixFile, file: str) -> list[Problem]:
    """Every ``[commands.NAME]`` template's names: placeholders, their parameters and values."""
    problems = []
    for name, command in mf.commands.items():
        where = f"commands.{name}"
        if name == WORKLOAD_PROGRAM:
            problems.append(Problem(file, where, f"{WORKLOAD_PROGRAM!r} is our own workload's "
                                                 "program name: name the command otherwise"))
        problems += [Problem(file, f"{where}.{field}", message)
                     for field, message in command.problems()]
    return problems


def _check_program_names(mf: MatrixFile, file: str) -> list[Problem]:
    """Every ``program`` value (cells and profiles) names the workload or a command."""
    known = [WORKLOAD_PROGRAM, *mf.commands]
    places: list[tuple[str, Any]] = [("workload.program", _set_keys(mf.workload).get("program"))]
    places += [(f"axes.program[{i}]", v)
               for i, v in enumerate(_set_keys(mf.axes).get("program") or [])]
    for z, group in enumerate(mf.zip):
        places += [(f"zip[{z}].program[{i}]", v)
                   for i, v in enumerate(_set_keys(group).get("program") or [])]
    places += [(f"include[{i}].program", _set_keys(e).get("program"))
               for i, e in enumerate(mf.include)]
    places += [(f"hardware.{hw}.program", p.program) for hw, p in mf.hardware.items()]
    if mf.control is not None and mf.control.params is not None:
        places.append(("control.params.program", _set_keys(mf.control.params).get("program")))
    problems = []
    for where, value in places:
        if value is None or value in known:
            continue
        close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.append(Problem(file, where, (
            f"unknown program {value!r}; {hint}a program is {WORKLOAD_PROGRAM!r} (our workload) "
            f"or a [commands.NAME] table ({', '.join(mf.commands) or 'none defined'})")))
    return problems


def _check_rendering(cells: Sequence[Cell], mf: MatrixFile, file: str) -> list[Problem]:
    """Every configuration that runs a command renders: each value it takes has an entry in
    the placeholders that map it, none is read as an option, a self-launching command is not
    asked for several nodes. One problem per field and message (the first cell named)."""
    found: dict[tuple[str, str], str] = {}
    for cell in {c.group: c for c in cells}.values():
        profile = mf.hardware[cell.hardware]
        program = program_of(cell.params, profile, mf.commands, mf.figures)
        command = program.command
        if command is None:
            continue
        where = f"commands.{program.name}"
        if command.launcher == "self" and profile.multi_node:
            found.setdefault((f"{where}.launcher", (
                f"'self' starts the program once, on one host; hardware {cell.hardware!r} may "
                "span several (multi_node = true): use launcher = \"torchrun\" or set "
                "multi_node = false")), cell.group)
        values = command_values(cell.params, program.name, python="python",
                                output_dir="/out", cell_id=cell.id)
        try:
            command.render(values)
        except CommandRenderError as exc:
            for field_, message in exc.problems:
                found.setdefault((f"{where}.{field_}", message), cell.group)
    return [Problem(file, field_, f"{message} (cell {group})")
            for (field_, message), group in found.items()]


def _check_hardware_values(
    mf: MatrixFile, raw: dict[str, Any], file: str, assignments: list[dict[str, Any]]
) -> list[Problem]:
    problems = hardware_reference_problems(raw, file)
    if "hardware" not in _set_keys(mf.workload):
        for i, entry in enumerate(mf.include):
            if "hardware" not in _set_keys(entry):
                problems.append(Problem(
                    file, f"include[{i}]",
                    "no hardware: give it here (an include takes [workload] defaults for what "
                    "it leaves out, not [axes] values)",
                ))
        varied = any("hardware" in _set_keys(part) for part in (mf.axes, *mf.zip))
        if not varied and any("hardware" not in a for a in assignments):
            problems.append(Problem(
                file, "workload.hardware",
                "no cell has hardware: set [workload] hardware or an [axes] hardware list",
            ))
    return problems


def _check_nodes(assignments: list[dict[str, Any]], file: str) -> list[Problem]:
    """Every cell's GPUs split evenly over its nodes (one problem per gpus/nodes pair)."""
    pairs = sorted({(a.get("gpus", 1), a.get("nodes", 1)) for a in assignments
                    if isinstance(a.get("gpus", 1), int) and isinstance(a.get("nodes", 1), int)})
    return [Problem(file, "nodes", problem) for gpus, nodes in pairs
            for problem in [nodes_problem(gpus, nodes)] if problem]


# --- entry points ----------------------------------------------------------------------------


def load_matrix(path: str | Path, *, backends: Collection[str] | None = None,
                overrides: Sequence[str] = ()) -> Matrix:
    """Load, validate and expand a matrix file. Raises :class:`ConfigError` with every problem.

    ``backends``: the backend names ``[matrix] backend`` may take (the CLI passes the registry's,
    :func:`orchestrator.backends.backend_names`); None leaves the name to whoever picks the
    backend (:func:`orchestrator.sweep.run_sweep`). ``overrides``: ``--set KEY=VALUE`` texts,
    applied to the file before it is validated (:mod:`orchestrator.config.overrides`); every
    problem they cause says so.
    """
    path = Path(path)
    found = parse_overrides(overrides)
    try:
        matrix = _load(path, backends, found)
    except ConfigError as exc:
        if not found:
            raise
        raise ConfigError(attribute(exc.problems, found)) from None
    return dataclasses.replace(matrix, overrides=tuple(found))


def _load(path: Path, backends: Collection[str] | None, overrides: Sequence[Override]
          ) -> Matrix:
    file = str(path)
    mf, raw, text = parse_matrix_file(path, overrides)
    problems = _check_backend(mf, file, backends)
    problems += _check_profiles(mf, file)
    problems += _check_commands(mf, file)
    problems += _check_program_names(mf, file)
    name = mf.matrix.name or path.stem
    if mf.matrix.name is None and name_problem(name):
        problems.append(Problem(file, "matrix.name", (
            f"the file name gives the matrix name {name!r}, which cannot be a folder name under "
            "results/; set [matrix] name (letters, digits, '_', '.', '-')"
        )))
    too_big = size_problems(mf, raw, file)
    if too_big:  # nothing is expanded: that alone could take minutes and gigabytes
        raise ConfigError(problems + too_big)
    assignments, expand_problems = expand_assignments(mf, raw, file)
    problems += expand_problems
    problems += _check_hardware_values(mf, raw, file, assignments)
    if not assignments and not expand_problems:
        problems.append(Problem(file, "axes", "the matrix expands to no cell"))
    cells_planned = len(assignments) * mf.matrix.repeats
    if cells_planned > MAX_CELLS:
        problems.append(_too_many_cells(
            file, _factors(mf, raw), len(mf.include), mf.matrix.repeats, cells_planned
        ))
    problems += _check_nodes(assignments, file)
    if problems:
        raise ConfigError(problems)

    params = []
    for assignment in assignments:
        try:
            params.append(CellParams.model_validate(assignment))
        except ValidationError as exc:  # pragma: no cover - types were checked field by field
            raise ConfigError(f"invalid cell {assignment}: {exc}", file=file) from None
    cells, varying = make_cells(params, mf.hardware, mf.matrix.repeats, mf.commands, mf.figures)
    cells, controls, control_problems = make_controls(mf, file, cells)
    rendering = _check_rendering([*cells, *controls.values()], mf, file)
    if control_problems or rendering:
        raise ConfigError(control_problems + rendering)
    return Matrix(
        name=name,
        path=path,
        settings=mf.matrix,
        profiles=dict(mf.hardware),
        cells=tuple(cells),
        varying=varying,
        source_text=text,
        commands=dict(mf.commands),
        figures=mf.figures,
        raw=raw,
        controls=controls,
        control_every=mf.control.every if mf.control else 0,
    )


def make_controls(mf: MatrixFile, file: str, cells: list[Cell]
                  ) -> tuple[list[Cell], dict[str, Cell], list[Problem]]:
    """``[control]`` as one template cell per hardware profile of the configurations; returns
    the configurations (without a ``cell = GROUP`` control's cells), the templates and every
    problem (a control that names no cell, sets hardware, or needs more GPUs than a cell it
    calibrates has: it runs on those cells' GPUs)."""
    spec = mf.control
    if spec is None:
        return cells, {}, []
    problems: list[Problem] = []
    if spec.cell is not None:
        named = [c for c in cells if c.group == spec.cell]
        if not named:
            groups = sorted({c.group for c in cells})
            close = difflib.get_close_matches(spec.cell, groups, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            return cells, {}, [Problem(file, "control.cell", (
                f"no cell group {spec.cell!r} in this matrix; {hint}`orchestrate plan` lists "
                "the groups (the cell ids without -rN)"))]
        base = named[0].params.model_dump()
        cells = [c for c in cells if c.group != spec.cell]
        if not cells:
            return cells, {}, [Problem(file, "control.cell", (
                "the control is the only configuration: nothing would be left to calibrate"))]
        where = "control.cell"
    else:
        given = _set_keys(spec.params)
        if "hardware" in given:
            problems.append(Problem(file, "control.params.hardware", (
                "the control runs on the hardware, hosts and GPUs of each cell it calibrates: "
                "leave hardware out")))
        base = {name: info.default for name, info in CellParams.model_fields.items()
                if not info.is_required()}
        base.update(_set_keys(mf.workload))
        base.update({k: v for k, v in given.items() if k != "hardware"})
        where = "control.params"
    out: dict[str, Cell] = {}
    for hw in sorted({c.hardware for c in cells}):
        params = CellParams.model_validate({**base, "hardware": hw})
        fewest = min(c.params.gpus for c in cells if c.hardware == hw)
        if params.gpus > fewest:
            field_ = f"{where}.gpus" if where == "control.params" else where
            problems.append(Problem(file, field_, (
                f"the control needs {params.gpus} GPU(s) but hardware {hw!r} has cells with "
                f"{fewest}: it runs on the GPUs of the cells it calibrates; give it gpus <= "
                f"{fewest}")))
            continue
        profile = mf.hardware[hw]
        program = program_of(params, profile, mf.commands, mf.figures)  # names checked before
        group = f"control-{hw}"
        out[hw] = Cell(group, group, 0, params, content_hash(params, profile, program), CONTROL)
    return cells, out, problems


def parse_only(only: Sequence[str], option: str = "--only") -> dict[str, list[Any]]:
    """Parse ``--only KEY=VALUE`` filters (a key repeated means any of its values); ``option``:
    the option the texts came from (``--exclude`` has the same grammar)."""
    wanted: dict[str, list[Any]] = {}
    problems = []
    for item in only:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            problems.append(Problem(option, item, f"expected KEY=VALUE, e.g. {option} gpus=1"))
            continue
        if key == "repeat":
            value: Any = text
        elif key not in PARAM_NAMES:
            close = difflib.get_close_matches(key, ["repeat", *PARAM_NAMES], n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(Problem(
                option, key,
                f"unknown parameter; {hint}known: repeat, {', '.join(PARAM_NAMES)}"))
            continue
        else:
            try:
                value = TypeAdapter(param_type(key)).validate_strings(text.strip())
            except ValidationError as exc:
                msg = exc.errors(include_url=False)[0]["msg"]
                if "," in text:  # a list, as a shell user would write it
                    first, second = (v.strip() for v in text.split(",")[:2])
                    if "=" in second:  # several filters in one: hardware=cpu,batch_size=8
                        msg = (f"several filters in one: one KEY=VALUE per {option}, e.g. "
                               f"{option} {key}={first} {option} {second}")
                    else:
                        msg += (f" (several values: repeat {option}, e.g. {option} "
                                f"{key}={first} {option} {key}={second})")
                problems.append(Problem(option, item, msg))
                continue
        wanted.setdefault(key, []).append(value)
    if problems:
        raise ConfigError(problems)
    return wanted


def filter_cells(matrix: Matrix, only: Sequence[str], exclude: Sequence[str] = ()) -> Matrix:
    """Keep the cells matching every ``--only`` filter (a key repeated: any of its values), then
    drop those matching any ``--exclude`` filter (the same grammar; each one drops the cells
    with its value). An ``--exclude`` that matches no cell of the matrix is an error (almost
    always a typo, as an ``[[exclude]]`` rule that matches nothing), and so is a selection
    that keeps no cell."""
    if not only and not exclude:
        return matrix
    wanted = parse_only(only) if only else {}
    parse_only(exclude, "--exclude")  # every malformed one at once
    rules = [parse_only([item], "--exclude") for item in exclude]
    unused = [Problem("--exclude", item, f"matches no cell of {matrix.name}; `orchestrate "
                      "plan` lists the cells")
              for item, rule in zip(exclude, rules, strict=True)
              if not any(_matches_all(c, rule) for c in matrix.cells)]
    if unused:
        raise ConfigError(unused)
    cells = [c for c in matrix.cells if _matches_all(c, wanted)
             and not any(_matches_all(c, rule) for rule in rules)]
    if not cells:
        flags = " ".join([*(f"--only {o}" for o in only), *(f"--exclude {e}" for e in exclude)])
        verb = "matches" if not exclude else "leaves"
        raise ConfigError(f"{flags} {verb} no cell of {matrix.name}; `orchestrate plan` lists "
                          "the cells", file=str(matrix.path))
    return dataclasses.replace(matrix.with_cells(cells),
                               selection=matrix.selection + tuple(only),
                               excluded=matrix.excluded + tuple(exclude))


def _matches_all(cell: Cell, wanted: dict[str, list[Any]]) -> bool:
    """Whether ``cell`` has, for every key of ``wanted``, one of its values."""
    values = {**cell.params.model_dump(), "repeat": str(cell.repeat)}
    return all(str(values[k]) in map(str, vs) for k, vs in wanted.items())
