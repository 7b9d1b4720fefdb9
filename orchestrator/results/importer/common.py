"""What every import shares: its options, the matrix it joins, its plan (log entries or a run
folder's cells), the parameters it is given, and what makes a source imported already (its
digest, a run's identity)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator import __version__
from orchestrator.config.matrix_file import PARAM_NAMES, param_type
from orchestrator.errors import ConfigError, Problem
from orchestrator.results.figures.dllogger import DLLoggerLog
from orchestrator.results.figures.figure_parsers import Evaluation, FiguresConfig
from orchestrator.results.folders.run_folder import (
    CellResult,
    ResultsRoot,
    RunPaths,
    read_json,
    runs_of,
)

#: Bumped when what an import writes changes meaning.
IMPORTER_VERSION = "1"


#: Names a copied source must not take in a cell folder.
_RESERVED = RunPaths.CELL_FILES


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass
class ImportOptions:
    """What ``orchestrate import`` was asked."""

    matrix: str | None
    results_root: Path = Path("results")
    params: Sequence[str] = ()
    pattern: str | None = None
    figures: FiguresConfig | None = None
    warmup: int | None = None
    run_id: str | None = None
    allow_partial: bool = False
    device: str = "cuda"
    argv: Sequence[str] = ()
    #: The table rule of a matrix written from the logs (None: the logs' format's own rule).
    table_rule: str | None = None
    #: ``--stack KEY=VALUE``: the software and hardware the logs ran on, as the user declares
    #: it (the fields of :class:`orchestrator.results.folders.store.RecordedStack`).
    stack: Sequence[str] = ()
    #: ``--set KEY=VALUE``: overrides of the matrix file the import joins.
    overrides: Sequence[str] = ()


@dataclass
class Target:
    """The matrix an import joins: its cell groups and how its runs are described."""

    name: str
    groups: dict[str, dict[str, Any]]  # group -> {"params", "hash"}
    varying: list[str]
    baseline: str | None
    matrix_text: str
    source: str
    table_rule: str = "median"
    #: The ``--set`` overrides of its matrix file, as recorded (secrets masked).
    overrides: list[str] = field(default_factory=list)


@dataclass
class Entry:
    """One log file becoming one cell."""

    path: Path
    label: str
    text: str
    sha256: str
    kind: str  # dllogger-raport | dllogger-log | workload-log | regex-log
    known: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    repeat: int | None = None
    group: str = ""
    cell_id: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    evaluation: Evaluation | None = None
    #: The DLLogger log, read once (a streamed entry has no text, only this).
    dll: DLLoggerLog | None = None
    #: Files beside the log that belong to it (seed 002's nvprof CSV per process), copied too.
    companions: list[Path] = field(default_factory=list)
    #: A DLPerf model name the folder layout gave that maps to no architecture (--param arch).
    unknown_model: str | None = None


@dataclass
class RunCell:
    """One cell of an imported run folder."""

    old_id: str
    new_id: str
    group: str
    result: CellResult
    sha256: str


@dataclass
class RunFolder:
    """A run folder of ours, validated."""

    root: Path
    plan: dict[str, Any]
    run_meta: dict[str, Any]
    cells: list[RunCell]
    #: What the run stands for (:func:`source_digests`); the first is its identity's.
    digests: list[str]
    identity: str


@dataclass
class ImportPlan:
    """What an import will write."""

    target: Target
    run_id: str
    entries: list[Entry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    run_folder: RunFolder | None = None

    @property
    def sources(self) -> tuple[list[str], list[str]]:
        """What the import reads: each source's digest, and its name (for messages)."""
        if self.run_folder is not None:
            digests = self.run_folder.digests
            return digests, [str(self.run_folder.root)] * len(digests)
        return [e.sha256 for e in self.entries], [e.label for e in self.entries]

    @property
    def cell_ids(self) -> list[str]:
        if self.run_folder is not None:
            return [c.new_id for c in self.run_folder.cells]
        return [e.cell_id for e in self.entries]


def _typed(key: str, value: Any, from_text: bool) -> Any:
    adapter = TypeAdapter(param_type(key))
    return adapter.validate_strings(value) if from_text else adapter.validate_python(value)


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``--param KEY=VALUE`` items, typed as cell parameters. Every problem at once."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            problems.append(Problem("--param", item, "expected KEY=VALUE, e.g. "
                                    "--param hardware=v100"))
        elif key not in PARAM_NAMES:
            problems.append(Problem("--param", key, f"unknown parameter; known: "
                                    f"{', '.join(PARAM_NAMES)}"))
        elif key in out:
            problems.append(Problem("--param", key, "given twice"))
        else:
            try:
                out[key] = _typed(key, text.strip(), from_text=True)
            except ValidationError as exc:
                problems.append(Problem("--param", item, exc.errors(include_url=False)[0]["msg"]))
    if problems:
        raise ConfigError(problems)
    return out


