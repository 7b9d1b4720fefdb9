"""The options several commands take, each declared once: its flag, type, metavar and action,
and what it means where a command says nothing more. A command adds one with the function of
its name, and passes its own ``help`` where the option means something particular there
(``--results`` of ``clean`` is where ``--run`` is looked up; ``--dry-run`` of each command
says what it shows).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.config.defaults import RESULTS_HELP

#: A parser, or a group of one (mutually exclusive options).
Adds = argparse.ArgumentParser | argparse._ArgumentGroup

HOSTS_HELP = "hosts inventory for --backend ssh (default: [matrix] hosts)"
ONLY_HELP = "only matching cells (repeatable; same key: any value)"
EXCLUDE_HELP = "leave out the cells with this value (repeatable: each one leaves its cells out)"
SET_HELP = ("set a field of the matrix file, as if the file said it (repeatable; KEY: its dotted "
            "path, e.g. workload.iterations=20 or hardware.v100.container.mounts[0].source=/x; "
            "VALUE: TOML where it parses, else text)")


def matrix_file(p: Adds) -> None:
    """``MATRIX.toml``: the matrix file a command reads."""
    p.add_argument("matrix_file", metavar="MATRIX.toml", type=Path)


def results(p: Adds, help: str = RESULTS_HELP) -> None:
    """``--results DIR``: the results folder (default: the environment's, the config file's,
    ``results/``)."""
    p.add_argument("--results", type=Path, metavar="DIR", help=help)


def hosts(p: Adds, help: str = HOSTS_HELP) -> None:
    """``--hosts HOSTS.toml``: a hosts inventory."""
    p.add_argument("--hosts", type=Path, metavar="HOSTS.toml", help=help)


def backend(p: Adds, doing: str = "") -> None:
    """``--backend NAME``: the backend a sweep would run on (``doing``: what the command does
    for it, ``"plan for this backend: "``)."""
    p.add_argument("--backend", help=f"{doing}{backends_help()} (default: [matrix] backend)")


TARGET_HELP = ("plan for another machine than this one, declared as gpu=MODEL[,gpus=N]"
               "[,driver=VERSION] (gpu=none: no accelerator): its GPUs and driver are checked, "
               "what only it can tell is listed to check there")


def target(p: Adds, help: str = TARGET_HELP) -> None:
    """``--target SPEC``: the machine a plan is for, declared (default: this machine)."""
    p.add_argument("--target", metavar="gpu=MODEL,gpus=N,driver=VERSION", help=help)


def only(p: Adds, help: str = ONLY_HELP) -> None:
    """``--only KEY=VALUE``, repeatable: a selection of the matrix's cells."""
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help=help)


def exclude(p: Adds, help: str = EXCLUDE_HELP) -> None:
    """``--exclude KEY=VALUE``, repeatable: the negative of ``--only`` (its grammar)."""
    p.add_argument("--exclude", action="append", default=[], metavar="KEY=VALUE", help=help)


def set_fields(p: Adds, help: str = SET_HELP) -> None:
    """``--set KEY=VALUE``, repeatable: a field of the matrix file overridden
    (:mod:`orchestrator.config.overrides`). ``images render|build --set`` is another option
    (a template variable), declared there."""
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=help)


def run(p: Adds, help: str, **kwargs: Any) -> None:
    """``--run RUN``: a run (id, a prefix of one, ``MATRIX:RUN``, ``latest``, ...); ``kwargs``:
    e.g. ``action="append"`` where several are taken."""
    p.add_argument("--run", help=help, **kwargs)


def matrix(p: Adds, help: str, **kwargs: Any) -> None:
    """``--matrix NAME``: a matrix by name."""
    p.add_argument("--matrix", help=help, **kwargs)


def dry_run(p: Adds, help: str) -> None:
    """``--dry-run``: show what the command would do, do nothing."""
    p.add_argument("--dry-run", action="store_true", help=help)


def json(p: Adds, help: str) -> None:
    """``--json``: JSON instead of the table."""
    p.add_argument("--json", action="store_true", help=help)


def plot(p: Adds, help: str) -> None:
    """``--plot FILE``: also draw it (png, svg or pdf, by the file's suffix)."""
    p.add_argument("--plot", type=Path, metavar="FILE", help=help)


def html(p: Adds, help: str) -> None:
    """``--html FILE``: also write an HTML report."""
    p.add_argument("--html", type=Path, metavar="FILE", help=help)


def host(p: Adds, help: str) -> None:
    """``--host NAME``, repeatable: only these hosts of the inventory."""
    p.add_argument("--host", action="append", default=None, metavar="NAME", help=help)


def jobs(p: Adds, help: str) -> None:
    """``--jobs N``: hosts at once."""
    p.add_argument("--jobs", type=int, default=8, help=help)


def backends_help() -> str:
    """The backends of this build, for --help ("process, docker, ssh or slurm")."""
    from orchestrator.backends import backend_names
    from orchestrator.config.syntax import words

    return words(backend_names(), "or")


def no_publish(p: Adds, what: str) -> None:
    """``--no-publish``: do not publish ``what`` (a sweep, an imported run) when it ends,
    whatever ``[publish] after_sweep`` says (:mod:`orchestrator.cli.publish_commands`)."""
    p.add_argument("--no-publish", action="store_true",
                   help=f"do not publish {what} when it ends, whatever [publish] after_sweep "
                   "says")
