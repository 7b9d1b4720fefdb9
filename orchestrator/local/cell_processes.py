"""Every process one cell starts on this machine: marked, grouped, and stopped to the last one.

Killing a process group is not enough: torchrun starts each rank in a session of its own, and a
daemon can double-fork and ``setsid`` away. So a cell's processes are found two ways, both
inherited by everything the cell starts, however it detaches:

* **A marker** in the environment: ``ORCHESTRATE_CELL=<matrix>/<run id>/<cell id>``
  (:data:`MARKER_VAR`). :func:`marked_pids` scans ``/proc/<pid>/environ`` for it. Works for any
  user, without privileges, for the processes of that user (their environment is readable).
* **A cgroup of its own** where this machine lets us make one (root, or a delegated cgroup v2
  subtree): ``<our cgroup>/orchestrate/<run id>-<hash of the cell id>`` in the cgroup v2
  hierarchy. The launcher joins it *before* it execs the workload (a two-line ``sh`` wrapper
  writes ``0`` into ``cgroup.procs``), so nothing escapes by forking early; ``cgroup.kill``
  (Linux 5.14+) kills every member at once, forks included.

:meth:`CellProcesses.stop` sends SIGTERM to every process of the cell, waits up to a grace
period for all of them to end, then SIGKILLs what is left (``cgroup.kill`` and every marked
process), rescanning until a scan finds none: a process forked between two scans is caught by
the next, as a SIGKILLed one forks no more. What outlives that (a process in uninterruptible
sleep) is returned, so the result can say so. Zombies are dead and not counted.

**Memory limits** (``mem_limit``, the process backend's
``[hardware.NAME.container] mem_limit``) need the memory controller: a cgroup v2 one where the
controller can be enabled for our subtree, else a cgroup v1 ``memory`` one
(``memory.limit_in_bytes``, no swap). Its ``oom_kill`` counter (``memory.events`` /
``memory.oom_control``) tells a real OOM kill from any other SIGKILL.

``ORCHESTRATE_CGROUPS=0`` turns the cgroups off (the marker scan alone then stops a cell's
processes; memory limits are refused). Limits: the scan sees only processes whose environment
it can read (the same user, or root); a process that rewrites its own environment block loses
the marker (nothing does that in practice, and the cgroup still holds it).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

#: The environment variable every process of a cell carries.
MARKER_VAR = "ORCHESTRATE_CELL"
#: Set to 0 to make no cgroups (the marker scan alone stops a cell's processes).
CGROUPS_ENV = "ORCHESTRATE_CGROUPS"
#: The folder of our cells' cgroups, under our own cgroup.
CGROUP_FOLDER = "orchestrate"
#: How long SIGKILL may take to empty a cell before the survivors are reported.
KILL_WAIT_S = 10.0

#: The launcher's first step: join each cgroup (its cgroup.procs files come first, then ``--``
#: and the command), then exec the command. ``0`` written to cgroup.procs moves the writer.
JOIN_SCRIPT = (
    'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
)


def cell_marker(matrix: str, run_id: str, cell_id: str) -> str:
    """The marker value of one cell: ``<matrix>/<run id>/<cell id>``."""
    return f"{matrix}/{run_id}/{cell_id}"


def run_marker_prefix(matrix: str, run_id: str) -> str:
    """What every marker of one run starts with."""
    return f"{matrix}/{run_id}/"


def parse_bytes(text: str) -> int:
    """``"512m"``, ``"16g"``, ``"1.5G"``, ``"1048576"`` -> bytes (Docker's spelling)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r} (e.g. '512m', '16g')")
    scale = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    return int(float(match.group(1)) * scale[match.group(2).lower()])


# --- finding processes -------------------------------------------------------------------------


def _state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``D``, ``Z`` ...), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else None


def alive(pids: Iterable[int]) -> set[int]:
    """The ``pids`` that still run (gone and zombie ones left out)."""
    return {pid for pid in pids if _state(pid) not in (None, "Z")}


def marked_pids(value: str, prefix: bool = False) -> set[int]:
    """Processes whose environment has ``ORCHESTRATE_CELL=value`` (or a value starting with
    ``value`` when ``prefix``). This process is never one of them."""
    entry = f"{MARKER_VAR}={value}".encode()
    me = os.getpid()
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:  # gone, or another user's
            continue
        for var in environ.split(b"\0"):
            if var == entry or (prefix and var.startswith(entry)):
                found.add(int(name))
                break
    return found


