"""Log files, one per cell: DLLogger raports and logs, our workload's JSON lines, logs read by
regex figures, the seeds' own formats (DLPerf's DLE logs and folder layout, Nsight Compute CSV,
TimeHistory, 'Iteration Duration', Habana's train.py); each found, read once, its parameters
taken from the log and its file name, judged by its figures parser, and written as a cell."""

from __future__ import annotations

import hashlib
import logging
import platform
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator import __version__
from orchestrator.config import user_regex
from orchestrator.config.figures import WARMUP_PARSERS
from orchestrator.config.matrix_file import PARAM_NAMES
from orchestrator.errors import ConfigError, LogFormatError, Problem
from orchestrator.results.figures import foreign_logs as fl
from orchestrator.results.figures.dllogger import (
    FileForm,
    has_dllogger_lines,
    looks_like_raport,
    read_dllogger,
    read_dllogger_file,
    scan_form,
)
from orchestrator.results.figures.figure_parsers import (
    CellOutput,
    Evaluation,
    Failure,
    Figures,
    FiguresConfig,
    foreign_formats,
    judge,
    parse_figures,
    parser_for,
)
from orchestrator.results.folders import safejson
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    new_run_id,
    parse_metric_lines,
    replacing,
    write_json,
)
from orchestrator.results.importer.common import (
    _RESERVED,
    IMPORTER_VERSION,
    Entry,
    ImportOptions,
    ImportPlan,
    _imported_block,
    _plan_json,
    _typed,
    parse_params,
)

log = logging.getLogger(__name__)


#: DLPerf-style file names: ``<arch>_<precision>_bs<batch>_g<gpus>[_r<repeat>].log``.
DEFAULT_PATTERN = (
    r"(?:.*/)?(?P<arch>[a-z][a-z0-9_]*?)_(?P<precision>fp32|amp|bf16)_bs(?P<batch_size>[0-9]+)"
    r"_g(?P<gpus>[0-9]+)(?:_r(?P<repeat>[0-9]+))?\.(?:log|txt|json)"
)


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


def _seed_kind(text: str) -> str | None:
    """Which foreign format a file is in, from its content: the first whose parser detects it
    (:func:`~orchestrator.results.figures.figure_parsers.foreign_formats`)."""
    return next((kind for kind, parser in foreign_formats().items() if parser.detect(text)),
                None)


def _kind(text: str, figures: FiguresConfig | None, dlperf_layout: bool = False) -> str | None:
    """What a file is: a DLLogger raport or log, our workload's log, a log for regex figures, a
    seed's own format; a log in DLPerf's folder layout is read by DLPerf's rule."""
    parser = figures.parser if figures is not None else None
    kinds = {p.name: kind for kind, p in foreign_formats().items()}
    if parser == "regex":
        return "regex-log"
    if parser in kinds:
        return kinds[parser]
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


def _log_params(entry: Entry) -> tuple[dict[str, Any], list[Problem]]:
    if entry.kind == "dlperf-log":
        return {}, []  # the folder layout states them (_apply_layout)
    if entry.kind.startswith("dllogger"):
        dll = entry.dll if entry.dll is not None else read_dllogger(entry.text, entry.label)
        entry.dll = dll
        return _from_record(dll.parameters, _DLE_ARGS, entry.label)
    seed = foreign_formats().get(entry.kind)
    if seed is not None:
        return seed.stated_params(entry.text, entry.path), []
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
    (:data:`~orchestrator.results.figures.foreign_logs.DLPERF_LAYOUT`)."""
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
    seed = foreign_formats().get(entry.kind)
    if seed is not None:
        parser = seed.name
        telemetry = None
        if entry.companions:
            suffix = entry.path.name.removeprefix("resnet_iterdur_").removesuffix(".txt")
            telemetry = f"resnet_*_{suffix}.csv"
        warmup = options.warmup if parser in WARMUP_PARSERS else None
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


def _copy_name(entry: Entry) -> str:
    if entry.kind != "dllogger-raport":
        return RunPaths.CELL_LOG
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
            with replacing(paths.cell_metrics(entry.cell_id)) as fh:
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
