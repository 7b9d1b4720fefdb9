"""Import results made elsewhere: existing logs become a run folder like any other.

``orchestrate import`` reads logs a lab already has and writes ``<results>/<matrix>/<run id>/``
(``plan.json``, ``run.json``, ``matrix.toml``, ``cells/<id>/result.json`` and the log), so
``report``, ``history`` and the tables treat it like a run of that matrix. Sources:

- **a DLLogger raport** (``--raport-file``: ``DLLL {json}`` lines) **or stdout log**
  (``DLL <time> - ...`` lines), or a log of our workload (JSON lines): one file, one cell;
- **a folder of DLPerf-style logs named by configuration**: every file under it whose path
  (relative to the folder, ``/``-separated) matches the naming rule is one cell; other files
  are skipped and listed. The rule (:data:`DEFAULT_PATTERN`) is
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

1. ``--matrix PATH.toml``: the groups of that matrix file (expanded as
:mod:`orchestrator.plan.matrix`
   does);
2. ``--matrix NAME`` with runs under ``<results>/NAME``: every group those runs planned;
3. ``--matrix NAME`` without runs: a matrix is written from the logs' parameters (one
   ``[[include]]`` per configuration, hardware from the parameters with ``--device``) and
   expanded by the same rules, so ids are what a sweep of it would give.

Every known parameter must equal the group's; the others are the group's (``provenance``
says which were matched, and from where). Figures are read by
:mod:`orchestrator.results.figure_parsers` (the
DLLogger parser recomputes throughput after the cell's warmup, ``--warmup`` overrides). A
cell whose figures are NaN or out of ``--figures`` bounds is imported as failed, with the reason.

The run id comes from the logs' first timestamp (so an old log sorts into ``history`` where it
happened; ``--run-id`` overrides). Nothing half-written: the run is written into a hidden
folder beside its target and renamed at the end; any problem (a malformed line, a log without
its run summary, a log matching no configuration, a source already imported) is a
:class:`~orchestrator.errors.ConfigError` naming the file and line, and leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator import __version__
from orchestrator.config import user_regex
from orchestrator.config.matrix_file import PARAM_NAMES, CellParams, param_type
from orchestrator.config.syntax import name_problem
from orchestrator.errors import ConfigError, LogFormatError, Problem
from orchestrator.results import folder_lock, safejson
from orchestrator.results import foreign_logs as fl
from orchestrator.results.dllogger import (
    DLLoggerLog,
    FileForm,
    has_dllogger_lines,
    looks_like_raport,
    read_dllogger,
    read_dllogger_file,
    scan_form,
)
from orchestrator.results.figure_parsers import (
    CellOutput,
    Evaluation,
    Failure,
    Figures,
    FiguresConfig,
    judge,
    parse_figures,
    parser_for,
)
from orchestrator.results.run_folder import (
    CellResult,
    RunPaths,
    Status,
    new_run_id,
    parse_metric_lines,
    read_json,
    read_regular,
    runs_of,
    write_json,
)

log = logging.getLogger(__name__)

#: Bumped when what an import writes changes meaning.
IMPORTER_VERSION = "1"

#: DLPerf-style file names: ``<arch>_<precision>_bs<batch>_g<gpus>[_r<repeat>].log``.
DEFAULT_PATTERN = (
    r"(?:.*/)?(?P<arch>[a-z][a-z0-9_]*?)_(?P<precision>fp32|amp|bf16)_bs(?P<batch_size>[0-9]+)"
    r"_g(?P<gpus>[0-9]+)(?:_r(?P<repeat>[0-9]+))?\.(?:log|txt|json)"
)

#: Names a copied source must not take in a cell folder.
_RESERVED = {"log.txt", "result.json", "command.json", "metrics.jsonl"}
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
    #: it (the fields of :class:`orchestrator.results.store.RecordedStack`).
    stack: Sequence[str] = ()


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


# --- parameters --------------------------------------------------------------------------


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


def compile_pattern(pattern: str | None) -> Any:
    """The file-naming rule (RE2 syntax, :mod:`orchestrator.config.user_regex`): its named
    groups must be cell parameters or ``repeat``."""
    text = pattern or DEFAULT_PATTERN
    try:
        rx = user_regex.compile_pattern(text)
    except user_regex.PatternError as exc:
        raise ConfigError(str(exc), file="--pattern") from None
    unknown = sorted(set(rx.groupindex) - set(PARAM_NAMES) - {"repeat"})
    if unknown:
        raise ConfigError(f"named groups must be cell parameters or 'repeat'; unknown: "
                          f"{', '.join(unknown)}", file="--pattern")
    if not rx.groupindex:
        raise ConfigError("has no named group: name the parameters, e.g. "
                          "bs(?P<batch_size>[0-9]+)", file="--pattern")
    return rx


#: DLE ``main.py`` argument -> (cell parameter, conversion).
_DLE_ARGS = {
    "arch": ("arch", lambda v: v.replace("-", "_") if isinstance(v, str) else v),
    "batch_size": ("batch_size", lambda v: v),
    "world_size": ("gpus", lambda v: v),
    "amp": ("precision", lambda v: ("amp" if v else "fp32") if isinstance(v, bool) else v),
    "evaluate": ("mode", lambda v: ("infer" if v else "train") if isinstance(v, bool) else v),
}
#: Our workload's ``meta`` env -> cell parameter.
_WORKLOAD_ENV = {"arch": "arch", "mode": "mode", "batch_size": "batch_size",
                 "precision": "precision", "image_size": "image_size", "world_size": "gpus"}


def _from_record(raw: dict[str, Any], mapping: dict[str, Any], label: str
                 ) -> tuple[dict[str, Any], list[Problem]]:
    out: dict[str, Any] = {}
    problems = []
    for name, how in mapping.items():
        if name not in raw or raw[name] is None:
            continue
        key, convert = how if isinstance(how, tuple) else (how, lambda v: v)
        try:
            out[key] = _typed(key, convert(raw[name]), from_text=False)
        except ValidationError as exc:
            problems.append(Problem(label, f"parameter {name}",
                                    f"{raw[name]!r} is no valid {key}: "
                                    f"{exc.errors(include_url=False)[0]['msg']}"))
    return out, problems


# --- reading log files ---------------------------------------------------------------------


#: The seeds' formats: kind -> (figures parser, the table rule of a matrix written from them).
SEED_KINDS: dict[str, tuple[str, str]] = {
    "dlperf-log": ("dlperf", "dlperf"), "tbd-ncu": ("tbd-ncu", "tbd"),
    "tf-timehistory": ("tf-timehistory", "tbd"),
    "iteration-durations": ("iteration-durations", "per-gpu"), "habana-log": ("habana", "habana"),
}
_PARSER_KIND = {parser: kind for kind, (parser, _) in SEED_KINDS.items()}


def _seed_kind(text: str) -> str | None:
    """Which seed format a file is in, from its content."""
    if fl.details_header(text.splitlines()[:200]) is not None:
        return "tbd-ncu"
    if fl.ITERATION_DURATION.search(text):
        return "iteration-durations"
    if fl.HABANA_LINE.search(text):
        return "habana-log"
    if fl.TIME_HISTORY.search(text):
        return "tf-timehistory"
    if any("Epoch: " in ln and fl.DLPERF_INDEX.search(ln) and fl.DLPERF_TIME.search(ln)
           for ln in text.splitlines()):
        return "dlperf-log"  # pytorch/examples-style lines (old DLE main.py): DLPerf reads them
    return None


def _kind(text: str, figures: FiguresConfig | None, dlperf_layout: bool = False) -> str | None:
    """What a file is: a DLLogger raport or log, our workload's log, a log for regex figures, a
    seed's own format; a log in DLPerf's folder layout is read by DLPerf's rule."""
    parser = figures.parser if figures is not None else None
    if parser == "regex":
        return "regex-log"
    if parser in _PARSER_KIND:
        return _PARSER_KIND[parser]
    if parser is None and dlperf_layout and (has_dllogger_lines(text) or _seed_kind(text)):
        return "dlperf-log"
    if parser in (None, "dllogger") and looks_like_raport(text):
        return "dllogger-raport"
    if parser == "dllogger" or (parser is None and has_dllogger_lines(text)):
        return "dllogger-log"
    if parser is None and _seed_kind(text):
        return _seed_kind(text)
    if parser == "workload" or (parser is None and any(
            o["type"] in ("meta", "summary") for o in parse_metric_lines(text))):
        return "workload-log"
    return None


