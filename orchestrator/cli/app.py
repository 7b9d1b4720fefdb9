"""Command-line entry point: ``orchestrate``.

Each command group lives in its own module of this package (``orchestrator/cli/<name>_commands.py``,
listed in :data:`COMMAND_MODULES`) and exposes ``register(subparsers)``; a handler takes the
parsed arguments and returns an exit code. An option several commands take is declared once,
in :mod:`orchestrator.cli.options`.
The CLI catches :class:`~orchestrator.errors.OrchestratorError` only, prints its message and exits
with its code; anything else is a bug and keeps its traceback.

Output rules: log records go to stderr as ``warning: ...`` lines (``-q``: errors only; ``-v``:
also info, and the warnings libraries raise, which are hidden otherwise; ``-vv``: debug).
Output piped into a program that stops reading (``| head``) ends quietly with exit status 141,
as other Unix tools do. ``kill -USR1 PID`` of a running ``orchestrate`` prints every thread's
Python stack on stderr and lets it go on: what a lab engineer (or a test that timed out) sends
a sweep that seems stuck.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from orchestrator import __version__
from orchestrator.errors import OrchestratorError, StopSignal

#: Modules of this package (``<name>_commands``), each adding its subcommands, in --help order.
COMMAND_MODULES = ("sweep", "result", "import", "publish", "image", "host", "maintenance")
#: Which module owns each top-level command: running one imports only its module (fast start-up;
#: `orchestrate plan` never imports paramiko; jinja2 only to resolve a profile's base image).
COMMAND_OWNERS = {
    "matrix": "sweep", "plan": "sweep", "validate": "sweep", "schema": "sweep",
    "runs": "result", "report": "result", "logs": "result", "compare": "result",
    "history": "result",
    "export": "result", "import": "import", "publish": "publish",
    "images": "image", "hosts": "host", "clean": "maintenance", "backends": "maintenance",
}
#: Exit status after a broken pipe: 128 + SIGPIPE, what a shell reports for such a tool.
EXIT_BROKEN_PIPE = 141


#: Words a user types for what a command does, that name no command: ``run`` (which
#: ``runs`` is nearest to) most likely means a sweep.
COMMAND_WORDS = {word: "matrix" for word in (
    "run", "sweep", "start", "launch", "exec", "execute", "submit", "bench", "benchmark")}


class _Parser(argparse.ArgumentParser):
    """argparse, with the nearest name for a misspelt command (``mtrix``: did you mean
    ``matrix``?) and option (``--dryrun``: did you mean ``--dry-run``?), as git does, and the
    command a word for what it does means (``run``: ``matrix``, which runs a sweep, or ``runs``,
    which lists them); the subcommands' own parsers are of this class too."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        import re

        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if found:
            message += self._command_hint(found.group(1), re.findall(r"'([^']*)'",
                                                                      found.group(2)))
        unknown = re.search(r"unrecognized arguments: (.*)$", message)
        if unknown:
            message += self._option_hint(unknown.group(1).split())
        super().error(message)

    def _command_hint(self, word: str, choices: list[str]) -> str:
        import difflib

        meant = [c for c in (COMMAND_WORDS.get(word.lower()),) if c in choices]
        meant += [c for c in difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
                  if c not in meant]
        if not meant:
            return ""
        if len(meant) == 1 and word.lower() not in COMMAND_WORDS:
            return f"; did you mean {meant[0]!r}?"
        helps = _choice_helps(self)
        return "; did you mean " + " or ".join(
            f"{c!r} ({helps[c]})" if helps.get(c) else repr(c) for c in meant) + "?"

    def _option_hint(self, words: list[str]) -> str:
        """``; did you mean --dry-run?`` for each unknown ``--option`` near one of the
        command's (the parser of the command ``_words`` names, and this one's)."""
        import difflib

        parser = _command_parser(self, getattr(self, "_words", []))
        known = sorted({o for p in {parser, self} for a in p._actions for o in a.option_strings
                        if o.startswith("--")})
        plain = {_squashed(o): o for o in known}
        hints = []
        for word in words:
            flag = word.partition("=")[0]
            if not flag.startswith("--"):
                continue
            close = ([plain[_squashed(flag)]] if _squashed(flag) in plain else
                     difflib.get_close_matches(flag, known, n=1, cutoff=0.75))
            if close:
                hints.append(close[0] + (f" (for {flag})" if len(words) > 1 else ""))
        return f"; did you mean {', '.join(hints)}?" if hints else ""


