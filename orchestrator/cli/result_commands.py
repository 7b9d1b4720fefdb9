"""``orchestrate runs | report | logs | compare | history | export``: reading results across runs.

``report`` works on one run folder (and still rewrites its summary files; in a read-only
archive it prints the table and a note instead); the others query the results store
(:mod:`orchestrator.results.folders.store`), which they refresh from the folders first. When the
index cannot
live in the results folder (read-only archive), a note on stderr says where it is.

Output files the user names (``--plot``, ``--html``, ``--out``) are checked before any work
(a plot's format from its suffix) and a file that cannot be written is one ``error:`` line
naming the option (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import calendar
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli import options
from orchestrator.config.defaults import results_root
from orchestrator.errors import ConfigError, Problem, cannot_write

if TYPE_CHECKING:
    from orchestrator.results.folders.store import Store

#: A run's status (orchestrator.results.folders.store.RunRecord.status): how it ended,
#: ``unfinished`` (a sweep that crashed or was killed) or ``running`` (a sweep works in it now).
RUN_STATUSES = ("ok", "failed", "interrupted", "unfinished", "empty", "running")
#: A cell result's status (orchestrator.results.folders.run_folder.Status), for export --status.
CELL_STATUSES = ("ok", "failed", "timeout", "oom", "host_lost", "cancelled", "unplaceable")
#: What ``--plot FILE`` can write, by the file's suffix.
PLOT_FORMATS = ("png", "svg", "pdf")


def plot_file(path: Path | None) -> Path | None:
    """``--plot FILE``, refused before any work unless its suffix names a format we draw."""
    if path is None:
        return None
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in PLOT_FORMATS:
        what = f"'.{fmt}' is not a plot format" if fmt else "no suffix to say the format"
        raise ConfigError([Problem("--plot", str(path), f"{what}; give a file ending "
                                   + ", ".join(f".{f}" for f in PLOT_FORMATS))])
    return path


@contextmanager
def writing(option: str, path: Path) -> Iterator[None]:
    """Turn an OSError while writing the file of ``option`` into one clear error line."""
    try:
        yield
    except OSError as exc:
        raise cannot_write(option, path, exc) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "runs", help="list runs: date, matrix, backend, cells ok/failed, duration, revision",
        description="List the runs under the results folder, oldest first. A run a sweep "
        "works in now is 'running', one whose sweep died 'unfinished'; 'duration' leaves out "
        "the time its cells waited for another sweep's locks ('lock wait').")
    p.add_argument("matrix", nargs="?", help="only this matrix (name or path to its .toml)")
    options.results(p)
    _date_args(p)
    p.add_argument("--status", action="append", choices=RUN_STATUSES, default=[],
                   help="only runs with this status (repeatable)")
    p.add_argument("--last", type=int, metavar="N", help="only the newest N runs")
    options.json(p, "a JSON list, one object per run")
    p.add_argument("--reindex", action="store_true",
                   help="rebuild the index from the run folders first")
    p.set_defaults(handler=cmd_runs)

    p = sub.add_parser(
        "report", help="re-print the summary table of a run; --html for a report",
        description="The summary table of a run (default: the newest of MATRIX), rebuilt from "
        "its cells' result.json files. --plot draws it, --html writes one self-contained report "
        "(tables, plots, provenance); --baseline adds a ratio column. Read-only archives are "
        "fine: the summary files are refreshed only where they can be written.")
    p.add_argument("matrix", nargs="?", metavar="MATRIX[:RUN]",
                   help="matrix name (or a path to its .toml), with :RUN for one of its runs "
                   "as publish and logs take it (default: the one of --run MATRIX:RUN, else "
                   "the one matrix under the results)")
    options.run(p, "run id, a unique prefix of one, latest or latest~N, each with MATRIX: "
                "before it or not (default: the newest)")
    options.results(p)
    p.add_argument("--baseline", metavar="KEY=VALUE",
                   help="add each row's ratio to this row, e.g. hardware=v100 "
                   "(default: [matrix] baseline)")
    options.plot(p, "also draw it (png/svg/pdf): scaling vs GPUs, or bars per configuration")
    options.html(p, "also write a self-contained HTML report (tables, plot, provenance)")
    p.set_defaults(handler=cmd_report)

    p = sub.add_parser(
        "logs", help="print a cell's log; --follow it while the cell runs",
        description="Print the log of one cell of a run (what its program printed, after the "
        "command line it ran). --follow prints what is added until the cell ends, as "
        "`tail -f` does; a cell not started yet is waited for while its sweep runs.")
    p.add_argument("run", metavar="MATRIX[:RUN]",
                   help="the run: MATRIX (its newest run), MATRIX:RUN_ID (or a unique prefix), "
                   "MATRIX:latest~N")
    p.add_argument("cell", metavar="CELL", help="cell id, or a unique prefix of one")
    options.results(p)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing what the cell writes until it ends")
    p.add_argument("-n", "--tail", type=int, metavar="N",
                   help="start with the last N lines (default: the whole log)")
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser(
        "compare", help="two runs side by side: change per configuration, interval, verdict",
        description="Compare run B with run A (the baseline). A run is a run id (or a unique "
        "prefix), MATRIX:RUN_ID, MATRIX:latest or MATRIX:latest~N.")
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    options.matrix(p, "matrix of RUN_A/RUN_B when they name no matrix")
    options.results(p)
    p.add_argument("--confidence", default="95%", metavar="PCT",
                   help="interval level, a percentage (default 95%%)")
    p.add_argument("--threshold", default="0%", metavar="PCT",
                   help="smallest change called faster/slower, a percentage (default 0%%)")
    _metric_arg(p)
    _raw_arg(p)
    fmt = p.add_mutually_exclusive_group()
    options.json(fmt, "JSON instead of the table")
    fmt.add_argument("--csv", action="store_true", help="CSV, one row per configuration")
    options.html(p, "also write an HTML report")
    p.add_argument("--allow-same", action="store_true",
                   help="compare a run with itself when both name it (refused otherwise: a "
                   "misspelt or too short run id, latest~N past the runs)")
    p.set_defaults(handler=cmd_compare)

    p = sub.add_parser(
        "history", help="a matrix across runs: trend and a noise-aware regression check",
        description="The newest run of a matrix against the runs before it, per configuration "
        "(parameters + hardware profile) and stack. Exit 1 with --fail-on-regression when a "
        "configuration regressed, failed, is missing or was dropped, or misses its reference.")
    p.add_argument("matrix", help="matrix name (or a path to its .toml)")
    options.results(p)
    options.run(p, "check this run instead of the newest (finished or not)")
    p.add_argument("--last", type=int, default=7, metavar="N", help="runs shown (default 7)")
    p.add_argument("--window", type=int, default=10, metavar="N",
                   help="earlier runs the newest is compared with (default 10)")
    p.add_argument("--min-history", type=int, default=3, metavar="N",
                   help="earlier runs of a configuration needed before it is judged (default 3)")
    p.add_argument("--threshold", default="5%", metavar="PCT",
                   help="smallest drop called a regression, a percentage (default 5%%)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="chance of any false alarm in a run: one-sided level, Holm-adjusted "
                   "over its configurations (default 0.05)")
    _metric_arg(p)
    _raw_arg(p)
    p.add_argument("--ignore-stack", action="append", default=[], metavar="FIELD",
                   help="stack field not to match on, e.g. host (repeatable)")
    refs = p.add_mutually_exclusive_group()
    refs.add_argument("--references", type=Path, metavar="FILE",
                      help="absolute references (default: MATRIX.references.toml next to the "
                      "matrix file, when there is one)")
    refs.add_argument("--no-references", action="store_true", help="check no references")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 on a regression, failure, missing or dropped configuration or "
                   "missed reference (for nightly jobs)")
    p.add_argument("--allow-dropped", action="store_true",
                   help="a configuration the newest run left out of its plan (--only, "
                   "--exclude, or taken out of the matrix) does not fail --fail-on-regression")
    options.plot(p, "also draw the trend (png/svg/pdf)")
    options.json(p, "JSON instead of the table")
    p.set_defaults(handler=cmd_history)

    p = sub.add_parser(
        "export", help="long-format CSV/JSON of any runs: one row per cell result and figure",
        description="Export cell results of a selection of runs, one row per cell and figure "
        "(pandas: read_csv / read_json).")
    p.add_argument("matrices", nargs="*", metavar="MATRIX", help="only these matrices")
    options.results(p)
    _date_args(p)
    options.run(p, "only this run (id, MATRIX:RUN_ID, MATRIX:latest; repeatable)",
                action="append", default=[], metavar="RUN")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="only cells with this parameter (repeatable; same key: any value)")
    p.add_argument("--figure", action="append", default=[], metavar="NAME",
                   help="only this figure, e.g. train.total_ips (repeatable)")
    p.add_argument("--status", action="append", default=[], metavar="STATUS",
                   choices=CELL_STATUSES, help="only cells with this status: "
                   f"{', '.join(CELL_STATUSES)} (repeatable)")
    p.add_argument("--format", choices=("csv", "json"), default="csv")
    p.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")
    p.set_defaults(handler=cmd_export)


def _metric_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metric", metavar="NAME",
                   help="throughput figure to judge instead of the headline images/s, e.g. "
                   "train.step_ips_p90 (per-step images/s, 90th percentile: robust on a shared "
                   "machine)")


def _raw_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--raw", action="store_true",
                   help="judge the raw figures even where the runs had a [control] (default: "
                   "each cell's figure as a ratio to the control measured beside it)")


def _date_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", metavar="DATE", help="runs started at or after: YYYY-MM-DD[THH:MM"
                   "[:SS]] (UTC) or an age like 7d / 12h")
    p.add_argument("--until", metavar="DATE", help="runs started before (same forms)")


# --- helpers -----------------------------------------------------------------------------------


def matrix_name(arg: str) -> str:
    """A matrix name from ``NAME`` or ``path/to/NAME.toml`` (checked: it becomes a path)."""
    from orchestrator.config.syntax import check_name

    name = Path(arg).stem if arg.endswith(".toml") else arg
    check_name(name, "matrix")
    return name


def report_run(results: Path, matrix: str | None, spec: str | None,
               usage: str = "orchestrate report MATRIX[:RUN], or --run MATRIX:RUN"
               ) -> tuple[str, str | None]:
    """The matrix and run id (None: the newest) that ``report [MATRIX] [--run SPEC]`` names:
    the run-name grammar of ``compare`` and ``history`` (``MATRIX:RUN``, ``latest~N``, a
    prefix), the matrix from the positional argument, else the run's ``MATRIX:``, else the one
    matrix with runs under ``results``. ``usage``: how the command names a matrix, in the
    message that asks for one."""
    from orchestrator.results.folders.run_folder import matrices_with_runs

    if matrix and ":" in matrix:  # report MATRIX:RUN, as publish, logs and compare name a run
        if spec is not None:
            raise ConfigError(f"{matrix} names a run and so does --run {spec}: give one of "
                              "them", field="--run")
        matrix, spec = None, matrix
    name = matrix_name(matrix) if matrix else None
    if spec is not None and ":" in spec:
        qualified = _matrix_of(spec)
        spec = spec.rpartition(":")[2] or None
        if name and qualified and qualified != name:
            raise ConfigError(f"{qualified}:{spec or ''} is a run of {qualified}, not of "
                              f"{name}; give one of them", field="--run")
        name = name or qualified or None
    if name is None:
        names = matrices_with_runs(results)
        if len(names) != 1:
            which = f" (runs of {', '.join(names)})" if names else f" (no runs under {results})"
            raise ConfigError(f"say which matrix: {usage}{which}", field="matrix")
        name = names[0]
    return name, spec


def _matrix_of(spec: str) -> str:
    """The MATRIX of a ``MATRIX:RUN`` run argument ('' when it has none), checked: it names a
    folder under the results, never one elsewhere (``../x:latest``)."""
    from orchestrator.config.syntax import check_name

    name = spec.rpartition(":")[0]
    return check_name(name, "run") if name else name


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([dhm])$")


def parse_when(text: str | None, option: str, now: float | None = None) -> float | None:
    """A UTC date/time or an age (``7d``, ``12h``, ``30m``) as a timestamp."""
    if text is None:
        return None
    raw = text.strip()
    age = _AGE.match(raw)
    if age:
        unit = {"d": 86400.0, "h": 3600.0, "m": 60.0}[age.group(2)]
        return (now if now is not None else time.time()) - float(age.group(1)) * unit
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M",
                "%Y-%m-%d %H:%M:%S"):
        try:
            return float(calendar.timegm(time.strptime(raw.rstrip("Z"), fmt)))
        except ValueError:
            continue
    raise ConfigError(f"{text!r}: expected YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC) or an age "
                      "such as 7d, 12h, 30m", field=option)


def percent(text: str, option: str) -> float:
    from orchestrator.config.syntax import parse_percent

    try:
        return parse_percent(text)
    except ValueError as exc:
        raise ConfigError(str(exc), field=option) from None


def open_results(results: Path, matrices: list[str] | None = None, reindex: bool = False
                 ) -> Store:
    """The store of ``results``, refreshed; its note (fallback location) on stderr."""
    from orchestrator.results.folders.store import open_store

    store = open_store(results, matrices, refresh=not reindex)
    if reindex:
        store.rebuild()
    if store.note:
        print(f"note: {store.note}", file=sys.stderr)
    return store


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}"


# --- runs --------------------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    from orchestrator.results.folders.run_folder import no_runs

    args.results = results_root(args.results)
    from tabulate import tabulate

    from orchestrator.results.reports.export import iso

    name = matrix_name(args.matrix) if args.matrix else None
    since = parse_when(args.since, "--since")
    until = parse_when(args.until, "--until")
    if args.last is not None and args.last < 1:
        raise ConfigError("must be at least 1", field="--last")
    with open_results(args.results, [name] if name else None, args.reindex) as store, \
            store.snapshot():
        runs = store.runs(matrix=name, since=since, until=until, status=args.status)
    if args.last:
        runs = runs[-args.last:]
    if args.json:
        print(json.dumps([r.to_json() for r in runs], indent=1))
        return 0
    if not runs:
        print(f"({no_runs(args.results, name) if name else f'no runs under {args.results}'})")
        return 0
    rows = [[iso(r.started_at).replace("T", " ").rstrip("Z"), r.matrix, r.run_id,
             r.backend or "", r.status, r.ok, r.failed,
             f"{r.to_run} to run" if r.status == "running" and r.to_run else r.missing,
             _duration(r.duration_s),
             (r.git_revision or "")[:10]] for r in runs]
    headers = ["started (UTC)", "matrix", "run", "backend", "status", "ok", "failed",
               "missing", "duration", "revision"]
    if any(r.lock_wait_s for r in runs):  # kept out of the duration: the cells' own time
        headers.insert(headers.index("duration") + 1, "lock wait")
        for row, run in zip(rows, runs, strict=True):
            row.insert(headers.index("lock wait"),
                       _duration(run.lock_wait_s) if run.lock_wait_s else "")
    if any(r.slurm_jobs for r in runs):  # where to look with sacct -j
        headers.append("slurm jobs")
        for row, run in zip(rows, runs, strict=True):
            row.append(_job_ids(run.slurm_jobs))
    print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
    if any(r.lock_wait_s for r in runs):
        print("\nduration: the run's time without its lock waits (waiting for another sweep's "
              "GPUs or CPU), shown apart")
    for run in runs:
        if run.status == "running":
            print(f"running: {run.label} ({run.live})")
    return 0


def _job_ids(jobs: Sequence[str], shown: int = 3) -> str:
    """A run's Slurm job and array ids, the first ``shown`` of them and how many more."""
    more = f" +{len(jobs) - shown}" if len(jobs) > shown else ""
    return ",".join(jobs[:shown]) + more


