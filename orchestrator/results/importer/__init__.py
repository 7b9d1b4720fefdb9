"""Import results made elsewhere: existing logs become a run folder like any other.

``orchestrate import`` reads logs a lab already has and writes ``<results>/<matrix>/<run id>/``
(``plan.json``, ``run.json``, ``matrix.toml``, ``cells/<id>/result.json`` and the log), so
``report``, ``history`` and the tables treat it like a run of that matrix. Sources:

- **a DLLogger raport** (``--raport-file``: ``DLLL {json}`` lines) **or stdout log**
  (``DLL <time> - ...`` lines), or a log of our workload (JSON lines): one file, one cell;
- **a folder of DLPerf-style logs named by configuration**: every file under it whose path
  (relative to the folder, ``/``-separated) matches the naming rule is one cell; other files
  are skipped and listed. The rule
  (:data:`~orchestrator.results.importer.logs.DEFAULT_PATTERN`) is
  ``<arch>_<precision>_bs<batch>_g<gpus>[_r<repeat>].<log|txt|json>`` in any sub-folder, e.g.
  ``resnet50_amp_bs256_g8_r2.log``; ``--pattern REGEX`` replaces it: a Python regex matched
  against the whole relative path whose named groups are cell parameters (and ``repeat``);
- **our own run folder** copied from another machine (it has a ``plan.json``): validated, its
  cells re-indexed to the target matrix by their parameters; their provenance is kept.

Parameters of a log's cell come from, in rising precedence: the log itself (DLLogger's
PARAMETER record as DLE's ``main.py`` logs its arguments — ``arch``, ``batch_size``,
``world_size`` -> gpus, ``amp`` -> precision, ``evaluate`` -> mode; our workload's ``meta``
line), the file name (the naming rule; a value contradicting the log is an error), and
``--param KEY=VALUE``. The known parameters pick the cell group of the target matrix
(``--matrix``) the log joins, so ``history`` lines it up with the matrix's other runs:

1. ``--matrix PATH.toml``, or ``--matrix NAME`` where ``./matrices/`` has NAME's matrix file:
   the groups of that matrix file (with ``--set``'s overrides; expanded as
   :mod:`orchestrator.plan.matrix` does): a matrix file's configuration is used whenever
   there is one (:mod:`~orchestrator.results.importer.target`);
2. ``--matrix NAME`` without a file, with runs under ``<results>/NAME``: every group those runs
   planned;
3. ``--matrix NAME`` without either: a matrix is written from the logs' parameters (one
   ``[[include]]`` per configuration, hardware from the parameters with ``--device``) and
   expanded by the same rules, so ids are what a sweep of it would give.

Every known parameter must equal the group's; the others are the group's (``provenance``
says which were matched, and from where). Figures are read by
:mod:`orchestrator.results.figures.figure_parsers` (the DLLogger parser recomputes throughput
after the cell's warmup, ``--warmup`` overrides). A
cell whose figures are NaN or out of ``--figures`` bounds is imported as failed, with the reason.

The run id comes from the logs' first timestamp (so an old log sorts into ``history`` where it
happened; ``--run-id`` overrides). Nothing half-written: the run is written into a hidden
folder beside its target and renamed at the end; any problem (a malformed line, a log without
its run summary, a log matching no configuration, a source already imported) is a
:class:`~orchestrator.errors.ConfigError` naming the file and line, and leaves nothing behind.

The importer by what it reads:

* :mod:`~orchestrator.results.importer.logs` — log files, one per cell (DLLogger raports and
  logs, our workload's JSON lines, logs read by regex figures, the seeds' own formats, DLPerf's
  folder layout): found, read, matched, judged and written;
* :mod:`~orchestrator.results.importer.run_folders` — our own run folders copied from another
  machine: validated, re-indexed, copied;
* :mod:`~orchestrator.results.importer.target` — the matrix an import joins (the one module of
  the results that expands a matrix);
* :mod:`~orchestrator.results.importer.common` — what every import shares: its options and
  plan, the parameters it is given, and whether a source was imported already.

This module plans and writes an import of either kind.

May import: errors, config, plan (the target only), folders, figures, reports.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError, Problem
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.run_folder import ResultsRoot, RunPaths, write_file, write_json
from orchestrator.results.importer.common import (
    IMPORTER_VERSION,
    ImportOptions,
    ImportPlan,
    _check_not_imported,
    _check_run_id,
)
from orchestrator.results.importer.logs import (
    _assign_repeats,
    _declared,
    _judge_entry,
    _run_id_of,
    _write_entries,
    collect_entries,
    parse_stack,
)
from orchestrator.results.importer.run_folders import _write_run_folder, plan_run_folder
from orchestrator.results.importer.target import (
    match_group,
    matrix_file_of,
    resolve_target,
    unplanned_warnings,
)

__all__ = ["IMPORTER_VERSION", "IMPORT_LOCK", "ImportOptions", "ImportPlan", "plan_import",
           "write_import"]

log = logging.getLogger(__name__)


def plan_import(sources: Sequence[Path], options: ImportOptions) -> ImportPlan:
    """Read, match and judge every source; nothing is written. Raises ConfigError listing
    every problem (with file and line)."""
    declared = parse_stack(options.stack)
    sources = [Path(s) for s in sources]
    folders = [s for s in sources if RunPaths.is_run(s)]
    if folders:
        if len(sources) > 1:
            raise ConfigError("a run folder is imported on its own (one per import)",
                              file=str(folders[0]))
        if declared:
            raise ConfigError("a run folder records its own stack; --stack is for logs",
                              field="--stack")
        return plan_run_folder(folders[0], options)
    entries, skipped = collect_entries(sources, options)
    target = resolve_target(options, [e.known for e in entries], [e.label for e in entries],
                            [e.kind for e in entries])
    problems: list[Problem] = []
    for entry in entries:
        group, why = match_group(entry.known, target)
        if group is None:
            problems.append(Problem(entry.label, "parameters", why))
        else:
            entry.group, entry.params = group, dict(target.groups[group]["params"])
    if problems:
        raise ConfigError(problems)
    if matrix_file_of(options) is not None:
        for line in unplanned_warnings(target, [e.group for e in entries if e.group],
                                       options.results_root):
            log.warning("%s", line)
    _assign_repeats(entries, problems)
    for entry in entries:
        _judge_entry(entry, options, problems)
    _check_not_imported(target.name, options.results_root, [e.sha256 for e in entries],
                        [e.label for e in entries], problems)
    for entry in entries:
        if entry.evaluation is not None:
            _declared(entry.evaluation.figures.env, declared, entry.label, problems)
    if problems:
        raise ConfigError(problems)
    run_id = options.run_id or _run_id_of(
        [e.evaluation.figures.started_at for e in entries if e.evaluation],
        [e.sha256 for e in entries], [e.path for e in entries])
    _check_run_id(run_id, ResultsRoot(options.results_root), target.name)
    return ImportPlan(target, run_id, entries, skipped)


#: The lock file of a matrix's folder that imports into it take (one at a time).
IMPORT_LOCK = ResultsRoot.IMPORT_LOCK


#: How long an import waits for another import into the same matrix to finish.
IMPORT_LOCK_WAIT_S = 600.0


def write_import(plan: ImportPlan, options: ImportOptions) -> RunPaths:
    """Write the run folder: into a hidden folder beside it, renamed at the end. On any
    error nothing is left behind.

    Imports into one matrix are serialized (``<results>/<matrix>/.import.lock``), and under
    that lock the sources are checked again: of two imports of one file started at once, the
    second finds the first's run and is refused."""
    from orchestrator.results.reports.summary import write_summary

    where = ResultsRoot(options.results_root)
    base = where.matrix_dir(plan.target.name)
    final = where.run(plan.target.name, plan.run_id).root
    try:
        base.mkdir(parents=True, exist_ok=True)
        lock = folder_lock.acquire(where.import_lock(plan.target.name), wait_s=IMPORT_LOCK_WAIT_S,
                                   argv=options.argv or None)
    except folder_lock.LockHeld as exc:
        raise ConfigError(f"another import into {plan.target.name!r} is still under way "
                          f"({exc.holder}) after {IMPORT_LOCK_WAIT_S:g} s; try again when it "
                          "has ended", file=str(base)) from None
    except OSError as exc:  # a read-only or full results folder: nothing was written
        raise ConfigError([Problem("--results", str(options.results_root),
                                   f"cannot create the run folder {final}: "
                                   f"{exc.strerror or exc}")]) from None
    with lock:
        problems: list[Problem] = []
        _check_not_imported(plan.target.name, options.results_root, *plan.sources, problems)
        if problems:
            raise ConfigError(problems)
        _check_run_id(plan.run_id, where, plan.target.name)
        try:
            return _write_locked(plan, options, where, final, write_summary)
        except OSError as exc:  # a full disk, a folder gone read-only: nothing was left
            raise ConfigError([Problem("--results", str(options.results_root),
                                       f"cannot write the run folder {final}: "
                                       f"{_reason(exc)}; nothing was imported")]) from None