def _squashed(flag: str) -> str:
    """An option without its dashes and underscores (``--dryrun``, ``--dry_run``: ``dryrun``)."""
    return flag.lstrip("-").replace("-", "").replace("_", "").lower()


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _choice_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help (``runs``: list runs ...)."""
    sub = _subcommands(parser)
    return {a.dest: str(a.help or "") for a in sub._choices_actions} if sub else {}


def _command_parser(parser: argparse.ArgumentParser, words: Sequence[str]
                    ) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``words`` name (``images build ...``: ``build``'s)."""
    for word in words:
        sub = _subcommands(parser)
        if sub is None:
            break
        if word in sub.choices:
            parser = sub.choices[word]
    return parser


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` naming a known command, only that command's module is loaded."""
    first = next((a for a in (argv or []) if not a.startswith("-")), None)
    modules: tuple[str, ...] = (
        (COMMAND_OWNERS[first],) if first in COMMAND_OWNERS else COMMAND_MODULES)
    if first is None and _version_only(argv or []):
        modules = ()  # argparse prints the version and exits before it needs a command
    parser = _Parser(
        prog="orchestrate",
        description="Run GPU benchmark experiment matrices: locally, in Docker, over SSH or as "
        "Slurm jobs.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrate {__version__}")
    noise = parser.add_mutually_exclusive_group()
    noise.add_argument("-v", "--verbose", action="count", default=0,
                       help="more detail on stderr (-vv: debug); shows library warnings")
    noise.add_argument("-q", "--quiet", action="store_true", help="only errors on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in modules:
        try:
            module = importlib.import_module(f"orchestrator.cli.{name}_commands")
        except ModuleNotFoundError as exc:
            if exc.name == f"orchestrator.cli.{name}_commands":
                continue  # command group not present in this build
            raise
        module.register(sub)
    return parser


def _version_only(argv: Sequence[str]) -> bool:
    """``--version`` without a help flag (``-h``, ``--help`` or an abbreviation of it)."""
    asks_help = any(a.startswith("--h") or (a[:1] == "-" and a[1:2] != "-" and "h" in a)
                    for a in argv)
    return "--version" in argv and not asks_help


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (tests swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.setStream(sys.stderr)
        super().emit(record)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        if record.name == "py.warnings":  # "file:line: Category: text" and the source line
            message = message.strip().splitlines()[0]
        return f"{record.levelname.lower()}: {message}"


class LogSetup:
    """Log records and Python warnings to stderr for one :func:`main` call (undone after it)."""

    def __init__(self, verbosity: int = 0, quiet: bool = False) -> None:
        self.handler = _StderrHandler()
        self.handler.setFormatter(_Formatter())
        self.root = logging.getLogger()
        self.warnings_logger = logging.getLogger("py.warnings")
        # paramiko logs a failed handshake with its traceback from its transport thread; the
        # command reports the same failure as a HostError in words (-vv shows paramiko's own)
        self.paramiko_logger = logging.getLogger("paramiko")
        self._saved = (self.root.level, self.warnings_logger.level, self.paramiko_logger.level)
        self.root.addHandler(self.handler)
        logging.captureWarnings(True)
        self.set(verbosity, quiet)

    def set(self, verbosity: int, quiet: bool) -> None:
        """-q: errors only; default: warnings; -v: info and library warnings; -vv: debug."""
        level = logging.ERROR if quiet else (
            logging.WARNING, logging.INFO, logging.DEBUG)[min(verbosity, 2)]
        self.handler.setLevel(level)
        if level < self.root.getEffectiveLevel():
            self.root.setLevel(level)
        # library warnings (deprecations inside paramiko, docker, torch) are not the user's
        self.warnings_logger.setLevel(logging.WARNING if verbosity else logging.CRITICAL)
        self.paramiko_logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.CRITICAL + 1)

    def close(self) -> None:
        logging.captureWarnings(False)
        self.root.removeHandler(self.handler)
        self.root.setLevel(self._saved[0])
        self.warnings_logger.setLevel(self._saved[1])
        self.paramiko_logger.setLevel(self._saved[2])


def _early_flags(argv: Sequence[str]) -> tuple[int, bool]:
    """-v/-q before the command word: logging is set up before any command module is imported
    (an import may warn)."""
    verbosity, quiet = 0, False
    for arg in argv:
        if not arg.startswith("-"):
            break
        if arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--verbose" or (arg.startswith("-v") and set(arg[1:]) == {"v"}):
            verbosity += 1 if arg == "--verbose" else len(arg) - 1
    return verbosity, quiet


def main(argv: Sequence[str] | None = None) -> int:
    own_process = argv is None  # not a test calling main in-process
    if not own_process:
        return _run(list(argv or []), own_process)
    _stacks_on_sigusr1()
    _stop_signals_interrupt()
    try:
        return _run(sys.argv[1:], own_process)
    except KeyboardInterrupt:  # the first stop signal, between the command's end and here
        return 130
    finally:  # the status is decided: a signal from here on must not kill the exiting process
        STOPS.armed = False  # (Python resets its handlers to the default on the way out; an
        _ignore_stop_signals()  # ignored signal stays ignored)


def _run(argv: list[str], own_process: bool) -> int:
    logs = LogSetup(*_early_flags(argv))
    try:
        parser = build_parser(argv)  # imports the command's module (a signal waits: see STOPS)
        args = parser.parse_args(argv)
        args.own_process = own_process
        logs.set(args.verbose, args.quiet)
        if own_process:
            STOPS.arm()
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return 130 if own_process and STOPS.signum is not None else code
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except BaseException:
        if not own_process or STOPS.signum is None:
            raise
        # what a stop signal broke on its way (an import it cut short, a library's cleanup)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        logs.close()


#: The signals that stop a command (a sweep: :data:`~orchestrator.cli.sweep_commands.
#: STOP_SIGNALS`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stops:
    """What stop signals came to this process, and the handler that unwinds a command for the
    first: :class:`~orchestrator.errors.StopSignal` (a KeyboardInterrupt), once, and only
    while ``armed``, i.e. while the command runs: not while Python imports the command's
    modules (an exception raised inside a compiled extension's start-up breaks it for good)
    nor once the exit status is decided. A signal that came before the command started makes
    it stop at once when it is armed; a sweep takes over with handlers of its own and notes
    its signals here too (:meth:`note`), so any of them makes the exit status 130."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False

    def note(self, signum: int) -> bool:
        """Note a stop signal; whether it is the first."""
        first = self.signum is None
        if first:
            self.signum = signum
        return first

    def arm(self) -> None:
        """The command starts: from now on the first stop unwinds it (at once if it came)."""
        self.armed = True
        if self.signum is not None:
            raise StopSignal

    def __call__(self, signum: int, frame: object) -> None:
        if self.note(signum) and self.armed:
            raise StopSignal


#: This process's stop signals (:func:`main` installs it, in a process of its own).
STOPS = _Stops()


def _stop_signals_interrupt() -> None:
    """SIGINT, SIGTERM and SIGHUP (each unless ignored: nohup, a script's background job)
    stop every command as Ctrl-C does, once: one line, exit 130, files written atomically left
    whole, instead of the default death; a sweep replaces these with its own
    (:func:`orchestrator.cli.sweep_commands.cmd_matrix`)."""
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, STOPS)


def _ignore_stop_signals() -> None:
    """The process is exiting with its status: the stop signals are ignored from now on."""
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


def _stacks_on_sigusr1() -> None:
    """``kill -USR1`` prints every thread's stack on stderr (the process goes on)."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(ValueError, OSError, RuntimeError):  # no stderr, not main
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)