def describe(pids: Iterable[int]) -> list[str]:
    """``"1234 (python -m workload ...)"`` for each pid still there."""
    out = []
    for pid in sorted(pids):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:
            cmd = b"?"
        out.append(f"{pid} ({cmd.decode(errors='replace')[:80]})")
    return out


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_marked(value: str, prefix: bool = False, grace: float = 0.0) -> list[int]:
    """Stop every process marked ``value`` (a run's prefix with ``prefix``): SIGTERM, up to
    ``grace`` seconds, then SIGKILL. Returns the pids found at first."""
    found = alive(marked_pids(value, prefix))
    if found:
        _terminate(lambda: alive(marked_pids(value, prefix)), grace)
    return sorted(found)


def _terminate(running: Callable[[], set[int]], grace: float,
               kill_all: Callable[[], None] | None = None) -> set[int]:
    """SIGTERM every process ``running()`` finds, wait up to ``grace`` s for them to go, then
    SIGKILL what a scan finds (after ``kill_all``, e.g. ``cgroup.kill``) until one finds none.
    Returns the processes still there after :data:`KILL_WAIT_S` of that (normally none)."""
    left = running()
    if left and grace > 0:
        _signal(left, signal.SIGTERM)
        _wait_gone(running, grace)
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        if kill_all is not None:
            kill_all()
        left = running()
        if not left:
            return set()
        _signal(left, signal.SIGKILL)
        if time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _wait_gone(members: Callable[[], set[int]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while members():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


# --- cgroups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str  # the mount's root within the hierarchy
    point: Path


def _mounts() -> tuple[_Mount | None, _Mount | None]:
    """The cgroup v2 mount and the cgroup v1 ``memory`` mount of this process's namespace."""
    v2 = v1_memory = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for raw in lines:
        left, _, right = raw.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = _Mount(fields[3], Path(fields[4].replace("\\040", " ")))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mount
        elif tail[0] == "cgroup" and "memory" in tail[2].split(",") and v1_memory is None:
            v1_memory = mount
    return v2, v1_memory


def _own_paths() -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and cgroup v1 memory path (from /proc/self/cgroup)."""
    v2 = v1_memory = None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for raw in lines:
        ident, _, rest = raw.partition(":")
        controllers, _, path = rest.partition(":")
        if ident == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1_memory = path
    return v2, v1_memory


def _dir_of(mount: _Mount | None, path: str | None) -> Path | None:
    """The folder of cgroup ``path`` under ``mount``, if this namespace can see it."""
    if mount is None or path is None:
        return None
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    folder = mount.point / path[len(root):].lstrip("/")
    return folder if folder.is_dir() else None


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _enable_memory(parent: Path) -> bool:
    """Make the v2 memory controller available to ``parent``'s children."""
    if "memory" not in (parent / "cgroup.controllers").read_text().split():
        return False
    if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
        try:
            _write(parent / "cgroup.subtree_control", "+memory")
        except OSError:
            return False
    return True


@dataclass
class CellCgroups:
    """The cgroups one cell runs in: one in the v2 hierarchy (membership, ``cgroup.kill``;
    memory where the controller is there), and a v1 ``memory`` one where only v1 can limit."""

    name: str
    v2: Path | None = None
    v1_memory: Path | None = None
    memory: Path | None = None  # which of the two limits memory
    made: list[Path] = field(default_factory=list)

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in (self.v2, self.v1_memory) if d is not None]

    def members(self) -> set[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in procs.read_text().split()}
        return pids

    def kill(self) -> None:
        """SIGKILL every member at once where the kernel can (cgroup v2 ``cgroup.kill``)."""
        if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.v2 / "cgroup.kill", "1")

    def oom_kills(self) -> int:
        """How many of the cell's processes the OOM killer killed (0 without a memory limit)."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.memory == self.v2 else "memory.oom_control"
        try:
            text = (self.memory / name).read_text()
        except OSError:
            return 0
        match = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        return int(match.group(1)) if match else 0

    def remove(self) -> None:
        """Remove the (empty) cgroups; a member still exiting gets a moment to go."""
        deadline = time.monotonic() + 2.0
        for folder in reversed(self.made):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.debug("cgroup %s not removed: %s", folder, exc)
                        break
                    time.sleep(0.05)


class MemoryLimitUnavailable(Exception):
    """No memory cgroup can be made here (the message says why)."""


def cgroups_enabled() -> bool:
    """Whether cgroups may be made (``ORCHESTRATE_CGROUPS`` is not 0)."""
    return os.environ.get(CGROUPS_ENV, "1").strip().lower() not in ("0", "no", "false", "off")


def make_cgroups(name: str, mem_limit: int | None = None) -> CellCgroups | None:
    """The cgroups of one cell named ``name``, or None where none can be made (the marker scan
    then stops the cell alone). With ``mem_limit`` (bytes) a memory cgroup is required:
    :class:`MemoryLimitUnavailable` when there is none."""
    if not cgroups_enabled():
        if mem_limit is not None:
            raise MemoryLimitUnavailable(f"{CGROUPS_ENV}=0 turned cgroups off")
        return None
    v2_mount, v1_mount = _mounts()
    v2_path, v1_path = _own_paths()
    cgroups = CellCgroups(name)
    v2_base = _dir_of(v2_mount, v2_path)
    if v2_base is not None:
        folder = _make(v2_base / CGROUP_FOLDER, name, cgroups)
        if folder is not None:
            cgroups.v2 = folder
            if mem_limit is not None and _v2_memory(folder, mem_limit):
                cgroups.memory = folder
    if mem_limit is not None and cgroups.memory is None:
        v1_base = _dir_of(v1_mount, v1_path)
        folder = _make(v1_base / CGROUP_FOLDER, name, cgroups) if v1_base else None
        if folder is not None and _v1_memory(folder, mem_limit):
            cgroups.v1_memory = cgroups.memory = folder
        if cgroups.memory is None:
            cgroups.remove()
            raise MemoryLimitUnavailable(
                "no memory cgroup can be made here (cgroup v2 without the memory controller "
                "for this process's subtree, and no writable cgroup v1 memory hierarchy); "
                "run as root or in a delegated cgroup")
    return cgroups if cgroups.procs_files else None


def _make(parent: Path, name: str, cgroups: CellCgroups) -> Path | None:
    """``parent/name`` as a fresh cgroup (a stale one of the same name is emptied first)."""
    try:
        if not parent.is_dir():
            parent.mkdir()  # shared by every cell; stays
        folder = parent / name
        if folder.is_dir():  # left by an orchestrator killed mid-cell: empty it, reuse it
            stale = CellCgroups(name, v2=folder)
            stale.kill()
            _signal(alive(stale.members()), signal.SIGKILL)
        else:
            folder.mkdir()
        cgroups.made.append(folder)
        return folder
    except OSError as exc:
        log.debug("no cgroup under %s: %s", parent, exc)
        return None


def _v2_memory(folder: Path, limit: int) -> bool:
    try:
        if not _enable_memory(folder.parent.parent) or not _enable_memory(folder.parent):
            return False
        _write(folder / "memory.max", str(limit))
        if (folder / "memory.swap.max").exists():
            _write(folder / "memory.swap.max", "0")
        return True
    except OSError as exc:
        log.debug("no v2 memory limit on %s: %s", folder, exc)
        return False


def _v1_memory(folder: Path, limit: int) -> bool:
    try:
        _write(folder / "memory.limit_in_bytes", str(limit))
        if (folder / "memory.memsw.limit_in_bytes").exists():
            _write(folder / "memory.memsw.limit_in_bytes", str(limit))  # no swap
        return True
    except OSError as exc:
        log.debug("no v1 memory limit on %s: %s", folder, exc)
        return False


def cgroup_name(run_id: str, cell_id: str) -> str:
    """A cell's cgroup name: short and safe, whatever the cell id."""
    return f"{run_id}-{hashlib.sha256(cell_id.encode()).hexdigest()[:12]}"