def _reason(exc: OSError) -> str:
    """An OSError in words; a copy's (``shutil.Error``: a list of failed files) by its first."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) \
            and exc.args[0] and len(exc.args[0][0]) == 3:
        return str(exc.args[0][0][2])
    return str(exc.strerror or exc)


def _write_locked(plan: ImportPlan, options: ImportOptions, where: ResultsRoot, final: Path,
                  write_summary: Any) -> RunPaths:
    try:
        tmp = where.new_import_folder(plan.target.name, plan.run_id)
    except OSError as exc:
        raise ConfigError([Problem("--results", str(options.results_root),
                                   f"cannot create the run folder {final}: "
                                   f"{exc.strerror or exc}")]) from None
    try:
        paths = RunPaths(tmp)
        paths.cells_dir.mkdir()
        write_file(paths.matrix_file, plan.target.matrix_text)
        if plan.run_folder is not None:
            plan_data = _write_run_folder(paths, plan, options)
        else:
            plan_data = _write_entries(paths, plan, options)
        write_json(paths.plan, plan_data)
        write_summary(paths)
        if final.exists() or final.is_symlink():
            raise ConfigError(f"{final} appeared while importing; give another --run-id",
                              field="--run-id")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("imported %d cells into %s", len(plan.cell_ids), final)
    return RunPaths(final)
