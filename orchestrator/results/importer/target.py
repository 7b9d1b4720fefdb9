"""The matrix an import joins, and the one group each imported cell matches. The one module of
the results that expands a matrix (:mod:`orchestrator.plan.matrix`).

One rule for ``--matrix NAME`` and ``--matrix FILE``: **a matrix file's configuration is used
whenever there is one** (so an import joins the configuration a sweep of that file runs, and
``history`` lines them up):

1. ``--matrix FILE.toml``: that file (with ``--set``'s overrides);
2. ``--matrix NAME``: the matrix file of that name under ``./matrices/`` (any depth: a file
   whose ``[matrix] name``, else whose file name, is NAME; :func:`matrix_file_named`), as 1;
3. no such file: the groups NAME's runs under the results folder planned (the newest run's
   definition of a group wins);
4. no runs either: a matrix written from the logs' parameters.

An import whose configuration the matrix's runs never planned (the file changed since they ran,
or they ran with ``--set``) is said in a warning: ``history`` shows it apart from them.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.config.files import parse_toml, read_config_text
from orchestrator.config.matrix_file import PARAM_NAMES, CellParams
from orchestrator.config.syntax import name_problem
from orchestrator.errors import ConfigError, Problem
from orchestrator.results.figures.figure_parsers import foreign_formats
from orchestrator.results.folders.run_folder import RunPaths, read_json, runs_of
from orchestrator.results.importer.common import ImportOptions, Target

log = logging.getLogger(__name__)


#: Where ``--matrix NAME`` looks for NAME's matrix file (relative: to the working folder).
MATRICES = Path("matrices")


def _target_from_matrix_file(path: Path, overrides: Sequence[str] = ()) -> Target:
    from orchestrator.plan.matrix import load_matrix

    matrix = load_matrix(path, overrides=overrides)
    groups = {c.group: {"params": c.params.model_dump(), "hash": c.hash} for c in matrix.cells}
    return Target(matrix.name, groups, list(matrix.varying), matrix.settings.baseline,
                  matrix.source_text, str(path), matrix.settings.table_rule,
                  [o.shown for o in matrix.overrides])


def matrix_file_named(name: str, folder: Path = MATRICES) -> Path | None:
    """The matrix file of matrix ``name`` under ``folder`` (any depth): a TOML file with a
    matrix's tables whose ``[matrix] name`` is ``name``, or, without a name, whose file name is
    ``name.toml``. None where there is none; a ConfigError naming them where several are."""
    if not folder.is_dir():
        return None
    found = []
    for path in sorted(folder.rglob("*.toml")):
        try:
            raw = parse_toml(read_config_text(path), str(path))
        except ConfigError:  # not ours to judge here: a file that is no matrix
            continue
        if not raw.keys() & {"matrix", "workload", "axes"}:
            continue  # a references file, a seed's translation: no matrix
        settings = raw.get("matrix")
        if (settings.get("name", path.stem) if isinstance(settings, dict) else path.stem) == name:
            found.append(path)
    if len(found) > 1:
        raise ConfigError(f"{len(found)} matrix files under {folder}/ are matrix {name!r} "
                          f"({', '.join(map(str, found))}): give the one to join, --matrix "
                          "FILE.toml", field="--matrix")
    return found[0] if found else None


def _planned_groups(run: RunPaths) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A run's plan and its groups (``group -> {"params", "hash"}``); ConfigError naming the
    plan when it is not a plan (damaged, or hand-made without groups)."""
    plan = read_json(run.plan)
    cells = plan.get("cells") if isinstance(plan, dict) else None
    if not isinstance(cells, list):
        raise ConfigError("no 'cells' list", file=str(run.plan), field="cells")
    groups: dict[str, dict[str, Any]] = {}
    for i, cell in enumerate(cells):
        if not (isinstance(cell, dict) and isinstance(cell.get("group"), str)
                and isinstance(cell.get("params"), dict)):
            raise ConfigError("needs group (text) and params", file=str(run.plan),
                              field=f"cells[{i}]")
        groups.setdefault(cell["group"], {"params": cell["params"],
                                          "hash": str(cell.get("hash", ""))})
    return plan, groups


