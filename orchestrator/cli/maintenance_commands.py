"""``orchestrate clean`` and ``orchestrate backends``.

``clean`` removes the containers a crashed sweep left on this machine's engine, never those of a
sweep that still runs: each container names the orchestrator process that started it (host,
pid, the pid's start time); one whose process is alive on this host is skipped, and so is one
started from another host (this machine cannot tell whether it still runs) unless ``--force``.
``--dry-run`` lists what would be removed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli import options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "clean", help="remove containers left behind by a crashed sweep",
        description="Remove every container labelled by orchestrate (or only one run's).",
    )
    options.run(p, "only the containers of this run: a run id, a unique prefix, MATRIX:RUN, "
                "latest or latest~N (as `compare` names runs)")
    options.matrix(p, "only the containers of this matrix")
    options.results(p, "the results folder --run is looked up in (default as `matrix`)")
    options.dry_run(p, "list what would be removed")
    p.add_argument("--force", action="store_true",
                   help="also remove containers started from another host (their sweep may "
                   "still run)")
    p.set_defaults(handler=cmd_clean)

    p = sub.add_parser("backends", help="list the backends and whether each can run here")
    p.set_defaults(handler=cmd_backends)


def _run_label(spec: str, matrix: str | None, results: Path | None) -> tuple[str, str | None]:
    """The run id (and matrix) of ``--run``: resolved in the results as ``compare`` resolves
    runs; a plain run id the results do not hold (its folder removed, its containers left) is
    taken as it is."""
    from orchestrator.cli.result_commands import open_results
    from orchestrator.config.defaults import results_root
    from orchestrator.config.syntax import check_run_id
    from orchestrator.errors import ConfigError, Problem

    named = ":" in spec or spec == "latest" or spec.startswith("latest~")
    root = results_root(results)
    if not named:
        check_run_id(spec, "--run")
        if not root.is_dir():
            return spec, matrix
    try:
        with open_results(root, [matrix] if matrix else None) as store:
            run = store.resolve(spec, matrix)
    except ConfigError as exc:
        if named:
            raise ConfigError([Problem(p.file, "--run", p.message) for p in exc.problems]
                              ) from None
        return spec, matrix
    return run.run_id, matrix or run.matrix


def cmd_clean(args: argparse.Namespace) -> int:
    from orchestrator.config.syntax import check_name, check_run_id

    if args.matrix is not None:
        check_name(args.matrix, "--matrix")
    if args.run is not None:
        args.run, args.matrix = _run_label(args.run, args.matrix, args.results)
        check_run_id(args.run, "--run")
    from orchestrator.local.engine import (
        LABEL_MATRIX,
        LABEL_RUN,
        docker_client,
        leftover_containers,
    )

    labels = {}
    if args.run:
        labels[LABEL_RUN] = args.run
    if args.matrix:
        labels[LABEL_MATRIX] = args.matrix
    client = docker_client()
    removed = found = 0
    try:
        for item in leftover_containers(client, labels):
            found += 1
            what = f"{item.name} (run {item.run}, cell {item.cell})"
            if item.state == "running":
                print(f"skipped {what}: its sweep is still running ({item.controller})")
                continue
            if item.state == "elsewhere" and not args.force:
                print(f"skipped {what}: started by {item.controller} on another host, which "
                      "this machine cannot check; --force removes it")
                continue
            if args.dry_run:
                print(f"would remove {what}")
                continue
            try:
                item.container.remove(force=True)
            except Exception as exc:  # gone meanwhile
                print(f"could not remove {what}: {exc}")
                continue
            print(f"removed {what}")
            removed += 1
    finally:
        client.close()
    if not found:
        which = " and ".join(f"{k} {v}" for k, v in (("run", args.run), ("matrix", args.matrix))
                             if v)
        print("no containers of orchestrate" + (f" for {which}" if which else "")
              + " on this engine: nothing to remove")
    elif not args.dry_run:
        print(f"removed {removed} container{'s' if removed != 1 else ''}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from orchestrator.backends import backend_class, backend_names
    from orchestrator.errors import OrchestratorError

    for name in backend_names():
        try:
            backend_class(name).check_available()
            state = "available"
        except OrchestratorError as exc:
            state = f"unavailable: {exc}"
        print(f"{name:10} {state}")
    return 0