def _read_entry(path: Path, label: str, options: ImportOptions,
                problems: list[Problem], dlperf_layout: bool = False) -> Entry | None:
    """One log file as an entry: its digest, kind and the parameters it states. A DLLogger
    file read by the DLLogger parser alone (no regex figures) is streamed: read line by line
    and parsed once (:func:`_stream_dllogger`), never held whole as text."""
    try:
        digest, form = _scan(path)
    except OSError as exc:
        problems.append(Problem(label, "", f"cannot read: {exc}"))
        return None
    except UnicodeDecodeError as exc:
        problems.append(Problem(label, "", f"not UTF-8 text (byte {exc.start}): not a log?"))
        return None
    figures = options.figures
    streamed = not dlperf_layout and form.any_records and (figures is None or (
        figures.parser == "dllogger" and not figures.regex and figures.raport is None))
    if streamed:
        kind = "dllogger-raport" if form.raport else "dllogger-log"
        entry = Entry(path, label, "", digest, kind)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            problems.append(Problem(label, "", f"cannot read: {exc}"))
            return None
        found_kind = _kind(text, figures, dlperf_layout)
        if found_kind is None:
            problems.append(Problem(label, "", (
                "no DLLogger (DLLL / DLL) or workload JSON lines and none of the seeds' formats "
                "(DLPerf's DLE logs, Nsight Compute CSV, TimeHistory, 'Iteration Duration', "
                "Habana train.py): not a log this importer reads (give --figures FILE.toml "
                "with regex figures for other programs)")))
            return None
        entry = Entry(path, label, text, digest, found_kind)
    try:
        if streamed:
            entry.dll = read_dllogger_file(path, label, form)
        found, bad = _log_params(entry)
    except LogFormatError as exc:
        problems.extend(exc.problems)
        return None
    problems.extend(bad)
    entry.known = found
    entry.origin = dict.fromkeys(found, "log")
    return entry