def _cgroup_parents() -> list[Path]:
    """The folders our cells' cgroups are made in (v2, and v1 ``memory``), where they exist."""
    v2_mount, v1_mount = _mounts()
    v2_path, v1_path = _own_paths()
    bases = [_dir_of(v2_mount, v2_path), _dir_of(v1_mount, v1_path)]
    return [base / CGROUP_FOLDER for base in bases
            if base is not None and (base / CGROUP_FOLDER).is_dir()]


def run_cgroups(run_id: str) -> list[Path]:
    """The cgroup folders of run ``run_id`` that exist now (normally none once its cells ended)."""
    return sorted(folder for parent in _cgroup_parents() for folder in parent.iterdir()
                  if folder.is_dir() and folder.name.startswith(f"{run_id}-"))


#: An empty cgroup older than this is a leftover (a live cell's is empty only for the moment
#: between its making and its launcher joining it).
STALE_CGROUP_S = 60.0


def remove_stale_cgroups(min_age_s: float = STALE_CGROUP_S) -> list[Path]:
    """Remove the empty cell cgroups an orchestrator killed mid-cell (``kill -9``) left behind,
    whatever run made them; a cgroup with a process in it, or made less than ``min_age_s`` ago,
    is kept. Returns the folders removed."""
    removed = []
    now = time.time()
    for parent in _cgroup_parents():
        for folder in parent.iterdir():
            try:
                if not folder.is_dir() or now - folder.stat().st_mtime < min_age_s:
                    continue
                if (folder / "cgroup.procs").read_text().strip():
                    continue
                folder.rmdir()  # EBUSY if a process joined meanwhile: kept
                removed.append(folder)
            except OSError as exc:
                log.debug("cgroup %s kept: %s", folder, exc)
    return removed


