"""The command line: ``orchestrate COMMAND``; argument parsing and output, nothing else.

:mod:`~orchestrator.cli.app` is the entry point (logging, signals, the exit status, one clean
message for every :class:`~orchestrator.errors.OrchestratorError`); each ``*_commands`` module
adds a group of commands and is imported only when one of its commands runs (fast start-up).

May import: errors, config, catalog, plan, results, local, remote, images, backends, sweep, publish.
"""

from orchestrator.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