# --- report ------------------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    args.results = results_root(args.results)
    from orchestrator.results.folders.run_folder import find_run
    from orchestrator.results.folders.store import live_holder
    from orchestrator.results.reports.summary import load_line, summarize_run, write_summary_files

    name, run = report_run(args.results, args.matrix, args.run)
    plot_file(args.plot)
    paths = find_run(args.results, name, run)
    live = live_holder(paths.root)
    results = paths.results()
    rows, table = summarize_run(paths, baseline=args.baseline, results=results)
    if args.baseline:
        _check_baseline(args.baseline, rows)
    if live and not rows:
        table = "(no cell has ended yet)"
    print(f"{paths.root}\n{table}")
    load = load_line(paths.meta_data().get("load"))
    if load:
        print(load)
    if live:  # the sweep writes the summary files when it ends
        for line in live_lines(paths, name, live, results):
            print(line)
    else:
        try:
            write_summary_files(paths, rows, table)
        except OSError as exc:  # a read-only archive: the table above is all we can give
            sys.stdout.flush()
            print(f"note: {paths.summary_csv.name} and {paths.summary_txt.name} not refreshed "
                  f"in {paths.root}: {exc.strerror or exc}", file=sys.stderr)
    if args.plot:
        from orchestrator.results.folders.run_folder import read_json
        from orchestrator.results.reports.plots import plot_run, stack_line
        from orchestrator.results.reports.report_html import repeats_of, stacks_of

        repeats = repeats_of(results) or (read_json(paths.plan).get("repeats")
                                          if paths.plan.exists() else None)
        subtitle = stack_line(stacks_of(results), repeats)
        with writing("--plot", args.plot):
            out = plot_run(rows, args.plot, f"{name} {paths.run_id}", subtitle)
        print(f"plot: {out}")
    if args.html:
        from orchestrator.results.reports import report_html

        html = report_html.run_report(paths, rows, results, baseline=args.baseline)
        with writing("--html", args.html):
            out = report_html.write(args.html, html)
        print(f"html: {out}")
    return 0




