"""Locks on folders of the results: one sweep at a time works in a run folder, one import at a
time writes into a matrix's folder.

A lock is an ``flock`` on a small file in the folder (``<run>/.lock``, ``<results>/<matrix>/
.import.lock``), there while it is held: the kernel releases it when its process ends, even by
``kill -9`` (the file then stays, unlocked, until the next holder), so no stale lock ever
outlives its holder. The holder writes who it is into the file (pid, host, since when,
its command line); whoever finds the lock taken says so in words (:func:`describe`). A regular
file (not the folder itself) because a results folder on NFS locks files only.

A file system that cannot lock at all (``ENOLCK``: an NFS mount without its lock daemon) is
warned about once per lock and the work goes on unlocked: the results are never held back by
a missing lock service, and the warning says what is then not excluded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import platform
import shlex
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: How often a waiting :func:`acquire` tries again.
POLL_S = 0.1


class LockHeld(Exception):
    """The lock is held by another process; ``holder`` says who, in words."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path}: {holder}")
        self.path = path
        self.holder = holder


@dataclass
class FolderLock:
    """A lock taken by this process; :meth:`release` (or the process's end) lets it go."""

    path: Path
    fd: int | None

    def release(self) -> None:
        """Let go of the lock and remove its file (while still holding it: a process that
        opened the file meanwhile finds, once it has the lock, that the file is gone, and
        takes a new one)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(path: Path, wait_s: float = 0.0, argv: Sequence[str] | None = None) -> FolderLock:
    """Take the lock file ``path`` (made if missing; never through a symlink), waiting up to
    ``wait_s`` seconds for its holder; :class:`LockHeld` naming the holder past that. OSError
    when the file cannot be made (a read-only folder): the caller's to report."""
    deadline = time.monotonic() + wait_s
    while True:
        fd = _open_lock(path)
        try:
            if not _lock(fd, path, deadline):
                return FolderLock(path, fd)  # no locks on this file system: warned
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it as we waited: lock the file there now
    with contextlib.suppress(OSError):  # who holds it, for whoever finds it taken
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_record(argv).encode(), 0)
    return FolderLock(path, fd)


def _open_lock(path: Path) -> int:
    """The lock file opened (made if missing). A symbolic link, FIFO or device in its place
    (planted in a shared results folder) is removed first, never opened: the path is the
    lock's own and holds nothing else."""
    try:
        return open_regular(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
            raise
    log.warning("%s was not a regular file: removed, the lock taken afresh", path)
    os.unlink(path)
    return open_regular(path, os.O_RDWR | os.O_CREAT)


def open_regular(path: Path, flags: int) -> int:
    """``os.open(path, flags)`` (mode 0o666: the umask applies) of a regular file only: never
    through a symbolic link (``ELOOP``), and a FIFO or device planted there is an OSError
    (``EINVAL``) found without blocking, never opened for use."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def holder(path: Path) -> str | None:
    """Who holds the lock file ``path`` now, in words; None when nobody does (or there is no
    such file). Only looks: nothing is made or written, the lock is not taken."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return describe(_read_holder(fd))
        return None
    finally:
        os.close(fd)  # closing lets go of the shared lock, if it was taken
    return None


def _lock(fd: int, path: Path, deadline: float) -> bool:
    """flock ``fd`` (waiting until ``deadline``): True when locked, False when the file system
    has no locks; LockHeld past the deadline."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno == errno.ENOLCK:
                log.warning("%s cannot be locked (%s): another orchestrate working here at "
                            "the same time is not excluded", path, exc.strerror)
                return False
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            raise LockHeld(path, describe(_read_holder(fd)))
        time.sleep(POLL_S)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` is still the file ``fd`` has open."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _holder_record(argv: Sequence[str] | None) -> str:
    command = list(sys.argv if argv is None else argv)
    if command:
        command[0] = "orchestrate" if command[0].endswith(("orchestrate", "__main__.py",
                                                           "orchestrator")) else command[0]
    return json.dumps({"pid": os.getpid(), "host": platform.node(), "since": time.time(),
                       "command": shlex.join(command)[:500]}) + "\n"


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 1)[0]
    except OSError:
        return ""


def describe(record: str) -> str:
    """Who holds a lock, in words, from the line its holder wrote."""
    try:
        data = json.loads(record or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(data["since"])))
        command = f": {data['command']}" if data.get("command") else ""
        return f"held by pid {int(data['pid'])} on {data['host']} since {since}{command}"
    except (ValueError, KeyError, TypeError, OverflowError, OSError):
        return "held by another orchestrate process"