def _scan(path: Path) -> tuple[str, FileForm]:
    """One pass over a file: its sha256 and what its lines are (UnicodeDecodeError with the
    byte offset of the first that is not UTF-8)."""
    digest = hashlib.sha256()
    offset = 0

    def lines() -> Iterator[str]:
        nonlocal offset
        with path.open("rb") as fh:
            for raw in fh:
                digest.update(raw)
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UnicodeDecodeError(exc.encoding, exc.object, offset + exc.start,
                                             offset + exc.end, exc.reason) from None
                offset += len(raw)

    stream = lines()
    form = scan_form(stream)
    for _ in stream:  # the rest: the digest covers the whole file, and it must be UTF-8
        pass
    return digest.hexdigest(), form


#: A seed file name that states the batch size (TBD's ``core_util_batch_32.csv``,
#: ``throughput_32.log``).
_BATCH_IN_NAME = re.compile(r"(?:batch_|throughput_)([0-9]+)\.(?:csv|log|txt)$")


def _log_params(entry: Entry) -> tuple[dict[str, Any], list[Problem]]:
    if entry.kind == "dlperf-log":
        return {}, []  # the folder layout states them (_apply_layout)
    if entry.kind.startswith("dllogger"):
        dll = entry.dll if entry.dll is not None else read_dllogger(entry.text, entry.label)
        entry.dll = dll
        return _from_record(dll.parameters, _DLE_ARGS, entry.label)
    if entry.kind == "iteration-durations":  # every rank prints its own series
        gpus = len(fl.iteration_durations(entry.text))
        return ({"gpus": gpus} if gpus else {}), []
    if entry.kind in ("tbd-ncu", "tf-timehistory"):
        match = _BATCH_IN_NAME.search(entry.path.name)
        return ({"batch_size": int(match[1])} if match else {}), []
    if entry.kind == "workload-log":
        lines = parse_metric_lines(entry.text)
        meta = next((o for o in lines if o["type"] == "meta"), {})
        return _from_record(dict(meta.get("env") or {}), _WORKLOAD_ENV, entry.label)
    return {}, []


def _apply_name(entry: Entry, match: re.Match[str] | None, problems: list[Problem]) -> None:
    if match is None:
        return
    for key, text in match.groupdict().items():
        if text is None:
            continue
        if key == "repeat":
            if not (text.isdigit() and len(text) <= 6):
                problems.append(Problem(entry.label, "file name", f"repeat={text[:40]!r}: "
                                        "not a repeat number (the pattern's repeat group must "
                                        "capture digits only)"))
            else:
                entry.repeat = int(text)
            continue
        try:
            value = _typed(key, text, from_text=True)
        except ValidationError as exc:
            problems.append(Problem(entry.label, "file name", f"{key}={text!r}: "
                                    f"{exc.errors(include_url=False)[0]['msg']}"))
            continue
        if key in entry.known and entry.known[key] != value:
            problems.append(Problem(entry.label, "file name", f"says {key}={value} but the "
                                    f"log says {key}={entry.known[key]}"))
            continue
        entry.known[key] = value
        entry.origin.setdefault(key, "file name")


