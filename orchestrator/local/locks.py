"""Locks on a machine's GPUs and CPU, so that two sweeps never run cells on top of each other.

Two cron entries, or a manual run during the nightly, would otherwise share GPUs and spoil
each other's numbers. Each cell takes, before it starts and for as long as it runs, ``flock``
locks on files in a lock folder of this machine (:func:`lock_dir`: ``$ORCHESTRATE_LOCK_DIR``,
else ``/tmp/orchestrate-locks``, world-writable and sticky like ``/tmp`` so that every user's
sweeps meet there):

* ``<host>-gpu<N>.lock`` — exclusive, one per GPU the cell holds;
* ``<host>-cpu.lock`` — exclusive, for a cell that holds no GPU (CPU cells share the cores);
* ``<host>.lock`` — shared by every cell, exclusive for a cell that holds the whole host.

They are always taken in that order (host, then CPU or GPUs by number; a cell on several
machines: machine after machine, in name order), so two sweeps waiting for each other's GPUs
cannot deadlock. A cell that has to wait says once what it waits for and who holds it
("waiting for GPUs 0,1 on localhost: held by run nightly/20261122-031500-ab12 (user ana, pid
4242 on node1, cell v100-g2-r1) since 2026-11-22 03:15:02"): each holder writes that line into
the files it holds (a holder of an older version wrote no user: it is left out). The wait is
measured (:attr:`HeldLocks.waited_s`, from :attr:`HeldLocks.waited_from`) so that the sweep can
keep it out of the cell's and the run's time.
``--lock-timeout S`` gives up after S seconds of waiting (``--no-wait``: at once), the cell then
failing with that message. ``flock`` locks belong to the open file: when a sweep dies, even by
``kill -9``, the kernel releases them; no stale lock outlives its process.

:func:`hold` is the one wait loop (order, timeout, cancel, messages) of every machine; a
:class:`Locker` only tries one lock file at a time where the locks live: :class:`FileLocker` in
this machine's folder, :class:`orchestrator.remote.ssh_locker.SshLocker` on a lab host over SSH.
Which cells lock what, and where, is the backend's call (``Backend.lock_requests`` and
``Backend.locker``): the process and docker backends lock this machine's GPUs; Slurm needs no
lock (it allocates the GPUs itself); the ssh backend locks each host's GPUs on that host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import platform
import pwd
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import LaunchError

log = logging.getLogger(__name__)

LOCK_DIR_ENV = "ORCHESTRATE_LOCK_DIR"
DEFAULT_LOCK_DIR = Path("/tmp/orchestrate-locks")
#: How often a waiting cell tries its locks again.
POLL_S = 0.5


def lock_dir() -> Path:
    """The lock folder of this machine: ``$ORCHESTRATE_LOCK_DIR``, else /tmp/orchestrate-locks."""
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


@dataclass(frozen=True)
class LockRequest:
    """What one cell holds while it runs: GPUs of a host, its CPU, or the whole host."""

    host: str
    gpu_ids: tuple[int, ...] = ()
    whole_host: bool = False

    def files(self) -> list[tuple[str, int]]:
        """``(file name, flock mode)`` in the one order every sweep takes them."""
        out = [(f"{self.host}.lock", fcntl.LOCK_EX if self.whole_host else fcntl.LOCK_SH)]
        if self.gpu_ids:
            out += [(f"{self.host}-gpu{i}.lock", fcntl.LOCK_EX) for i in sorted(self.gpu_ids)]
        elif not self.whole_host:
            out.append((f"{self.host}-cpu.lock", fcntl.LOCK_EX))
        return out

    def describe(self) -> str:
        """``GPUs 0,1 on node1``, ``the CPU of node1``, ``all of node1``."""
        if self.whole_host:
            return f"all of {self.host}"
        if self.gpu_ids:
            word = "GPU" if len(self.gpu_ids) == 1 else "GPUs"
            return f"{word} {','.join(map(str, sorted(self.gpu_ids)))} on {self.host}"
        return f"the CPU of {self.host}"


def user_name() -> str:
    """The name of the user this process runs as (its uid when it has none)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        return os.environ.get("USER") or str(os.getuid())


@dataclass(frozen=True)
class Holder:
    """Who holds a lock (written into the lock file, read by whoever waits for it)."""

    run: str
    cell: str
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=platform.node)
    since: float = field(default_factory=time.time)
    user: str = field(default_factory=user_name)

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "cell": self.cell, "pid": self.pid,
                           "host": self.host, "since": self.since, "user": self.user})


class LockBusy(LaunchError):
    """A cell's GPUs (or CPU) stayed held by another sweep past the lock timeout."""


class LockWaitCancelled(Exception):
    """The sweep was interrupted while a cell waited for its locks."""


class Locker(ABC):
    """The locks of one :class:`LockRequest` on one machine, tried one at a time in the order of
    :meth:`LockRequest.files` (by :func:`hold`, which owns waiting, timeouts and messages)."""

    @abstractmethod
    def take(self, name: str, mode: int) -> str | None:
        """Try once, without blocking, to take lock file ``name`` in ``mode``: None when taken,
        else the first line its holder wrote into it ('' when none)."""

    def taken(self) -> None:  # optional hook
        """Every lock of the request is taken: write the holder into them (if not yet done)."""

    @abstractmethod
    def release(self) -> None:
        """Let go of every lock taken. Safe to call twice."""


