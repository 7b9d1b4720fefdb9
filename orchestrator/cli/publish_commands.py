"""``orchestrate publish``: a run to an MLflow tracking server and/or an HTTP collector
(:mod:`orchestrator.publish`); and the publish that ends a sweep or an import when
``[publish] after_sweep`` says so (:func:`after_run`).

``orchestrate publish`` exits 0 when every target has the run, 1 when one is down, slow or
refuses (one ``error:`` line each; the run folder is intact and the command can be repeated),
2 for invalid input. After a sweep or an import, a target that fails is one ``warning:`` line
and the command's exit status is the sweep's own.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli import options
from orchestrator.config.defaults import results_root

if TYPE_CHECKING:
    from orchestrator.results.folders.run_folder import RunPaths

log = logging.getLogger(__name__)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0 or value > 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: give more than 0 and at most 3600 seconds")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish", help="publish a run to an MLflow tracking server and/or an HTTP collector",
        description="Publish a run (default: the newest of MATRIX) to MLflow (one experiment "
        "per matrix, a parent run per sweep, a child run per cell: params, figures, step "
        "series, tags, artifacts) and/or an HTTP collector (one JSON document per cell). "
        "Publishing again sends only what changed. Targets: the flags, else [publish] of the "
        "run's matrix, else of the user's config file, else $MLFLOW_TRACKING_URI. Credentials "
        "come from the environment only: MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/"
        "PASSWORD, ORCHESTRATE_HTTP_HEADER_<NAME> for the collector.")
    p.add_argument("run", nargs="?", metavar="MATRIX[:RUN]",
                   help="a matrix (name or path to its .toml: its newest run) or MATRIX:RUN (a "
                   "run id, a unique prefix, latest~N); default: the one matrix under the "
                   "results")
    p.add_argument("--mlflow", metavar="URI", help="MLflow tracking server (http[s]://...)")
    p.add_argument("--http", metavar="URL", help="HTTP collector: one JSON POST per cell")
    p.add_argument("--experiment", metavar="NAME",
                   help="MLflow experiment (default: [publish] experiment, else the matrix name)")
    options.results(p)
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="seconds a request may take before the target counts as down "
                   "(default: [publish] timeout_s, else 30)")
    p.set_defaults(handler=cmd_publish)


def cmd_publish(args: argparse.Namespace) -> int:
    from orchestrator.cli.result_commands import report_run
    from orchestrator.config.defaults import load_user_config
    from orchestrator.config.publish import resolve, run_settings
    from orchestrator.errors import ConfigError
    from orchestrator.publish.publisher import publish_run
    from orchestrator.results.folders.run_folder import find_run

    explicit_results = args.results is not None
    args.results = results_root(args.results)
    spec = args.run
    usage = "orchestrate publish MATRIX[:RUN]"
    name, run = (report_run(args.results, None, spec, usage) if spec and ":" in spec
                 else report_run(args.results, spec, None, usage))
    paths = find_run(args.results, name, run)
    user, _ = load_user_config()
    targets = resolve(run_settings(paths.matrix_file), user.publish, mlflow=args.mlflow,
                      http=args.http, experiment=args.experiment, timeout_s=args.timeout)
    if not targets:
        raise ConfigError("no target: give --mlflow URI and/or --http URL, or [publish] mlflow "
                          "/ http in the matrix or in the user's config file", field="publish")
    outcomes = publish_run(paths, targets)
    failed = False
    for outcome in outcomes:
        if outcome.ok:
            print(outcome.line())
        else:
            failed = True
            sys.stdout.flush()
            print(f"error: {outcome.line()}", file=sys.stderr)
    if failed:
        print(f"the run folder is intact ({paths.root}); publish again when the target answers: "
              f"{again_command(paths, args.results if explicit_results else None)}",
              file=sys.stderr)
    return 1 if failed else 0


def again_command(paths: RunPaths, results: Path | None = None) -> str:
    """The command that publishes the run again (``--results`` where it was given)."""
    import shlex

    words = ["orchestrate", "publish", f"{paths.root.parent.name}:{paths.run_id}"]
    if results is not None:
        words += ["--results", str(results)]
    return shlex.join(words)


def after_run(paths: RunPaths, results: Path | None = None, *, skip: bool = False) -> None:
    """The publish that ends a sweep or an import, when ``[publish] after_sweep`` (the run's
    matrix, else the user's config file) says so: one line per target; nothing it meets
    (a target down, an invalid setting, a bug) changes the caller's exit status. ``results``:
    the ``--results`` the command was given (for the line saying how to publish later)."""
    if skip:
        return
    again = again_command(paths, results)
    try:
        _after_run(paths, again)
    except Exception as exc:  # the sweep's results and status come first
        from orchestrator.errors import OrchestratorError

        what = str(exc) if isinstance(exc, OrchestratorError) else (
            f"{type(exc).__name__}: {exc} (a bug: `orchestrate publish` shows its traceback)")
        sys.stdout.flush()
        print(f"warning: not published: {what}; the results are intact: `{again}` publishes "
              "them later", file=sys.stderr)


def _after_run(paths: RunPaths, again: str) -> None:
    from orchestrator.config.defaults import load_user_config
    from orchestrator.config.publish import after_sweep, resolve, run_settings

    user, _ = load_user_config()
    mine = run_settings(paths.matrix_file)
    if not after_sweep(mine, user.publish):
        return
    from orchestrator.publish.publisher import publish_run  # only when it publishes (~35 ms)

    targets = resolve(mine, user.publish)
    if not targets:
        print("warning: [publish] after_sweep is set but names no target (mlflow, http); "
              "nothing published", file=sys.stderr)
        return
    for outcome in publish_run(paths, targets):
        if outcome.ok:
            print(outcome.line())
        else:
            sys.stdout.flush()
            print(f"warning: {outcome.line()}; the results are intact: `{again}` publishes "
                  "them later", file=sys.stderr)