def _apply_layout(entry: Entry, match: re.Match[str], problems: list[Problem]) -> None:
    """The parameters DLPerf's folder layout states: ``<nodes>n<gpus>g/<model>_b<batch>_
    <precision>_<run>.log`` (gpus = nodes x GPUs per node, DLPerf's global batch)."""
    model = match["model"]
    arch = fl.DLPERF_MODELS.get(model)
    if arch is None:
        entry.unknown_model = model  # a problem unless --param arch says which it is
    stated = {"gpus": int(match["nodes"]) * int(match["gpus"]),
              "batch_size": int(match["batch_size"]),
              "precision": fl.DLPERF_PRECISIONS[match["precision"]]}
    if arch is not None:
        stated["arch"] = arch
    for key, value in stated.items():
        entry.known[key] = value
        entry.origin[key] = "DLPerf folder layout"
    entry.repeat = int(match["repeat"])


def _companions(entry: Entry) -> None:
    """Seed 002's nvprof CSV files beside its iteration log: ``resnet_<pid>_<ts>_<host>.csv``
    for ``resnet_iterdur_<ts>_<host>.txt``."""
    if entry.kind != "iteration-durations":
        return
    match = re.fullmatch(r"resnet_iterdur_(.+)\.txt", entry.path.name)
    if match:
        entry.companions = sorted(p for p in entry.path.parent.glob(f"resnet_*_{match[1]}.csv")
                                  if p.is_file())


def collect_entries(sources: Sequence[Path], options: ImportOptions
                    ) -> tuple[list[Entry], list[str]]:
    """Every log file of ``sources`` with the parameters it states. Returns (entries, skipped
    files). Raises ConfigError listing every problem.

    In a folder, a file is one cell when its path matches the naming rule (``--pattern``, else
    :data:`DEFAULT_PATTERN`) or, without ``--pattern``, DLPerf's layout
    (:data:`~orchestrator.results.foreign_logs.DLPERF_LAYOUT`)."""
    rx = compile_pattern(options.pattern)
    layout = re.compile(fl.DLPERF_LAYOUT) if options.pattern is None else None
    problems: list[Problem] = []
    try:
        given = parse_params(options.params)
    except ConfigError as exc:  # reported with the files' problems
        given, problems = {}, list(exc.problems)
    entries: list[Entry] = []
    skipped: list[str] = []
    for source in sources:
        if source.is_dir():
            files = sorted(p for p in source.rglob("*") if p.is_symlink() or p.is_file())
            for path in files:
                if path.is_symlink():  # it may lead anywhere (a private key, /etc)
                    log.warning("%s: a symbolic link, not followed (skipped)", path)
                    skipped.append(f"{path} (a symbolic link, not followed)")
                    continue
                rel = path.relative_to(source).as_posix()
                match = rx.fullmatch(rel)
                dlperf = layout.fullmatch(rel) if layout is not None and match is None else None
                if match is None and dlperf is None:
                    skipped.append(str(path))
                    continue
                entry = _read_entry(path, str(path), options, problems, dlperf is not None)
                if entry is not None:
                    if dlperf is not None:
                        _apply_layout(entry, dlperf, problems)
                    else:
                        _apply_name(entry, match, problems)
                    _companions(entry)
                    entries.append(entry)
        elif source.is_file():
            dlperf = None
            if layout is not None:
                dlperf = layout.fullmatch(f"{source.parent.name}/{source.name}")
            entry = _read_entry(source, str(source), options, problems, dlperf is not None)
            if entry is not None:
                if dlperf is not None:
                    _apply_layout(entry, dlperf, problems)
                else:
                    _apply_name(entry, rx.fullmatch(source.name), problems)
                _companions(entry)
                entries.append(entry)
        else:
            problems.append(Problem(str(source), "", "no such file or folder"))
    origins = dict.fromkeys(given, "--param")
    if options.warmup is not None and "warmup" not in given:
        given["warmup"], origins["warmup"] = options.warmup, "--warmup"  # the cell's warmup
    for entry in entries:
        for key, value in given.items():
            said, where = entry.known.get(key, value), entry.origin.get(key)
            entry.origin[key] = origins[key] + (f" (the {where} said {said})" if said != value
                                                else "")
            entry.known[key] = value
        if entry.unknown_model is not None and "arch" not in entry.known:
            problems.append(Problem(entry.label, "file name", (
                f"DLPerf model {entry.unknown_model!r} is not one this importer knows "
                f"({', '.join(fl.DLPERF_MODELS)}): give --param arch=NAME")))
    if not entries and not problems:
        rules = repr(options.pattern) if options.pattern else (
            f"{DEFAULT_PATTERN!r} or DLPerf's layout {fl.DLPERF_LAYOUT!r}")
        problems.append(Problem(", ".join(map(str, sources)), "",
                                f"no log file to import (none matches the naming rule {rules})"))
    if problems:
        raise ConfigError(problems)
    return entries, skipped