def live_lines(paths: Any, matrix: str, holder: str, results: Sequence[Any]) -> list[str]:
    """What ``report`` says under the table of a run a sweep works in now: that it is live,
    how many cells have ended, which run now and how to follow one."""
    from orchestrator.results.folders.cell_logs import cell_ids

    plan = paths.plan_data() or {}
    planned = [c.get("id") for c in plan.get("cells") or [] if isinstance(c, dict)]
    ended = {r.cell_id for r in results}
    running = [c for c in cell_ids(paths)
               if paths.cell_log(c).exists() and c not in ended]
    lines = [f"\nlive: run {paths.run_id} is still running ({holder}): "
             f"{len(ended & set(planned))} of {len(planned)} cells ended so far; the table "
             "shows those"]
    if running:
        shown = ", ".join(running[:6]) + (" ..." if len(running) > 6 else "")
        lines.append(f"running now: {shown} (follow one: orchestrate logs "
                     f"{matrix}:{paths.run_id} {running[0]} --follow)")
    return lines


def cmd_logs(args: argparse.Namespace) -> int:
    args.results = results_root(args.results)
    from orchestrator.results.folders.cell_logs import Follower, resolve_cell
    from orchestrator.results.folders.run_folder import find_run

    if args.tail is not None and args.tail < 0:
        raise ConfigError("must be 0 or more", field="--tail")
    spec = args.run
    name, run = report_run(args.results, None, spec) if ":" in spec else (
        matrix_name(spec), None)
    paths = find_run(args.results, name, run)
    cell = resolve_cell(paths, args.cell)
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    def say(text: str) -> None:
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)

    follower = Follower(paths, cell, write, say)
    try:
        if not args.follow:
            if not follower.show(args.tail):
                raise ConfigError(f"cell {cell} of run {name}:{paths.run_id} has no log yet "
                                  "(not started; --follow waits for it)", field="CELL")
            return 0
        ended = follower.follow(args.tail)
    finally:
        follower.close()
    say(f"cell {cell}: {ended}")
    return 0