def _target_from_runs(name: str, runs: list[RunPaths]) -> Target | None:
    """The groups of the runs of ``name`` (newest first: its definition of a group wins). A
    run whose plan cannot be read refuses the import (a ConfigError naming it): matched against
    the others only, its cells would be grouped apart from the same configurations of that
    run (None: no runs)."""
    groups: dict[str, dict[str, Any]] = {}
    newest: tuple[RunPaths, dict[str, Any]] | None = None
    for run in reversed(runs):
        try:
            plan, found = _planned_groups(run)
        except ConfigError as exc:
            raise ConfigError([replace(p, message=f"{p.message}: the import matches its cells "
                                       f"against every run of {name!r}; repair this run's plan "
                                       "or move the run out of the results folder")
                               for p in exc.problems]) from None
        for group, data in found.items():
            groups.setdefault(group, data)
        newest = newest or (run, plan)
    if newest is None:
        return None
    run, plan = newest
    text = (run.matrix_file.read_text(encoding="utf-8") if run.matrix_file.is_file()
            else f"# the groups of {name}'s runs under {run.root.parent}\n")
    varying = plan.get("varying")
    baseline = plan.get("baseline")
    return Target(name, groups, [v for v in varying if isinstance(v, str)]
                  if isinstance(varying, list) else [],
                  baseline if isinstance(baseline, str) else None, text,
                  f"the runs of {name} under {run.root.parent}",
                  str(plan.get("table_rule") or "median"))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def generated_matrix(name: str, configs: list[dict[str, Any]], device: str, note: str,
                     table_rule: str | None = None) -> str:
    """A matrix file whose cells are ``configs``: the first is ``[workload]`` (the one cell of
    an empty product), each other an ``[[include]]`` that sets every key the first sets."""
    lines = [f"# {note}", "[matrix]", f"name = {_toml_value(name)}",
             f"description = {_toml_value('imported by orchestrate import')}"]
    if table_rule and table_rule != "median":
        lines.append(f"table_rule = {_toml_value(table_rule)}")
    lines.append("")
    first = configs[0]
    for i, config in enumerate(configs):
        lines.append("[workload]" if i == 0 else "[[include]]")
        # an include takes [workload] for what it leaves out: give the defaults back
        full = {**{k: CellParams.model_fields[k].default for k in first if k not in config},
                **config}
        lines += [f"{k} = {_toml_value(v)}" for k, v in full.items()
                  if v is not None]  # unset (program, hpu_mode): TOML has no null
        lines.append("")
    for hw in sorted({c["hardware"] for c in configs}):  # "v1.00": a quoted key, not dotted
        key = hw if re.fullmatch(r"[A-Za-z0-9_-]+", hw) else _toml_value(hw)
        lines += [f"[hardware.{key}]", f"device = {_toml_value(device)}", ""]
    return "\n".join(lines)


def _target_generated(name: str, known: list[dict[str, Any]], options: ImportOptions,
                      labels: list[str], kinds: Sequence[str] = ()) -> Target:
    missing = [label for label, k in zip(labels, known, strict=True) if "hardware" not in k]
    if missing:
        raise ConfigError([Problem(label, "hardware", "unknown: give --param hardware=NAME "
                                   f"(matrix {name!r} has no runs under "
                                   f"{options.results_root} to match against)")
                           for label in missing])
    configs: list[dict[str, Any]] = []
    for k in known:
        ordered = {p: k[p] for p in PARAM_NAMES if p in k}
        if ordered not in configs:
            configs.append(ordered)
    rule = options.table_rule
    seeds = foreign_formats()
    seed_rules = {seeds[k].table_rule for k in kinds if k in seeds}
    if rule is None and len(seed_rules) == 1 and len(set(kinds)) >= 1 and all(
            k in seeds for k in kinds):
        rule = seed_rules.pop()  # the logs' own format: its table rule
    text = generated_matrix(name, configs, options.device,
                            "generated by orchestrate import: the configurations of the "
                            "imported logs (parameters the logs did not state are defaults)",
                            rule)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        try:
            target = _target_from_matrix_file(path)
        except ConfigError as exc:  # named after what the user gave, not a deleted temp file
            raise ConfigError([Problem("--param", p.field, p.message) for p in exc.problems]
                              ) from None
    target.source = "generated from the imported logs"
    return target