def _check_run_id(run_id: str, where: ResultsRoot, matrix: str) -> None:
    if not _RUN_ID.match(run_id):
        raise ConfigError(f"{run_id!r}: letters, digits, _ . - only", field="--run-id")
    taken = where.run(matrix, run_id).root
    if taken.exists() or taken.is_symlink():
        raise ConfigError(f"{taken} exists already; give another --run-id", field="--run-id")


def _check_not_imported(name: str, root: Path, digests: list[str], labels: list[str],
                        problems: list[Problem]) -> None:
    """Each source (its digest) not imported into matrix ``name`` yet, nor twice in this import.

    A run folder's digests stand for the run itself (:func:`source_digests`), so a run is
    recognised whatever its copy is called: the same run folder again, under another --run-id,
    a copy of an import of it, or the original run itself lying in the results."""
    seen: dict[str, str] = {}
    for run in runs_of(root, name):
        try:
            meta = read_json(run.run_meta)
        except ConfigError:
            continue  # a damaged run.json: that run's sources are not known
        for digest in source_digests(meta):
            seen.setdefault(digest, run.run_id)
    mine: dict[str, str] = {}
    named: set[str] = set()  # a run folder's several digests: one problem
    for digest, label in zip(digests, labels, strict=True):
        if label in named:
            continue
        if digest in seen:
            problems.append(Problem(label, "", f"already imported into {name} as run "
                                    f"{seen[digest]} (the same source)"))
            named.add(label)
        elif digest in mine and mine[digest] != label:
            problems.append(Problem(label, "", f"the same file as {mine[digest]}"))
            named.add(label)
        mine.setdefault(digest, label)


def run_identity(meta: Any) -> str | None:
    """What makes a run that run wherever its folder is copied: the orchestrator process that
    started it and when (``controller@started_at``; older runs: ``matrix/run id@started_at``),
    kept through imports (an imported run folder's source says whose copy it is)."""
    if not isinstance(meta, dict):
        return None
    imported = meta.get("imported")
    if isinstance(imported, dict):
        for src in imported.get("sources") or []:
            if isinstance(src, dict) and src.get("format") == "run-folder" \
                    and isinstance(src.get("run"), str):
                return str(src["run"])
    started = meta.get("started_at")
    if not isinstance(started, int | float) or isinstance(started, bool):
        return None
    who = meta.get("controller")
    if isinstance(who, str) and who:
        return f"{who}@{started!r}"
    matrix, run_id = meta.get("matrix"), meta.get("run_id")
    if isinstance(matrix, str) and isinstance(run_id, str):
        return f"{matrix}/{run_id}@{started!r}"
    return None


def source_digests(meta: Any) -> list[str]:
    """The digests a run's ``run.json`` stands for: its identity's (:func:`run_identity`)
    and those of every source it was imported from."""
    out: list[str] = []
    identity = run_identity(meta)
    if identity is not None:
        out.append(hashlib.sha256(identity.encode()).hexdigest())
    imported = meta.get("imported") if isinstance(meta, dict) else None
    sources = imported.get("sources") if isinstance(imported, dict) else None
    for src in sources if isinstance(sources, list) else []:
        if not isinstance(src, dict):
            continue
        for digest in [src.get("sha256"), *(src.get("identities") or [])]:
            if isinstance(digest, str) and digest and digest not in out:
                out.append(digest)
    return out


def _imported_block(options: ImportOptions, sources: list[dict[str, Any]], target: Target
                    ) -> dict[str, Any]:
    return {
        "at": time.time(), "importer_version": IMPORTER_VERSION,
        "orchestrate_version": __version__, "target": target.source, "sources": sources,
    }


def _plan_json(plan: ImportPlan, cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "matrix": plan.target.name, "source": plan.target.source, "backend": "import",
        "repeats": max([c["repeat"] for c in cells], default=1),
        "varying": plan.target.varying, "baseline": plan.target.baseline,
        "table_rule": plan.target.table_rule,
        "imported": True, "cells": cells,
        **({"set": plan.target.overrides} if plan.target.overrides else {}),
    }