def _unknown_parameter(source: str, key: str) -> Problem | None:
    """The problem of ``key`` when it is no cell parameter (with the nearest name), else None.

    Imports the matrix models only when called: ``export`` without ``--where`` never needs them.
    """
    import difflib

    from orchestrator.config.matrix_file import PARAM_NAMES

    if key in PARAM_NAMES:
        return None
    close = difflib.get_close_matches(key, PARAM_NAMES, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?; " if close else ""
    return Problem(source, key, f"unknown parameter ({hint}known: {', '.join(PARAM_NAMES)})")


def _check_baseline(text: str, rows: list[Any]) -> None:
    """``--baseline KEY=VALUE`` must name a parameter and a value some row of the run has (a
    typo would otherwise print the table without its ratio column, silently)."""
    from orchestrator.config.syntax import param_matches, parse_baseline

    key, value = parse_baseline(text) or ("", "")
    unknown = _unknown_parameter("--baseline", key)
    if unknown:
        raise ConfigError([unknown])
    if not any(param_matches(r.params.get(key), value) for r in rows):
        found = sorted({str(r.params.get(key)) for r in rows})
        raise ConfigError([Problem("--baseline", text, f"no row of this run has {key} = "
                                   f"{value!r} (it has: {', '.join(found)})")])


# --- compare -----------------------------------------------------------------------------------


def cmd_compare(args: argparse.Namespace) -> int:
    args.results = results_root(args.results)
    from orchestrator.results.reports.compare import (
        compare_runs,
        render_compare,
        render_compare_csv,
    )

    confidence = percent(args.confidence, "--confidence")
    threshold = percent(args.threshold, "--threshold")
    if not 0.5 <= confidence < 1:
        raise ConfigError("must be from 50% to below 100%", field="--confidence")
    matrix = matrix_name(args.matrix) if args.matrix else None
    names = {_matrix_of(s) for s in (args.run_a, args.run_b) if ":" in s} | (
        {matrix} if matrix else set())
    with open_results(args.results, sorted(names) if names and "" not in names else None
                      ) as store, store.snapshot():
        # an unqualified run (latest~1, a prefix) is one of the other run's matrix
        a = store.resolve(args.run_a, matrix or _matrix_of(args.run_b) or None)
        b = store.resolve(args.run_b, matrix or a.matrix)
        if a.pk == b.pk and not args.allow_same:
            raise ConfigError(f"{args.run_a!r} and {args.run_b!r} are both run {a.matrix}:"
                              f"{a.run_id}: a run compared with itself shows no change; give "
                              "two runs (`orchestrate runs` lists them), or --allow-same",
                              field="RUN_B")
        from orchestrator.results.folders.store import is_throughput

        if args.metric and not is_throughput(args.metric):
            raise ConfigError(f"{args.metric!r}: compare needs a throughput figure (higher is "
                              "better), e.g. train.total_ips", field="--metric")
        comp = compare_runs(store, a, b, confidence, threshold, args.metric, raw=args.raw)
    if args.json:
        print(json.dumps(comp.to_json(), indent=1))
    elif args.csv:
        sys.stdout.write(render_compare_csv(comp))
    else:
        print(render_compare(comp))
    if args.html:
        from orchestrator.results.reports import report_html

        with writing("--html", args.html):
            out = report_html.write(args.html, report_html.compare_report(comp))
        print(f"html: {out}", file=sys.stderr if args.json or args.csv else sys.stdout)
    return 0


# --- history -----------------------------------------------------------------------------------


def _references(args: argparse.Namespace, source: str | None) -> tuple[list[Any], str | None]:
    """The references to check and their file: --references, else next to the matrix file
    (the argument when it is a path, else the newest run's ``plan.json`` source)."""
    from orchestrator.config.references import load_references, references_next_to

    if args.no_references:
        return [], None
    if args.references:
        return load_references(args.references), str(args.references)
    candidates = []
    if args.matrix.endswith(".toml"):
        candidates.append(references_next_to(Path(args.matrix)))
    if source:
        candidates.append(references_next_to(Path(source)))
    for path in candidates:
        if path.is_file():
            return load_references(path), str(path)
    return [], None


def _plan_source(run_path: str) -> str | None:
    from orchestrator.results.folders.run_folder import RunPaths, read_json

    try:
        return read_json(RunPaths(Path(run_path)).plan).get("source")
    except (OSError, ValueError):
        return None


def cmd_history(args: argparse.Namespace) -> int:
    from orchestrator.results.folders.run_folder import no_runs

    args.results = results_root(args.results)
    from orchestrator.results.reports.history import Options, analyze, render_history

    name = matrix_name(args.matrix)
    plot_file(args.plot)
    options = Options(window=args.window, min_history=args.min_history,
                      threshold=percent(args.threshold, "--threshold"), alpha=args.alpha,
                      ignore_stack=tuple(args.ignore_stack), metric=args.metric, raw=args.raw,
                      allow_dropped=args.allow_dropped)
    options.validate()
    if args.last < 1:
        raise ConfigError([Problem("", "--last", "must be at least 1")])
    with open_results(args.results, [name]) as store, store.snapshot():
        if not store.runs(matrix=name):
            raise ConfigError(no_runs(args.results, name), field="history")
        run = store.resolve(args.run, name) if args.run else None
        newest = run or store.runs(matrix=name)[-1]
        refs, ref_file = _references(args, _plan_source(newest.path))
        report = analyze(store, name, options, run=newest, shown=args.last, references=refs,
                         references_file=ref_file)
    failing = report.failing
    if args.json:
        print(json.dumps(report.to_json(), indent=1, default=str))
    else:
        print(render_history(report))
        counts = ", ".join(f"{n} {v}" for v, n in sorted(report.counts().items()))
        print(f"\n{len(report.lines)} configuration(s) in {report.newest.run_id}: {counts}")
        if failing:
            print(f"{len(failing)} configuration(s) failing: "
                  + ", ".join(ln.label for ln in failing[:10])
                  + (" ..." if len(failing) > 10 else ""))
    if args.plot:
        from orchestrator.results.reports.plots import plot_history

        with writing("--plot", args.plot):
            out = plot_history(report, args.plot, name)
        print(f"plot: {out}", file=sys.stderr if args.json else sys.stdout)
    return 1 if failing and args.fail_on_regression else 0


# --- export ------------------------------------------------------------------------------------


def _where(items: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``--where KEY=VALUE`` items by key; a key that is no cell parameter is refused (a typo
    would otherwise export nothing, silently)."""
    out: dict[str, list[str]] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(Problem("", "--where", f"{item!r}: expected KEY=VALUE"))
            continue
        unknown = _unknown_parameter("--where", key.strip())
        if unknown:
            problems.append(unknown)
            continue
        out.setdefault(key.strip(), []).append(value.strip())
    if problems:
        raise ConfigError(problems)
    return tuple((k, tuple(v)) for k, v in out.items())


def cmd_export(args: argparse.Namespace) -> int:
    from orchestrator.results.folders.run_folder import no_runs

    args.results = results_root(args.results)
    from orchestrator.results.reports import export

    names = [matrix_name(m) for m in args.matrices]
    since = parse_when(args.since, "--since")
    until = parse_when(args.until, "--until")
    selection = export.Selection(where=_where(args.where), figures=tuple(args.figure),
                                 statuses=tuple(args.status))
    with open_results(args.results, names or None) as store, store.snapshot():
        runs = []
        for name in names or [None]:  # type: ignore[list-item]  # None: every matrix
            runs += store.runs(matrix=name, since=since, until=until)
        if args.run:
            wanted = {store.resolve(spec, names[0] if len(names) == 1 else None).pk
                      for spec in args.run}
            runs = [r for r in runs if r.pk in wanted] if names or since or until else [
                r for r in store.runs() if r.pk in wanted]
        runs.sort(key=lambda r: (r.started_at or 0, r.run_id))
        write = export.write_csv if args.format == "csv" else export.write_json
        if args.out:
            from orchestrator.results.folders.run_folder import replacing

            with writing("--out", args.out), replacing(args.out) as fh:
                n = write(store, runs, selection, fh)
            print(f"{n} rows from {len(runs)} run(s): {args.out}", file=sys.stderr)
        else:
            n = write(store, runs, selection, sys.stdout)
    if n == 0:  # say why on stderr (a misspelt matrix, figure or status gives no rows)
        sys.stdout.flush()
        why = ("; ".join(no_runs(args.results, m) for m in names) if names
               else f"no runs under {args.results}") if not runs else (
            f"{len(runs)} run(s) selected, but no cell result matches --where/--figure/--status")
        print(f"note: nothing exported: {why} (`orchestrate runs` lists the runs)",
              file=sys.stderr)
    return 0