# --- the target matrix ---------------------------------------------------------------------


def _target_from_matrix_file(path: Path) -> Target:
    from orchestrator.plan.matrix import load_matrix

    matrix = load_matrix(path)
    groups = {c.group: {"params": c.params.model_dump(), "hash": c.hash} for c in matrix.cells}
    return Target(matrix.name, groups, list(matrix.varying), matrix.settings.baseline,
                  matrix.source_text, str(path), matrix.settings.table_rule)


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
    """The groups of the runs of ``name`` (newest first: its definition of a group wins); a
    run whose plan cannot be read is skipped with a warning (None: none could be)."""
    groups: dict[str, dict[str, Any]] = {}
    newest: tuple[RunPaths, dict[str, Any]] | None = None
    for run in reversed(runs):
        try:
            plan, found = _planned_groups(run)
        except ConfigError as exc:
            log.warning("%s; its groups are not matched against", exc)
            continue
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
    seed_rules = {SEED_KINDS[k][1] for k in kinds if k in SEED_KINDS}
    if rule is None and len(seed_rules) == 1 and len(set(kinds)) >= 1 and all(
            k in SEED_KINDS for k in kinds):
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
    if options.matrix.endswith(".toml"):
        return _target_from_matrix_file(Path(options.matrix))
    name = _checked_name(options.matrix)
    runs = runs_of(options.results_root, name)
    target = _target_from_runs(name, runs) if runs else None
    return target or _target_generated(name, known, options, labels, kinds)


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


# --- planning --------------------------------------------------------------------------------


#: ``--stack`` fields -> where a result records them (the workload's ``env`` keys; ``image`` and
#: ``image_id``: the provenance), so that an imported cell's stack is read as a sweep's is.
STACK_ENV = {"torch": "torch_version", "cuda": "cuda_version", "cudnn": "cudnn_version",
             "driver": "driver_version", "gpu": "device_name", "host": "hostname",
             "python": "python_version"}
STACK_PROVENANCE = ("image", "image_id")


def parse_stack(items: Sequence[str]) -> dict[str, str]:
    """``--stack KEY=VALUE`` as ``{field: value}``; ConfigError naming each bad item (the
    nearest field for a misspelt one)."""
    import difflib

    known = [*STACK_ENV, *STACK_PROVENANCE]
    out: dict[str, str] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            problems.append(Problem("--stack", item, "expected FIELD=VALUE, e.g. --stack "
                                    "torch=2.4.0"))
        elif key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(Problem("--stack", key, f"unknown field; {hint}known: "
                                    f"{', '.join(known)}"))
        elif key in out and out[key] != value:
            problems.append(Problem("--stack", key, f"given twice ({out[key]!r}, {value!r})"))
        else:
            out[key] = value
    if problems:
        raise ConfigError(problems)
    return out


def _declared(env: dict[str, Any], stack: dict[str, str], label: str,
              problems: list[Problem]) -> dict[str, Any]:
    """The log's env with the declared stack added; a field the log states otherwise is a
    problem (the log is the record)."""
    out = dict(env)
    for key, value in stack.items():
        name = STACK_ENV.get(key)
        if name is None:
            continue
        stated = out.get(name)
        if stated not in (None, "") and str(stated) != value:
            problems.append(Problem(label, f"--stack {key}", f"the log states {stated!r}, "
                                    f"not {value!r}"))
        out[name] = stated if stated not in (None, "") else value
    return out


def plan_import(sources: Sequence[Path], options: ImportOptions) -> ImportPlan:
    """Read, match and judge every source; nothing is written. Raises ConfigError listing
    every problem (with file and line)."""
    declared = parse_stack(options.stack)
    sources = [Path(s) for s in sources]
    folders = [s for s in sources if (s / "plan.json").is_file()]
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
    _check_run_id(run_id, options.results_root / target.name)
    return ImportPlan(target, run_id, entries, skipped)