class FileLocker(Locker):
    """The locks of a request in this machine's lock folder (``folder``: else :func:`lock_dir`)."""

    def __init__(self, request: LockRequest, holder: Holder, folder: Path | None = None):
        self.base = _folder(folder or lock_dir())
        self.record = (holder.to_json() + "\n").encode()
        self.fds: dict[str, int] = {}

    def take(self, name: str, mode: int) -> str | None:
        fd = self.fds.get(name)
        if fd is None:
            fd = self.fds[name] = _open(self.base / name)
        if _try_lock(fd, mode):
            return None
        try:
            return os.pread(fd, 4096, 0).decode(errors="replace").split("\n", 1)[0]
        except OSError:
            return ""

    def taken(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, self.record, 0)

    def release(self) -> None:
        for fd in reversed(list(self.fds.values())):
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


@dataclass
class HeldLocks:
    """The locks a running cell holds; :meth:`release` (or the process's end) frees them."""

    requests: tuple[LockRequest, ...]
    lockers: list[Locker] = field(default_factory=list)
    #: Seconds waited for another sweep's locks (0: none was held).
    waited_s: float = 0.0
    #: When the wait began (wall clock; None: no wait) and who held the lock found first.
    waited_from: float | None = None
    held_by: str = ""

    def release(self) -> None:
        for locker in reversed(self.lockers):
            try:
                locker.release()
            except Exception as exc:  # e.g. a lost connection: its locks went with it
                log.warning("releasing locks: %s", exc)
        self.lockers.clear()

    def __enter__(self) -> HeldLocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _folder(path: Path) -> Path:
    """The lock folder, made sticky and world-writable if we make it; never a symlink."""
    try:
        path.mkdir(parents=True)
        os.chmod(path, 0o1777)
    except FileExistsError:
        pass
    if stat.S_ISLNK(os.lstat(path).st_mode) or not path.is_dir():
        raise LaunchError(f"the lock folder {path} is not a folder (or is a symlink); "
                          f"remove it or set {LOCK_DIR_ENV}")
    return path


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):  # every user's sweeps lock the same files
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)
    return fd


def describe_holder(record: str) -> str:
    """Who holds a lock, in words, from the line its holder wrote (:meth:`Holder.to_json`):
    ``held by run nightly/20261122-031500-ab12 (user ana, pid 4242 on node1, cell
    v100-g2-r1) since 2026-11-22 03:15:02`` (no user where an older holder wrote none)."""
    try:
        data = json.loads(record or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(data["since"])))
        user = f"user {data['user']}, " if isinstance(data.get("user"), str) else ""
        return (f"held by run {data['run']} ({user}pid {data['pid']} on {data['host']}, cell "
                f"{data['cell']}) since {since}")
    except (ValueError, KeyError, TypeError, OverflowError, OSError):
        return "held by another sweep"


#: Makes the :class:`Locker` of a request (on the machine the request names).
LockerFactory = Callable[[LockRequest, Holder], Locker]


def hold(
    requests: Sequence[LockRequest],
    holder: Holder,
    locker: LockerFactory,
    *,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> HeldLocks:
    """Take every lock of ``requests``, request after request, each request's files in their
    one order (waiting while another sweep holds one). The one wait loop of every backend.

    ``locker`` makes each request's :class:`Locker` when its turn comes (:class:`FileLocker`:
    this machine's lock folder), so a later machine is not touched before the earlier ones are
    held.
    ``timeout_s``: None waits as long as it takes, 0 not at all; past it :class:`LockBusy`.
    ``cancel`` set while waiting: :class:`LockWaitCancelled`. ``on_wait`` hears once what the
    cell waits for and who holds it. On any error every lock taken so far is released.
    The result's ``waited_s`` counts from the first lock found held (0: none was), not the time
    it takes to reach the machine; ``waited_from`` is that moment on the wall clock and
    ``held_by`` who held that lock."""
    held = HeldLocks(tuple(requests))
    started: float | None = None  # when a lock was first found held by someone else
    try:
        for request in requests:
            taker = locker(request, holder)
            held.lockers.append(taker)
            for name, mode in request.files():
                while (record := taker.take(name, mode)) is not None:
                    now = time.monotonic()
                    waited = 0.0 if started is None else now - started
                    who = describe_holder(record)
                    if timeout_s is not None and waited >= timeout_s:
                        raise LockBusy(f"{request.describe()} {who}; gave up after "
                                       f"{waited:.0f} s (--lock-timeout {timeout_s:g})")
                    if started is None:
                        started = now
                        held.waited_from, held.held_by = time.time(), who
                        message = f"waiting for {request.describe()}: {who}"
                        log.info("%s: %s", holder.cell, message)
                        if on_wait:
                            on_wait(f"{holder.cell}: {message}")
                    if cancel is not None and cancel.wait(POLL_S):
                        raise LockWaitCancelled(f"interrupted while waiting for "
                                                f"{request.describe()}")
                    if cancel is None:
                        time.sleep(POLL_S)
            taker.taken()
    except BaseException:
        held.release()
        raise
    held.waited_s = 0.0 if started is None else round(time.monotonic() - started, 3)
    return held


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True