# --- one cell ----------------------------------------------------------------------------------


class CellProcesses:
    """Every process of one cell: its marker and (where possible) its cgroups.

    :meth:`wrap` and :meth:`environment` make a command run marked and in the cgroups;
    :meth:`stop` ends everything; :meth:`close` removes the cgroups."""

    def __init__(self, marker: str, cgroups: CellCgroups | None = None):
        self.marker = marker
        self.cgroups = cgroups

    @classmethod
    def create(cls, marker: str, cgroup: str, mem_limit: int | None = None) -> CellProcesses:
        """The processes of the cell ``marker``, in cgroups named ``cgroup`` where possible."""
        return cls(marker, make_cgroups(cgroup, mem_limit))

    @property
    def tracking(self) -> str:
        """How the cell's processes are found: ``cgroup v2``, ``cgroup v1`` or ``marker``."""
        if self.cgroups is None:
            return "marker"
        return "cgroup v2" if self.cgroups.v2 is not None else "cgroup v1"

    def environment(self) -> dict[str, str]:
        """What the cell's environment must add: the marker."""
        return {MARKER_VAR: self.marker}

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv``, joining the cell's cgroups before it execs (unchanged without cgroups)."""
        if self.cgroups is None:
            return list(argv)
        files = [str(p) for p in self.cgroups.procs_files]
        return ["/bin/sh", "-c", JOIN_SCRIPT, "orchestrate-cell", *files, "--", *argv]

    def running(self) -> set[int]:
        """Every live process of the cell (cgroup members and marked processes)."""
        pids = marked_pids(self.marker)
        if self.cgroups is not None:
            pids |= self.cgroups.members()
        pids.discard(os.getpid())
        return alive(pids)

    def stop(self, grace: float) -> list[str]:
        """SIGTERM everything, wait up to ``grace`` s, SIGKILL what is left until nothing is.

        Returns the processes that outlived it all (``"pid (command)"``), normally none."""
        left = _terminate(self.running, grace,
                          self.cgroups.kill if self.cgroups is not None else None)
        if not left:
            return []
        survivors = describe(left)
        log.error("%s: processes outlived SIGKILL for %g s: %s", self.marker, KILL_WAIT_S,
                  ", ".join(survivors))
        return survivors

    def oom_kills(self) -> int:
        """Processes of the cell the OOM killer killed (0 without a memory cgroup)."""
        return self.cgroups.oom_kills() if self.cgroups is not None else 0

    def close(self) -> None:
        """Remove the cell's cgroups (after :meth:`stop`)."""
        if self.cgroups is not None:
            self.cgroups.remove()