def _assign_repeats(entries: list[Entry], problems: list[Problem]) -> None:
    """Repeat numbers per group: the file name's, else the next free one in source order."""
    by_group: dict[str, list[Entry]] = {}
    for entry in entries:
        by_group.setdefault(entry.group, []).append(entry)
    for group, members in by_group.items():
        taken: dict[int, Entry] = {}
        for entry in members:
            if entry.repeat is None:
                continue
            if entry.repeat < 1:
                problems.append(Problem(entry.label, "file name",
                                        f"repeat {entry.repeat}: repeats count from 1"))
            elif entry.repeat in taken:
                problems.append(Problem(entry.label, "file name", f"repeat {entry.repeat} of "
                                        f"{group} again (also {taken[entry.repeat].label})"))
            else:
                taken[entry.repeat] = entry
        number = 0
        for entry in members:
            if entry.repeat is None:
                number += 1
                while number in taken:
                    number += 1
                entry.repeat = number
                taken[number] = entry
            entry.cell_id = f"{group}-r{entry.repeat}"


def _judge_entry(entry: Entry, options: ImportOptions, problems: list[Problem]) -> None:
    config = options.figures or _default_figures(entry, options)
    params = dict(entry.params)
    if entry.kind == "dlperf-log":  # DLPerf's own window unless the import states another
        params["warmup"] = entry.known.get("warmup", 20)
        params["iterations"] = entry.known.get("iterations", 100)
    # seed 002: the nvprof CSV files beside the log are read from its folder
    output = CellOutput(entry.text, entry.label, entry.path.parent if entry.companions else None,
                        params, dllogger=entry.dll)
    try:
        figures = parse_figures(output, config)
    except LogFormatError as exc:
        problems.extend(exc.problems)
        return
    failures = judge(figures, parser_for(config).required(entry.params), config,
                     allow_incomplete=options.allow_partial)
    bad = [f for f in failures if f.kind in ("incomplete", "missing")]
    for failure in bad:
        problems.append(_problem_of(entry, failure))
    entry.evaluation = Evaluation(figures, [f for f in failures if f not in bad])


def _default_figures(entry: Entry, options: ImportOptions) -> FiguresConfig:
    """How an entry's figures are read when ``--figures`` does not say: by its kind."""
    if entry.kind in SEED_KINDS:
        parser = SEED_KINDS[entry.kind][0]
        telemetry = None
        if entry.companions:
            suffix = entry.path.name.removeprefix("resnet_iterdur_").removesuffix(".txt")
            telemetry = f"resnet_*_{suffix}.csv"
        warmup = options.warmup if parser in ("dlperf", "habana", "tf-timehistory") else None
        return FiguresConfig.model_validate(
            {"parser": parser, **({"warmup": warmup} if warmup is not None else {}),
             **({"telemetry": telemetry} if telemetry else {})}, strict=False)
    dll = entry.kind.startswith("dllogger")
    return FiguresConfig(parser="dllogger" if dll else "workload",
                         warmup=options.warmup if dll else None)


def _problem_of(entry: Entry, failure: Failure) -> Problem:
    if failure.problem is not None:
        p = failure.problem
        message = p.message + ("; --allow-partial imports what it logged"
                               if failure.kind == "incomplete" else "")
        return Problem(p.file or entry.label, p.field, message)
    return Problem(entry.label, "", failure.message.replace("the program exited 0 but "
                                                            "produced", "the log has"))


def _run_id_of(times: list[float | None], digests: list[str], paths: list[Path]) -> str:
    """The run id an import writes, the same in its dry run: the earliest time the logs state
    (else the newest source file's modification time) and 4 hex digits of the sources'
    digests (an import of the same sources is refused as already imported, so it is unique)."""
    known = [t for t in times if t]
    if not known:
        mtimes = []
        for path in paths:
            try:
                mtimes.append(path.stat().st_mtime)
            except OSError:
                continue
        known = [max(mtimes)] if mtimes else []
    stamp = new_run_id(min(known)).rpartition("-")[0] if known else (
        new_run_id().rpartition("-")[0])
    suffix = hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:4]
    return f"{stamp}-{suffix}"


def _check_run_id(run_id: str, base: Path) -> None:
    if not _RUN_ID.match(run_id):
        raise ConfigError(f"{run_id!r}: letters, digits, _ . - only", field="--run-id")
    if (base / run_id).exists():
        raise ConfigError(f"{base / run_id} exists already; give another --run-id",
                          field="--run-id")


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


# --- our own run folders ------------------------------------------------------------------


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
    found = [path for path in (src / "plan.json", src / "run.json", src / "matrix.toml",
                               src / "cells") if path.is_symlink()]
    if (src / "cells").is_dir() and not (src / "cells").is_symlink():
        for cell in (src / "cells").iterdir():
            found += [p for p in (cell, cell / "result.json") if p.is_symlink()]
    return [Problem(str(path), "", "a symbolic link: not followed (copy what it leads to "
                    "into the run folder, if it belongs there)") for path in found]


