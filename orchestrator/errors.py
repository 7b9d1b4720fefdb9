"""One small exception hierarchy.

Everything a user can cause (a bad file, a missing engine, an image that fails to build) is an
:class:`OrchestratorError`; the CLI prints its message and exits non-zero without a traceback.
Anything else is a bug and keeps its traceback.

May import: nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class OrchestratorError(Exception):
    """Root of every error the CLI reports as a clean message."""

    exit_code = 1


@dataclass(frozen=True)
class Problem:
    """One problem found in a user file: where it is and what is wrong."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.file, self.field) if part)
        return f"{where}: {self.message}" if where else self.message


#: A requirement checked where the cells would run and not found there.
MISSING = "missing"
#: A requirement known to fall short for some cells (more GPUs than the target has): those
#: cells would be recorded ``unplaceable``, the others run; the sweep starts (a warning).
SHORT = "short"
#: A requirement that only the machine the cells run on can tell (a lab host's driver, a
#: declared target's files): listed, not checked.
UNCHECKED = "unchecked"


@dataclass(frozen=True)
class Requirement(Problem):
    """What the machine the cells run on must have, as a problem of that machine rather than of
    the file: GPUs of a kind and count, a driver, a Docker engine, a scheduler, a program on
    PATH, a checkout, an image, a data path, an environment variable, a hosts inventory (its
    :attr:`kind`). A matrix that is right everywhere can still lack these here.

    ``state`` :data:`MISSING`: checked, and not there (the sweep would not start: the one
    decision refuses it, exit 3, while ``plan`` and ``--dry-run`` still show the plan);
    :data:`SHORT`: not enough for some cells (a warning); :data:`UNCHECKED`: only that machine
    can tell (shown, never refused). ``cells``: the ids of
    the cells that need it (empty: the decision fills them in from the field)."""

    kind: str = ""
    cells: tuple[str, ...] = ()
    state: str = MISSING


class ConfigError(OrchestratorError):
    """A user file (matrix, hosts, template variables) is invalid. Lists every problem at once."""

    exit_code = 2

    def __init__(self, problems: Sequence[Problem] | str, *, file: str = "", field: str = ""):
        if isinstance(problems, str):
            problems = [Problem(file, field, problems)]
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        lines = [f"{len(self.problems)} problems:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class RequirementsUnmet(ConfigError):
    """The matrix is valid, and the machine its cells would run on lacks what they need (every
    :class:`Requirement` not met, listed at once): exit 3, apart from an invalid file's 2."""

    exit_code = 3


class LogFormatError(ConfigError):
    """A log or raport is malformed: each problem names the file and the line (the first
    :attr:`MAX_LISTED` are listed, the rest counted)."""

    MAX_LISTED = 20

    def __init__(self, problems: list[Problem] | str, *, file: str = "", field: str = ""):
        if isinstance(problems, list) and len(problems) > self.MAX_LISTED:
            more = len(problems) - self.MAX_LISTED
            problems = [*problems[: self.MAX_LISTED],
                        Problem(problems[0].file, "", f"... and {more} more malformed lines")]
        super().__init__(problems, file=file, field=field)


class BuildError(OrchestratorError):
    """An image failed to render or build."""


class LaunchError(OrchestratorError):
    """A cell could not be started at all (as opposed to a cell that ran and failed)."""


class BackendUnavailable(OrchestratorError):
    """The chosen backend cannot run on this machine (no engine, no sshd, no Slurm)."""


class HostError(OrchestratorError):
    """A lab host is unreachable, refused, or its host key is not trusted."""


class HostUnreachable(HostError):
    """The host cannot be reached: refused, no answer, unresolvable, or the connection dropped.

    Unlike a refused host key or login (plain :class:`HostError`, the user must act), another
    host may run the work instead.
    """


class RemoteTimeout(HostError):
    """A remote command did not finish in time; it was killed. Carries the partial output."""

    def __init__(self, message: str, stdout: str = "", stderr: str = ""):
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr


def cannot_write(option: str, path: object, exc: OSError, what: str = "file") -> ConfigError:
    """The error for an output the user named (``--plot``, ``--html``, ``--out``; ``what``:
    ``file`` or ``folder``) that cannot be written: the option, the path and the system's
    reason, one line (exit 2)."""
    if isinstance(exc, IsADirectoryError):
        reason = "it is a folder"
    elif isinstance(exc, FileExistsError | NotADirectoryError):
        reason = "a folder on its path is a file"
    else:
        reason = exc.strerror or str(exc)
    hint = ("a writable folder (created if missing)" if what == "folder"
            else "a writable file (its folder is created if missing)")
    return ConfigError([Problem(option, str(path), f"cannot write it: {reason}; give {hint}")])


class StopSignal(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) unwinding the main thread, raised by the CLI's
    handlers: a KeyboardInterrupt, so every ``except KeyboardInterrupt`` takes it for the Ctrl-C
    it stands for. A class of its own because CPython ends the process by SIGINT (exit -2, not
    the 130 chosen) once a plain KeyboardInterrupt has left an ``exec`` of a string (a dataclass
    or named tuple being made by an import), even when the exception was caught later."""
