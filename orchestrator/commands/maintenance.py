"""``orchestrate clean`` and ``orchestrate backends``."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "clean", help="remove containers left behind by a crashed sweep",
        description="Remove every container labelled by orchestrate (or only one run's).",
    )
    p.add_argument("--run", help="only the containers of this run id")
    p.add_argument("--matrix", help="only the containers of this matrix")
    p.set_defaults(handler=cmd_clean)

    p = sub.add_parser("backends", help="list the backends and whether each can run here")
    p.set_defaults(handler=cmd_backends)


def cmd_clean(args: argparse.Namespace) -> int:
    from orchestrator.results import check_name, check_run_id

    if args.run is not None:
        check_run_id(args.run, "--run")
    if args.matrix is not None:
        check_name(args.matrix, "--matrix")
    from orchestrator.engine import (
        LABEL_MATRIX,
        LABEL_RUN,
        docker_client,
        remove_containers,
    )

    labels = {}
    if args.run:
        labels[LABEL_RUN] = args.run
    if args.matrix:
        labels[LABEL_MATRIX] = args.matrix
    client = docker_client()
    try:
        removed = remove_containers(client, labels)
    finally:
        client.close()
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