def _checked_name(name: str, where: str = "--matrix") -> str:
    if name_problem(name):  # the one rule for names that become folders
        raise ConfigError(f"{name!r} is no matrix name (letters, digits, _ . -)", field=where)
    return name


def resolve_target(options: ImportOptions, known: list[dict[str, Any]], labels: list[str],
                   kinds: Sequence[str] = ()) -> Target:
    """The matrix whose groups the imported cells join (see the module docstring)."""
    if not options.matrix:
        raise ConfigError("give --matrix NAME (or a matrix .toml): the matrix whose history "
                          "the imported run joins", field="--matrix")
    file = matrix_file_of(options)
    if file is not None:
        return _target_from_matrix_file(file, options.overrides)
    name = _checked_name(options.matrix)
    if options.overrides:
        raise ConfigError(f"--set sets a field of a matrix file, and matrix {name!r} has none "
                          f"under {MATRICES}/: give --matrix FILE.toml", field="--set")
    runs = runs_of(options.results_root, name)
    target = _target_from_runs(name, runs) if runs else None
    return target or _target_generated(name, known, options, labels, kinds)


def matrix_file_of(options: ImportOptions) -> Path | None:
    """The matrix file an import joins (the module docstring's rules 1 and 2), None where
    ``--matrix`` names a matrix without one."""
    if not options.matrix:
        return None
    if options.matrix.endswith(".toml"):
        return Path(options.matrix)
    return matrix_file_named(_checked_name(options.matrix))


def unplanned_warnings(target: Target, groups: Sequence[str], results_root: Path) -> list[str]:
    """For each of ``groups`` (the target's groups an import fills) that the target's runs
    under ``results_root`` planned with another content hash and never with the target's: a
    line saying the import lands beside them, in a configuration of its own."""
    runs = runs_of(results_root, target.name)
    planned = _target_from_runs(target.name, runs) if runs else None
    if planned is None:
        return []
    hashes = {data["hash"] for data in planned.groups.values()}
    out = []
    for group in dict.fromkeys(groups):
        theirs = planned.groups.get(group, {}).get("hash")
        mine = target.groups[group]["hash"]
        if theirs and theirs != mine and mine not in hashes:
            made = "" if not target.overrides else " with " + " ".join(
                f"--set {o}" for o in target.overrides)
            out.append(f"{group}: {target.source}{made} makes it configuration {mine}, which "
                       f"no run of {target.name} under {results_root} planned (they planned "
                       f"{theirs}: the matrix file changed since, or they ran with other "
                       "--set): `history` shows this import apart from them")
    return out


def match_group(known: dict[str, Any], target: Target) -> tuple[str | None, str]:
    """The one group whose parameters agree with every known one: (group, '') or
    (None, why not)."""
    hits = [g for g, c in target.groups.items()
            if all(c["params"].get(k) == v for k, v in known.items())]
    if len(hits) == 1:
        return hits[0], ""
    stated = ", ".join(f"{k}={v}" for k, v in known.items()) or "no parameters"
    if not hits:
        def misses(group: str) -> list[str]:
            params = target.groups[group]["params"]
            return [f"{k}={params.get(k)}" for k, v in known.items() if params.get(k) != v]

        near = min(target.groups, key=lambda g: len(misses(g)), default=None)
        hint = f"; nearest: {near} (has {', '.join(misses(near))})" if near else ""
        return None, (f"matches no configuration of matrix {target.name!r} ({stated}){hint}; "
                      "--param KEY=VALUE states or corrects a parameter, --matrix FILE.toml "
                      "brings configurations its runs do not have")
    differ = sorted({k for k in PARAM_NAMES
                     if len({repr(target.groups[g]["params"].get(k)) for g in hits}) > 1})
    return None, (f"matches {len(hits)} configurations of matrix {target.name!r} "
                  f"({', '.join(hits[:4])}{', ...' if len(hits) > 4 else ''}): give "
                  f"--param for {', '.join(differ)}")