def _validate_run_folder(src: Path) -> RunFolder:
    problems = _no_links(src)
    if problems:
        raise ConfigError(problems)
    plan = _load_json(src / "plan.json", problems)
    run_meta = _load_json(src / "run.json", problems)
    if problems:
        raise ConfigError(problems)
    plan_file = str(src / "plan.json")
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
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            problems.append(Problem(plan_file, f"{where}.params.{err['loc'][0]}", err["msg"]))
            continue
        planned[cell["id"]] = cell
    found: list[RunCell] = []
    for result_file in sorted((src / "cells").glob("*/result.json")):
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
        digest = hashlib.sha256(result_file.read_bytes()).hexdigest()
        found.append(RunCell(cell_id, cell_id, planned[cell_id]["group"], result, digest))
    if not found and not problems:
        problems.append(Problem(str(src / "cells"), "", "no cell results"))
    if problems:
        raise ConfigError(problems)
    meta = run_meta if isinstance(run_meta, dict) else {}
    identity = run_identity(meta) or "run-folder:" + hashlib.sha256(
        (src / "plan.json").read_bytes() + (src / "run.json").read_bytes()).hexdigest()
    digests = source_digests(meta) or [hashlib.sha256(identity.encode()).hexdigest()]
    return RunFolder(src, plan, meta, found, digests, identity)


def plan_run_folder(src: Path, options: ImportOptions) -> ImportPlan:
    """Validate our own run folder and re-index its cells to the target matrix."""
    folder = _validate_run_folder(src)
    problems: list[Problem] = []
    planned = {c["id"]: c for c in folder.plan["cells"]}
    matrix = options.matrix
    if matrix and (matrix.endswith(".toml")
                   or runs_of(options.results_root, _checked_name(matrix))):
        target = resolve_target(options, [], [])
        seen: dict[str, str] = {}
        for cell in folder.cells:
            full = CellParams.model_validate(planned[cell.old_id]["params"]).model_dump()
            group, why = match_group(full, target)
            where = str(src / "cells" / cell.old_id)
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
            str(folder.plan.get("matrix") or src.parent.name), f"{src / 'plan.json'}: matrix")
        matrix_text = src / "matrix.toml"
        groups = {c["group"]: {"params": c["params"], "hash": c.get("hash", "")}
                  for c in folder.plan["cells"]}
        target = Target(name, groups, list(folder.plan.get("varying", [])),
                        folder.plan.get("baseline"),
                        matrix_text.read_text(encoding="utf-8") if matrix_text.exists()
                        else f"# imported from {src}\n", f"the run folder {src}",
                        str(folder.plan.get("table_rule") or "median"))
    _check_not_imported(target.name, options.results_root, folder.digests,
                        [str(src)] * len(folder.digests), problems)
    if problems:
        raise ConfigError(problems)
    run_id = options.run_id or src.name
    _check_run_id(run_id, options.results_root / target.name)
    return ImportPlan(target, run_id, run_folder=folder)


# --- writing ---------------------------------------------------------------------------------


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
    }


def _copy_name(entry: Entry) -> str:
    if entry.kind != "dllogger-raport":
        return "log.txt"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", entry.path.name) or "raport.json"
    return f"source-{name}" if name in _RESERVED else name


def _stated(entry: Entry) -> dict[str, Any]:
    """An imported cell's parameters as its log, its file name and ``--param`` state them
    (with the values of the configuration it was matched to)."""
    return {k: v for k, v in entry.params.items() if k in entry.known}


