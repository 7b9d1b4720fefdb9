"""A cell's log, read or followed as it is written (``orchestrate logs``).

A cell's ``log.txt`` grows while it runs (:class:`~orchestrator.backends.base.Backend` streams
the program's output into it); its ``result.json`` is written once its output has ended. So
following a log (as ``tail -f``, ``kubectl logs -f`` and ``docker logs -f`` do) prints what is
there, then what is added, and ends when the cell's result appears, or when the sweep that ran
it has ended without one (it died: nobody holds the run folder's lock any more,
:mod:`orchestrator.results.folders.folder_lock`). A cell not started yet is waited for while its
sweep runs. A cell run again (its host was lost, its GPU throttled) has its earlier attempt's
folder moved to ``superseded/`` and a new ``log.txt`` made: the follower goes on with the new
one, saying so. Only reads; never follows a symbolic link to another file.

Cells are named as in the run's plan (and its folders): a whole id or a unique prefix of one;
a misspelt id gets the nearest ids as suggestions.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.run_folder import RunPaths, read_json

#: How much of a log is read at a time.
CHUNK = 64 * 1024
#: After a cell's result appears in a live run, how long to watch for the sweep moving the
#: attempt aside to run the cell again (it does so right after the result is written).
RERUN_GRACE_S = 2.0


def cell_ids(paths: RunPaths) -> list[str]:
    """Every cell of a run: the plan's cells and control templates, and the cell folders (a
    control measurement's, an imported run's), in plan order, then by name."""
    plan = paths.plan_data() or {}
    ids: list[str] = []
    control = plan.get("control")
    for cells in (plan.get("cells"), control.get("cells") if isinstance(control, dict) else None):
        if isinstance(cells, list):
            ids += [str(c["id"]) for c in cells if isinstance(c, dict) and "id" in c]
    with contextlib.suppress(OSError):
        ids += sorted(e.name for e in os.scandir(paths.cells_dir)
                      if e.is_dir(follow_symlinks=False))
    return list(dict.fromkeys(ids))


def resolve_cell(paths: RunPaths, spec: str) -> str:
    """The cell ``spec`` names in run ``paths``: its whole id or a unique prefix of one;
    ConfigError otherwise, with the nearest ids (``did you mean``) or the ids a prefix fits."""
    known = cell_ids(paths)
    if spec in known:
        return spec
    starting = [c for c in known if c.startswith(spec)]
    if len(starting) == 1:
        return starting[0]
    where = f"run {paths.matrix_dir.name}:{paths.run_id}"
    if starting:
        shown = ", ".join(starting[:8]) + (" ..." if len(starting) > 8 else "")
        raise ConfigError(f"{spec!r} names {len(starting)} cells of {where} ({shown}); give "
                          "more of the id", field="CELL")
    close = difflib.get_close_matches(spec, known, n=3, cutoff=0.6)
    hint = f": did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(known[:12]) + (f" ... ({len(known)} cells)" if len(known) > 12 else "")
    raise ConfigError(f"no cell {spec!r} in {where}{hint} (its cells: {listed or 'none'})",
                      field="CELL")


def tail_offset(path: Path, lines: int) -> int:
    """Where the last ``lines`` lines of the file begin (0: the whole file); reads from the end,
    a block at a time, so a long log costs what its tail costs."""
    if lines <= 0:
        return path.stat().st_size
    with path.open("rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        pos, found = end, 0
        # a final line without its newline counts as a line; the newline ending the file does not
        skip_last = True
        while pos > 0:
            step = min(CHUNK, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            for i in range(len(block) - 1, -1, -1):
                if block[i] != 0x0A:
                    skip_last = False
                    continue
                if skip_last and pos + i == end - 1:
                    continue
                found += 1
                if found == lines:
                    return pos + i + 1
        return 0


@dataclass
class Follower:
    """Prints a cell's log (``write``: the bytes, as they are) and, with ``follow``, what is
    added until the cell ends; ``say`` hears what happens around it (waiting for the cell to
    start, a new attempt, how it ended)."""

    paths: RunPaths
    cell_id: str
    write: Callable[[bytes], None]
    say: Callable[[str], None]
    poll_s: float = 0.25
    #: Whether a sweep works in the run now (default: the run folder's lock is held).
    is_live: Callable[[], bool] | None = None
    sleep: Callable[[float], None] = time.sleep
    #: How long an ended attempt of a live run is watched for a re-run (:data:`RERUN_GRACE_S`).
    rerun_grace_s: float = RERUN_GRACE_S
    _fd: int | None = field(default=None, init=False)
    _pos: int = field(default=0, init=False)

    def live(self) -> bool:
        if self.is_live is not None:
            return self.is_live()
        return folder_lock.holder(self.paths.lock) is not None

    @property
    def log(self) -> Path:
        return self.paths.cell_log(self.cell_id)

    @property
    def result(self) -> Path:
        return self.paths.cell_result(self.cell_id)

    def show(self, tail: int | None = None) -> bool:
        """Print the log as it is now (its last ``tail`` lines); False when there is none."""
        if not self._open(tail):
            return False
        self._drain()
        return True

    def follow(self, tail: int | None = None) -> str:
        """Print the log and what is added to it until the cell ends; returns how it ended
        (its status and reason, or why it never will)."""
        told = False
        while not self._open(tail):
            if not self.live():
                return "no log: the cell did not run, and the sweep has ended"
            if not told:
                self.say(f"waiting for cell {self.cell_id} to start")
                told = True
            self.sleep(self.poll_s)
        attempts = 1
        checked = time.monotonic()
        while True:
            if self._drain():
                continue
            if self._replaced():  # the attempt was moved aside: a new one runs
                attempts += 1
                self._close()
                self.say(f"--- cell {self.cell_id}: attempt {attempts} (the earlier one is "
                         "kept under superseded/) ---")
                while not self._open(None):
                    if not self.live():
                        return "no log for the new attempt: the sweep has ended"
                    self.sleep(self.poll_s)
                continue
            ended = self._ended()
            if ended is not None:
                if self.live() and self._rerun_within(self.rerun_grace_s):
                    continue
                self._drain()
                return ended
            now = time.monotonic()
            if now - checked >= 1.0:  # the lock file: once a second is enough
                checked = now
                if not self.live():
                    self._drain()
                    return (self._ended() or "the sweep ended without a result for the cell "
                            "(it died or was killed)")
            self.sleep(self.poll_s)

    def close(self) -> None:
        self._close()

    # --- the file --------------------------------------------------------------------------

    def _open(self, tail: int | None) -> bool:
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        self._fd = fd
        self._pos = tail_offset(self.log, tail) if tail is not None else 0
        return True

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._pos = 0

    def _drain(self) -> bool:
        """Print what was added since the last read; whether there was anything."""
        assert self._fd is not None
        got = False
        while chunk := os.pread(self._fd, CHUNK, self._pos):
            self._pos += len(chunk)
            self.write(chunk)
            got = True
        return got

    def _replaced(self) -> bool:
        """Whether ``log.txt`` is no longer the file being read (moved with its attempt)."""
        assert self._fd is not None
        try:
            now = os.stat(self.log, follow_symlinks=False)
        except FileNotFoundError:
            return self.live()  # moved aside; a new attempt comes while the sweep runs
        mine = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    def _ended(self) -> str | None:
        """How the attempt being read ended (its result.json beside its log), or None."""
        assert self._fd is not None
        if self._replaced() or not self.result.is_file():
            return None
        try:
            data = read_json(self.result)
        except ConfigError:
            return None  # being written: look again
        if not isinstance(data, dict):
            return None
        status, reason = data.get("status"), data.get("reason")
        return f"{status}" + (f": {reason}" if reason else "")

    def _rerun_within(self, seconds: float) -> bool:
        """Whether, within ``seconds``, the sweep moves the ended attempt aside (to run the
        cell again)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._replaced():
                return True
            self.sleep(min(self.poll_s, 0.1))
        return False
