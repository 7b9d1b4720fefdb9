"""Command-line entry point: ``orchestrate``.

Each command group lives in its own module under :mod:`orchestrator.commands` and exposes
``register(subparsers)``; a handler takes the parsed arguments and returns an exit code.
The CLI catches :class:`~orchestrator.errors.OrchestratorError` only, prints its message and exits
with its code; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from orchestrator import __version__
from orchestrator.errors import OrchestratorError

#: Modules under orchestrator.commands, each adding its subcommands, in --help order.
COMMAND_MODULES = ("sweep", "results", "images", "hosts", "maintenance")
#: Which module owns each top-level command: running one imports only its module (fast start-up;
#: `orchestrate plan` never imports paramiko or jinja2).
COMMAND_OWNERS = {
    "matrix": "sweep", "plan": "sweep", "validate": "sweep", "schema": "sweep",
    "runs": "results", "report": "results", "compare": "results", "history": "results",
    "export": "results",
    "images": "images", "hosts": "hosts", "clean": "maintenance", "backends": "maintenance",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` naming a known command, only that command's module is loaded."""
    first = next((a for a in (argv or []) if not a.startswith("-")), None)
    modules = (COMMAND_OWNERS[first],) if first in COMMAND_OWNERS else COMMAND_MODULES
    parser = argparse.ArgumentParser(
        prog="orchestrate",
        description="Run GPU benchmark experiment matrices: locally, in Docker, over SSH.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in modules:
        try:
            module = importlib.import_module(f"orchestrator.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"orchestrator.commands.{name}":
                continue  # command group not present in this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