def _write_entries(paths: RunPaths, plan: ImportPlan, options: ImportOptions) -> dict[str, Any]:
    now = time.time()
    declared = parse_stack(options.stack)
    sources = []
    cells = []
    for entry in plan.entries:
        assert entry.evaluation is not None and entry.repeat is not None
        figures: Figures = entry.evaluation.figures
        cell_dir = paths.cell_dir(entry.cell_id)
        cell_dir.mkdir(parents=True)
        shutil.copyfile(entry.path, cell_dir / _copy_name(entry))
        for extra in entry.companions:
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", extra.name)
            shutil.copyfile(extra, cell_dir / (f"source-{name}" if name in _RESERVED else name))
        if figures.records:
            with paths.cell_metrics(entry.cell_id).open("w", encoding="utf-8") as fh:
                fh.writelines(safejson.dumps(o) + "\n" for o in figures.records)
        source = {"path": str(entry.path.resolve()), "sha256": entry.sha256,
                  "format": entry.kind, "cell": entry.cell_id}
        sources.append(source)
        started, finished = figures.started_at, figures.finished_at
        failed = entry.evaluation.failures
        result = CellResult(
            cell_id=entry.cell_id, group=entry.group, repeat=entry.repeat,
            status=Status.FAILED if failed else Status.OK, reason=entry.evaluation.reason,
            started_at=started, finished_at=finished,
            duration_s=round(finished - started, 3) if started and finished else None,
            attempts=0, params=_stated(entry), metrics=figures.metrics,
            env=_declared(figures.env, declared, entry.label, []),
            provenance={
                "backend": "import",
                **{k: v for k, v in declared.items() if k in STACK_PROVENANCE},
                **({"declared_stack": declared} if declared else {}),
                "imported": {**source, "importer_version": IMPORTER_VERSION,
                             "orchestrate_version": __version__, "imported_at": now},
                "matched_on": entry.origin,
                # the configuration it joins (plan.json's group): what the log did not state
                # is the matrix's, never written into params as if measured
                "configuration": entry.params,
                "log_parameters": figures.parameters,
                "figures": figures.info(),
            },
        )
        write_json(paths.cell_result(entry.cell_id), result.to_json())
        cells.append({"id": entry.cell_id, "group": entry.group, "repeat": entry.repeat,
                      "hash": plan.target.groups[entry.group]["hash"], "params": entry.params})
    times = [t for e in plan.entries if e.evaluation
             for t in (e.evaluation.figures.started_at, e.evaluation.figures.finished_at) if t]
    counts: dict[str, int] = {}
    for entry in plan.entries:
        status = "failed" if entry.evaluation and entry.evaluation.failures else "ok"
        counts[status] = counts.get(status, 0) + 1
    write_json(paths.run_meta, {
        "run_id": plan.run_id, "matrix": plan.target.name, "backend": "import",
        "started_at": min(times, default=None), "finished_at": max(times, default=None),
        "orchestrate_version": __version__, "python": sys.version.split()[0],
        "controller_host": platform.node(), "argv": list(options.argv),
        "counts": counts, "interrupted": False,
        "imported": _imported_block(options, sources, plan.target),
    })
    return _plan_json(plan, sorted(cells, key=lambda c: (c["repeat"], c["id"])))


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
        shutil.copytree(folder.root / "cells" / cell.old_id, paths.cell_dir(cell.new_id),
                        ignore=_not_copied)
        result = cell.result
        earlier = result.provenance.get("imported")
        result.provenance = {**result.provenance, "imported": {
            "path": str((folder.root / "cells" / cell.old_id).resolve()),
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
    return _plan_json(plan, sorted(cells, key=lambda c: (c.get("repeat", 1), c["id"])))


#: The lock file of a matrix's folder that imports into it take (one at a time).
IMPORT_LOCK = ".import.lock"
#: How long an import waits for another import into the same matrix to finish.
IMPORT_LOCK_WAIT_S = 600.0


def write_import(plan: ImportPlan, options: ImportOptions) -> RunPaths:
    """Write the run folder: into a hidden folder beside it, renamed at the end. On any
    error nothing is left behind.

    Imports into one matrix are serialized (``<results>/<matrix>/.import.lock``), and under
    that lock the sources are checked again: of two imports of one file started at once, the
    second finds the first's run and is refused."""
    from orchestrator.results.summary import write_summary

    base = options.results_root / plan.target.name
    final = base / plan.run_id
    try:
        base.mkdir(parents=True, exist_ok=True)
        lock = folder_lock.acquire(base / IMPORT_LOCK, wait_s=IMPORT_LOCK_WAIT_S,
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
        _check_run_id(plan.run_id, base)
        return _write_locked(plan, options, base, final, write_summary)


def _write_locked(plan: ImportPlan, options: ImportOptions, base: Path, final: Path,
                  write_summary: Any) -> RunPaths:
    try:
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".import-{plan.run_id}-"))
    except OSError as exc:
        raise ConfigError([Problem("--results", str(options.results_root),
                                   f"cannot create the run folder {final}: "
                                   f"{exc.strerror or exc}")]) from None
    try:
        paths = RunPaths(tmp)
        (tmp / "cells").mkdir()
        paths.matrix_file.write_text(plan.target.matrix_text, encoding="utf-8")
        if plan.run_folder is not None:
            plan_data = _write_run_folder(paths, plan, options)
        else:
            plan_data = _write_entries(paths, plan, options)
        write_json(paths.plan, plan_data)
        write_summary(paths)
        if final.exists():
            raise ConfigError(f"{final} appeared while importing; give another --run-id",
                              field="--run-id")
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("imported %d cells into %s", len(plan.cell_ids), final)
    return RunPaths(final)
