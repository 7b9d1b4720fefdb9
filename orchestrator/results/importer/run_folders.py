"""Our own run folders copied from another machine (they have a ``plan.json``): validated (no
links, readable plan, run.json and results), their cells re-indexed to the target matrix by
their parameters, copied with their provenance kept."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import __version__
from orchestrator.config.files import problems_from_validation
from orchestrator.config.matrix_file import CellParams
from orchestrator.errors import ConfigError, Problem
from orchestrator.results.folders import safejson
from orchestrator.results.folders.run_folder import (
    CellResult,
    ResultsRoot,
    RunPaths,
    read_regular,
    runs_of,
    write_json,
)
from orchestrator.results.importer.common import (
    IMPORTER_VERSION,
    ImportOptions,
    ImportPlan,
    RunCell,
    RunFolder,
    Target,
    _check_not_imported,
    _check_run_id,
    _imported_block,
    _plan_json,
    run_identity,
    source_digests,
)
from orchestrator.results.importer.target import (
    _checked_name,
    match_group,
    matrix_file_of,
    resolve_target,
)

log = logging.getLogger(__name__)


def _load_json(path: Path, problems: list[Problem]) -> Any:
    try:
        return safejson.loads(read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        problems.append(Problem(str(path), "", "missing (not a complete run folder)"))
    except ConfigError as exc:  # not a regular file
        problems.extend(exc.problems)
    except json.JSONDecodeError as exc:
        problems.append(Problem(str(path), f"line {exc.lineno}", f"malformed JSON: {exc.msg}"))
    except safejson.JSONLimitError as exc:
        problems.append(Problem(str(path), "", str(exc)))
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(Problem(str(path), "", f"cannot read: {exc}"))
    return None


def _no_links(src: Path) -> list[Problem]:
    """Problems for what in a run folder is a symbolic link where the import reads (its
    plan.json, run.json, matrix.toml, cells/ and each cell's folder and result.json): a link
    may lead anywhere, and its target would be read, or copied, into the results."""
    run = RunPaths(src)
    found = [path for path in (run.plan, run.run_meta, run.matrix_file, run.cells_dir)
             if path.is_symlink()]
    if run.cells_dir.is_dir() and not run.cells_dir.is_symlink():
        for cell in run.cells_dir.iterdir():
            found += [p for p in (cell, run.cell_result(cell.name)) if p.is_symlink()]
    return [Problem(str(path), "", "a symbolic link: not followed (copy what it leads to "
                    "into the run folder, if it belongs there)") for path in found]


def _validate_run_folder(src: Path) -> RunFolder:
    problems = _no_links(src)
    if problems:
        raise ConfigError(problems)
    run = RunPaths(src)
    plan = _load_json(run.plan, problems)
    run_meta = _load_json(run.run_meta, problems)
    if problems:
        raise ConfigError(problems)
    plan_file = str(run.plan)
    cells = plan.get("cells") if isinstance(plan, dict) else None
    if not isinstance(cells, list):
        raise ConfigError("no 'cells' list", file=plan_file, field="cells")
    planned: dict[str, dict[str, Any]] = {}
    for i, cell in enumerate(cells):
        where = f"cells[{i}]"
        if not (isinstance(cell, dict) and isinstance(cell.get("id"), str)
                and isinstance(cell.get("group"), str) and isinstance(cell.get("params"), dict)):
            problems.append(Problem(plan_file, where, "needs id, group (text) and params"))
            continue
        try:
            CellParams.model_validate(cell["params"])
        except ValidationError as exc:  # a field's error, or the whole cell's (gpus vs nodes)
            problems += [replace(p, field=f"{where}.params.{p.field}".rstrip("."))
                         for p in problems_from_validation(plan_file, exc)]
            continue
        planned[cell["id"]] = cell
    found: list[RunCell] = []
    for result_file in run.result_files():
        data = _load_json(result_file, problems)
        if data is None:
            continue
        try:
            result = CellResult.from_json(data)
        except ValueError as exc:  # CellResult.from_json names the field first ("metrics: ...")
            field, sep, detail = str(exc).partition(": ")
            if not (sep and field.split(".")[0] in CellResult.__dataclass_fields__):
                field, detail = "", str(exc)
            problems.append(Problem(str(result_file), field, f"not a cell result: {detail}"))
            continue
        cell_id = result_file.parent.name
        if result.cell_id != cell_id or cell_id not in planned:
            problems.append(Problem(str(result_file), "cell_id",
                                    f"{result.cell_id!r} is not a cell of the run's plan "
                                    f"(folder {cell_id})"))
            continue
        differs = _not_as_planned(planned[cell_id], result)
        if differs:
            problems.append(Problem(str(result_file), differs[0], f"{differs[1]}: the run's "
                                    f"plan.json does not describe its cell {cell_id}"))
            continue
        digest = hashlib.sha256(result_file.read_bytes()).hexdigest()
        found.append(RunCell(cell_id, cell_id, planned[cell_id]["group"], result, digest))
    if not found and not problems:
        problems.append(Problem(str(run.cells_dir), "", "no cell results"))
    if problems:
        raise ConfigError(problems)
    meta = run_meta if isinstance(run_meta, dict) else {}
    identity = run_identity(meta) or "run-folder:" + hashlib.sha256(
        run.plan.read_bytes() + run.run_meta.read_bytes()).hexdigest()
    digests = source_digests(meta) or [hashlib.sha256(identity.encode()).hexdigest()]
    return RunFolder(src, plan, meta, found, digests, identity)


def _not_as_planned(planned: dict[str, Any], result: CellResult) -> tuple[str, str] | None:
    """Where a cell's result contradicts its plan.json entry (its group, repeat, or a
    parameter both state: a log's import records only what the log stated), and how; None
    where it does not."""
    if result.group != planned["group"]:
        return "group", f"{result.group!r}, the plan says {planned['group']!r}"
    repeat = planned.get("repeat")
    if isinstance(repeat, int) and result.repeat != repeat:
        return "repeat", f"{result.repeat}, the plan says {repeat}"
    for key, value in result.params.items():
        if key in planned["params"] and planned["params"][key] != value:
            return f"params.{key}", f"{value!r}, the plan says {planned['params'][key]!r}"
    return None


def plan_run_folder(src: Path, options: ImportOptions) -> ImportPlan:
    """Validate our own run folder and re-index its cells to the target matrix."""
    folder = _validate_run_folder(src)
    run = RunPaths(src)
    problems: list[Problem] = []
    planned = {c["id"]: c for c in folder.plan["cells"]}
    matrix = options.matrix
    if matrix and (matrix_file_of(options) is not None
                   or runs_of(options.results_root, _checked_name(matrix))):
        target = resolve_target(options, [], [])
        seen: dict[str, str] = {}
        for cell in folder.cells:
            full = CellParams.model_validate(planned[cell.old_id]["params"]).model_dump()
            group, why = match_group(full, target)
            where = str(run.cell_dir(cell.old_id))
            if group is None:
                problems.append(Problem(where, "params", why))
                continue
            cell.group, cell.new_id = group, f"{group}-r{cell.result.repeat}"
            if cell.new_id in seen:
                problems.append(Problem(where, "params", f"becomes {cell.new_id} of "
                                        f"{target.name!r}, as {seen[cell.new_id]} does"))
            seen.setdefault(cell.new_id, cell.old_id)
    else:
        name = _checked_name(matrix) if matrix else _checked_name(
            str(folder.plan.get("matrix") or src.parent.name), f"{run.plan}: matrix")
        matrix_text = run.matrix_file
        groups = {c["group"]: {"params": c["params"], "hash": c.get("hash", "")}
                  for c in folder.plan["cells"]}
        target = Target(name, groups, list(folder.plan.get("varying", [])),
                        folder.plan.get("baseline"),
                        matrix_text.read_text(encoding="utf-8") if matrix_text.exists()
                        else f"# imported from {src}\n", f"the run folder {src}",
                        str(folder.plan.get("table_rule") or "median"),
                        overrides=_texts(folder.plan.get("set")))  # its matrix.toml's --set
    _check_not_imported(target.name, options.results_root, folder.digests,
                        [str(src)] * len(folder.digests), problems)
    if problems:
        raise ConfigError(problems)
    run_id = options.run_id or src.name
    _check_run_id(run_id, ResultsRoot(options.results_root), target.name)
    return ImportPlan(target, run_id, run_folder=folder)


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """What a run folder's copy leaves out: symbolic links (they may lead anywhere: a private
    key, /etc) and what is neither a file nor a folder (a FIFO would block the copy); each
    with a warning."""
    left = set()
    for name in names:
        path = Path(folder, name)
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            log.warning("%s: %s, not copied", path, "a symbolic link" if path.is_symlink()
                        else "not a regular file")
            left.add(name)
    return left


def _write_run_folder(paths: RunPaths, plan: ImportPlan, options: ImportOptions
                      ) -> dict[str, Any]:
    folder = plan.run_folder
    assert folder is not None
    now = time.time()
    planned = {c["id"]: c for c in folder.plan["cells"]}
    cells = []
    for cell in folder.cells:
        source = RunPaths(folder.root).cell_dir(cell.old_id)
        shutil.copytree(source, paths.cell_dir(cell.new_id),
                        ignore=_not_copied)
        result = cell.result
        earlier = result.provenance.get("imported")
        result.provenance = {**result.provenance, "imported": {
            "path": str(source.resolve()),
            "sha256": cell.sha256, "format": "run-folder", "original_cell_id": cell.old_id,
            "original_run_id": folder.root.name, "original_matrix": folder.plan.get("matrix"),
            "importer_version": IMPORTER_VERSION, "orchestrate_version": __version__,
            "imported_at": now, **({"previous": earlier} if earlier else {}),
        }}
        result.cell_id, result.group = cell.new_id, cell.group
        write_json(paths.cell_result(cell.new_id), result.to_json())
        old = planned[cell.old_id]
        cells.append({**old, "id": cell.new_id, "group": cell.group,
                      "hash": plan.target.groups.get(cell.group, {}).get("hash", old.get("hash"))})
    sources = [{"path": str(folder.root.resolve()), "sha256": folder.digests[0],
                "format": "run-folder", "run": folder.identity,
                "identities": folder.digests[1:]}]
    meta = {**folder.run_meta, "run_id": plan.run_id, "matrix": plan.target.name,
            "imported": _imported_block(options, sources, plan.target)}
    write_json(paths.run_meta, meta)
    position = {c["id"]: i for i, c in enumerate(folder.plan["cells"])}
    order = {cell.new_id: position[cell.old_id] for cell in folder.cells}
    selection = {key: _texts(folder.plan.get(key)) for key in ("only", "exclude")}
    return {**_plan_json(plan, sorted(cells, key=lambda c: order[c["id"]])),  # the run's order
            **{key: texts for key, texts in selection.items() if texts}}


def _texts(value: Any) -> list[str]:
    """A plan.json list of option texts (``set``, ``only``, ``exclude``); [] for anything
    else."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
