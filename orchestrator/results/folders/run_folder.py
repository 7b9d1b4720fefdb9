"""Results are values on disk.

:class:`ResultsRoot` and :class:`RunPaths` decide every path under a results root: no other
module spells a name of the layout below (``tests/test_results.py`` greps the package for them).
:class:`CellResult` is what one cell produced. Tables and reports are built only from what is on
disk, so any old run can be re-reported.

Rules:

* A matrix name and a run id become folder names, so both must match
  :data:`~orchestrator.config.syntax.NAME_PATTERN`
  (letters, digits, ``_ . -``, starting with a letter or digit, at most 64 characters: never
  ``..``, a ``/`` or a hidden name). :func:`check_name` / :func:`check_run_id` are the one check,
  used wherever a name or run id becomes a path (:meth:`RunPaths.create`, :func:`find_run`,
  :func:`runs_of`, the matrix name, ``--run``, ``--resume``, ``clean``).
* Every file a run writes follows the umask (a colleague's ``report`` can read it) and is
  written by :func:`replacing` (:func:`write_json`, :func:`write_file`): atomically, never
  through a symbolic link, a FIFO or a device found at its path (a shared results folder may
  hold anything); a cell's log, which grows while the cell runs, by :func:`open_stream`.
* Reading an old run never crashes: an unreadable ``result.json`` (truncated, unknown status)
  is skipped with a warning; an unreadable ``plan.json`` only loses the plan order.

Layout::

    <results>/
        .orchestrate-index.sqlite   the store's index of every run folder (a cache)
        .orchestrate-images.json    what the image builds recorded per host (and its .lock)
    <results>/<matrix>/
        .import.lock       there while an import writes into the matrix's folder (flock)
        .import-<run id>-* an import being written (renamed to its run id at the end)
    <results>/<matrix>/<run id>/
        matrix.toml        the matrix file as it was (secrets masked)
        plan.json          the expanded cells
        run.json           backend, start/end, provenance, status counts, this machine's
                           load averages at the start and end (``load``)
        .lock              there while a sweep or --resume works in the run (flock)
        summary.csv        one row per cell group (medians over repeats)
        summary.txt        the same table as printed
        summary.png        the same as a plot (with the plots extra; the sweep draws it last,
                           before it returns)
        superseded/<cell id>-[<why>-]<ms>/   an attempt that is not its cell's result
        slurm/             the Slurm backend's array scripts (its own)
        cells/<cell id>/
            command.json   what was launched (argv, env, image, GPUs, host)
            log.txt        everything the workload printed
            metrics.jsonl  the workload's structured lines
            result.json    status, reason, timings, metrics, provenance, config_hash,
                           machine (load, CPU/GPU clocks at start and end: process, docker)
            ...            files the workload wrote (iterations.csv, telemetry.csv, profiles)
                           and a backend's own (the Slurm script and output)
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import errno
import functools
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, ClassVar, Literal, TextIO, overload

from orchestrator.config.syntax import check_name, check_run_id, name_problem
from orchestrator.errors import ConfigError, Problem
from orchestrator.results.folders import safejson
from workload.metrics import figure_prefix

log = logging.getLogger(__name__)

def check_results_root(results_root: Path) -> Path:
    """The results root, refused (ConfigError on ``--results``) when it is not a folder."""
    root = Path(results_root)
    if root.exists() and not root.is_dir():
        raise ConfigError([Problem("--results", str(root), "is not a folder; give a folder "
                                   "(created if missing) for the run folders")])
    return root


class Status(enum.StrEnum):
    """How a cell ended."""

    OK = "ok"
    FAILED = "failed"  # exited non-zero, or produced no summary
    TIMEOUT = "timeout"  # stopped at its per-cell timeout
    OOM = "oom"  # killed by the out-of-memory killer
    HOST_LOST = "host_lost"  # its host went away; retried elsewhere when possible
    CANCELLED = "cancelled"  # the sweep was interrupted
    UNPLACEABLE = "unplaceable"  # no host/GPUs can ever run it


@dataclass
class CellResult:
    """What one cell produced. Written as ``result.json``."""

    cell_id: str
    group: str
    repeat: int
    status: Status
    reason: str = ""
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float | None = None
    attempts: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)
    #: The cell's content hash (parameters + hardware profile): what it measures. Empty in
    #: results written before it was recorded (the run's plan.json has it).
    config_hash: str = ""
    #: ``config`` (a configuration of the matrix) or ``control`` (a measurement of its
    #: ``[control]``, :mod:`orchestrator.plan.controls`): never a row of the configurations.
    role: str = "config"
    #: The machine's state at the cell's start and end (``{"start": ..., "end": ...}``,
    #: :mod:`orchestrator.local.machine_state`), where the backend records it (process,
    #: docker); empty otherwise and in results written before it was recorded.
    machine: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: Any) -> CellResult:
        """A result from ``result.json``'s data; ValueError naming the field if it is not one
        (an unknown status, a missing id, a field of the wrong type)."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        missing = [k for k in ("cell_id", "group", "repeat", "status") if k not in known]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        try:
            known["status"] = Status(known["status"])
        except ValueError:
            raise ValueError(f"status: unknown status {known['status']!r} (known: "
                             f"{', '.join(s.value for s in Status)})") from None
        for name, kinds in _RESULT_TYPES.items():
            if name in known and not _is(known[name], kinds):
                raise ValueError(f"{name}: unexpected {type(known[name]).__name__} "
                                 f"{known[name]!r}")
        params = known.get("params", {})
        odd = [k for k, v in params.items() if not _is(v, (str, int, float, bool, type(None)))]
        if "gpus" in params and not _is(params["gpus"], (int,)):
            odd.append("gpus")
        if odd:
            raise ValueError(f"params.{odd[0]}: unexpected value {params[odd[0]]!r}")
        return cls(**known)


_NUMBER = (int, float)
#: The JSON types of result.json's fields (None allowed where the field is optional).
_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "cell_id": (str,), "group": (str,), "repeat": (int,), "reason": (str,),
    "exit_code": (int, type(None)), "started_at": (*_NUMBER, type(None)),
    "finished_at": (*_NUMBER, type(None)), "duration_s": (*_NUMBER, type(None)),
    "attempts": (int,), "params": (dict,), "metrics": (dict,), "env": (dict,),
    "provenance": (dict,), "log_tail": (list,), "role": (str,), "machine": (dict,),
}


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def throughput_key(mode: str, kind: str = "total_ips") -> str:
    """A throughput's figure name for a cell's mode: ``train.total_ips`` / ``val.total_ips``,
    the headline figure every table, comparison and history judges a configuration by, or
    another ``kind`` (``compute_ips``, ``step_ips_p90``). The prefix is the workload's own rule
    (:func:`workload.metrics.figure_prefix`)."""
    return f"{figure_prefix(mode)}.{kind}"


def gpus_of(params: Mapping[str, Any]) -> int | None:
    """A cell's GPUs (Gaudi cards, CPU worker processes) over all its nodes: its ``gpus``
    parameter, 1 where it has none; None where that is no positive whole number. What torch
    and DLE's logs call the world size, and a per-card table the cards, the results read
    here."""
    value = params.get("gpus", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def lock_wait_of(results: Iterable[Mapping[str, Any]]) -> float:
    """Seconds of a run's wall time spent only waiting for another sweep's locks: the union of
    its cells' lock waits less the time some cell of it ran meanwhile (so two cells waiting at
    once count once, and a wait beside a running cell costs the run nothing). From each
    result's ``provenance.lock_wait`` (``from``, ``until``), or, as results recorded before it
    was written, ``lock_wait_s`` ending at the cell's start; a run's time less this is the time
    its cells took (``runs``' duration)."""
    waits: list[tuple[float, float]] = []
    running: list[tuple[float, float]] = []
    for result in results:
        started, finished = _seconds(result.get("started_at")), _seconds(result.get("finished_at"))
        if started is not None and finished is not None:
            running.append((started, finished))
        provenance = result.get("provenance")
        if not isinstance(provenance, Mapping):
            continue
        recorded, seconds = provenance.get("lock_wait"), _seconds(provenance.get("lock_wait_s"))
        begin, end = (_seconds(recorded.get("from")), _seconds(recorded.get("until"))) if (
            isinstance(recorded, Mapping)) else (None, None)
        if begin is not None and end is not None:
            waits.append((begin, end))
        elif seconds and started is not None:
            waits.append((started - seconds, started))
    return round(_covered(waits) - _overlap(_merged(waits), _merged(running)), 3)


def _seconds(value: Any) -> float | None:
    """A recorded number of seconds (or a timestamp) as a float; None for anything else."""
    return float(value) if _is(value, _NUMBER) else None


def _merged(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of time spans, as disjoint spans in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covered(spans: Iterable[tuple[float, float]]) -> float:
    return sum(end - start for start, end in _merged(spans))


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The time two sets of disjoint, ordered spans share."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (:func:`replacing`). Standard JSON only: NaN and infinities are
    written as null (:mod:`safejson`)."""
    text = safejson.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    write_file(path, text)


def write_file(path: Path, data: str | bytes, *, make_folder: bool = True) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) atomically (:func:`replacing`).
    ``make_folder``: make its folder where missing (else a missing folder is an OSError: a run
    folder removed meanwhile stays removed)."""
    with replacing(path, "wb", make_folder=make_folder) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_bytes(path: Path, data: bytes, *, make_folder: bool = True) -> None:
    """:func:`write_file` of bytes."""
    write_file(path, data, make_folder=make_folder)


@overload
def replacing(path: Path, mode: Literal["w"] = "w", *, make_folder: bool = True
              ) -> contextlib.AbstractContextManager[TextIO]:
    ...


@overload
def replacing(path: Path, mode: Literal["wb"], *, make_folder: bool = True
              ) -> contextlib.AbstractContextManager[BinaryIO]:
    ...


def replacing(path: Path, mode: str = "w", *, make_folder: bool = True
              ) -> contextlib.AbstractContextManager[IO[Any]]:
    """A file object (``mode`` ``w``: text, UTF-8; ``wb``: bytes) whose content replaces
    ``path`` when the block ends, atomically: a crash, a full disk or an interrupt leaves the
    old file whole and no temporary one behind.

    What lies at ``path`` is never followed or opened: the data goes to a new temporary file
    beside it (made with ``O_EXCL | O_NOFOLLOW``: a symbolic link, a FIFO or a device planted in
    a shared results folder cannot receive it), which is renamed over ``path`` (replacing a
    link or FIFO there, not what it points to). The folder is created if missing
    (``make_folder``; else that is an OSError), and must not be a symbolic link itself (an
    :class:`OSError` ``ELOOP`` otherwise). The file follows the
    umask like every other file of a run (``mkstemp`` would make it 0600: unreadable to
    colleagues)."""
    return _replacing(path, mode, make_folder)


@contextlib.contextmanager
def _replacing(path: Path, mode: str, make_folder: bool) -> Iterator[IO[Any]]:
    """The body of :func:`replacing`."""
    folder = path.parent
    if make_folder:
        folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():
        raise OSError(errno.ELOOP, "its folder is a symbolic link; not written through it",
                      str(path))
    while True:
        tmp = folder / f".{path.name[:200]}.{secrets.token_hex(4)}.tmp"
        try:
            # mode 0o666: the kernel applies the umask, as for any file opened with open()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | getattr(os, "O_CLOEXEC", 0), 0o666)
            break
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue
    try:
        if "b" in mode:
            with os.fdopen(fd, "wb") as fh:
                yield fh
        else:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                yield fh
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def make_folder(path: Path) -> Path:
    """``path`` made if missing (its parent must exist) and found to be a real folder: a
    symbolic link planted there (to a folder elsewhere) is an OSError (``ELOOP``), so nothing
    is moved or written through it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise OSError(errno.ELOOP, "not a folder (a symbolic link?); not written into",
                      str(path))
    return path


def open_stream(path: Path) -> IO[bytes]:
    """``path`` opened for appending bytes (a cell's log while its program runs, which cannot be
    replaced at the end), created if missing: never through a symbolic link (``ELOOP``), and a
    FIFO or device there is an OSError too, found without blocking."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file; not written into", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file: a FIFO or device planted in a shared results
    folder (or a copied run folder) must not hang a reader, so anything else is a ConfigError
    naming it, found without blocking. OSError as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise ConfigError("not a regular file", file=str(path))
        return fh.read()


def read_json(path: Path) -> Any:
    """A JSON file of a run; a missing, truncated or unreadable file (nested too deeply, an
    integer too long: :func:`safejson.loads`) is a ConfigError naming it. NaN and infinities
    are read as None."""
    try:
        return safejson.loads(read_regular(path).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError("missing (the run folder is incomplete)", file=str(path)) from None
    except safejson.JSONLimitError as exc:
        raise ConfigError(f"unreadable: {exc}", file=str(path)) from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, JSONDecodeError
        raise ConfigError(f"unreadable ({exc}); the file is damaged or truncated",
                          file=str(path)) from None


def new_run_id(now: float | None = None) -> str:
    """A sortable, unique run id: ``20261122-031500-ab12``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class ResultsRoot:
    """Every path directly under a results root: the matrices' folders and the files beside them
    (the run folders' own are :class:`RunPaths`')."""

    path: Path

    #: The store's SQLite index (:mod:`orchestrator.results.folders.store`).
    INDEX: ClassVar[str] = ".orchestrate-index.sqlite"
    #: What the image builds recorded (:mod:`orchestrator.images.state`), and its lock.
    IMAGES_STATE: ClassVar[str] = ".orchestrate-images.json"
    IMAGES_LOCK: ClassVar[str] = ".orchestrate-images.lock"
    #: In a matrix's folder: the lock imports into it take, and the prefix of one being written.
    IMPORT_LOCK: ClassVar[str] = ".import.lock"
    IMPORTING: ClassVar[str] = ".import-"
    #: The files under the root the project writes (each never through a link or FIFO found
    #: in its place: the index is set aside and rebuilt, the rest written by
    #: :func:`replacing` or opened by ``folder_lock.open_regular``).
    WRITTEN: ClassVar[tuple[str, ...]] = (INDEX, IMAGES_STATE, IMAGES_LOCK)

    @property
    def index(self) -> Path:
        return self.path / self.INDEX

    @property
    def images_state(self) -> Path:
        return self.path / self.IMAGES_STATE

    def matrix_dir(self, matrix_name: str) -> Path:
        return self.path / matrix_name

    def run(self, matrix_name: str, run_id: str) -> RunPaths:
        return RunPaths(self.matrix_dir(matrix_name) / run_id)

    def import_lock(self, matrix_name: str) -> Path:
        return self.matrix_dir(matrix_name) / self.IMPORT_LOCK

    def new_import_folder(self, matrix_name: str, run_id: str) -> Path:
        """A fresh hidden folder in the matrix's folder for an import to write into (OSError
        as :func:`tempfile.mkdtemp` raises it)."""
        return Path(tempfile.mkdtemp(dir=self.matrix_dir(matrix_name),
                                     prefix=f"{self.IMPORTING}{run_id}-"))


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run."""

    root: Path

    MATRIX_FILE: ClassVar[str] = "matrix.toml"
    PLAN: ClassVar[str] = "plan.json"
    RUN_META: ClassVar[str] = "run.json"
    LOCK: ClassVar[str] = ".lock"
    SUMMARY_CSV: ClassVar[str] = "summary.csv"
    SUMMARY_TXT: ClassVar[str] = "summary.txt"
    SUMMARY_PNG: ClassVar[str] = "summary.png"
    SUPERSEDED: ClassVar[str] = "superseded"
    CELLS: ClassVar[str] = "cells"
    #: What was published where (:mod:`orchestrator.publish`), so a repeat sends what changed.
    PUBLISHED: ClassVar[str] = "publish.json"
    #: A cell folder's own files (what else is in it, the program or a backend wrote).
    CELL_LOG: ClassVar[str] = "log.txt"
    CELL_COMMAND: ClassVar[str] = "command.json"
    CELL_METRICS: ClassVar[str] = "metrics.jsonl"
    CELL_RESULT: ClassVar[str] = "result.json"
    CELL_FILES: ClassVar[frozenset[str]] = frozenset(
        {CELL_LOG, CELL_COMMAND, CELL_METRICS, CELL_RESULT})
    #: The workload's own summary of a cell, written by the program into its folder.
    CELL_SUMMARY: ClassVar[str] = "summary.json"
    #: The files of a run the project writes (by :func:`replacing`; none through a link, a
    #: FIFO or a device found in its place), and of each cell (the log by
    #: :func:`open_stream`): ``tests/test_safe_writes.py`` plants a link and a FIFO at each.
    WRITTEN: ClassVar[tuple[str, ...]] = (MATRIX_FILE, PLAN, RUN_META, SUMMARY_CSV, SUMMARY_TXT,
                                          SUMMARY_PNG, PUBLISHED)
    CELL_WRITTEN: ClassVar[tuple[str, ...]] = (CELL_LOG, CELL_COMMAND, CELL_METRICS,
                                               CELL_RESULT)

    @classmethod
    def create(cls, results_root: Path, matrix_name: str, run_id: str | None = None) -> RunPaths:
        """Make a new run folder; ConfigError for a bad name, run id or results root."""
        check_name(matrix_name, "matrix.name")
        run_id = check_run_id(run_id) if run_id else new_run_id()
        paths = ResultsRoot(check_results_root(results_root)).run(matrix_name, run_id)
        root = paths.root
        try:
            root.mkdir(parents=True, exist_ok=False)
            paths.cells_dir.mkdir()
        except FileExistsError:
            raise ConfigError(f"run {run_id!r} already exists under {root.parent}",
                              field="--run") from None
        except OSError as exc:
            raise ConfigError([Problem("--results", str(results_root),
                                       f"cannot create the run folder {root}: {exc.strerror}")]
                              ) from None
        return paths

    @classmethod
    def is_run(cls, folder: Path) -> bool:
        """Whether ``folder`` is a run folder (it has a plan)."""
        return (folder / cls.PLAN).is_file()

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def matrix_dir(self) -> Path:
        """The matrix's folder the run is in."""
        return self.root.parent

    @property
    def results_root(self) -> Path:
        """The results root the run is under (``<results>/<matrix>/<run id>``)."""
        return self.root.parent.parent

    @property
    def matrix_file(self) -> Path:
        return self.root / self.MATRIX_FILE

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN

    @property
    def run_meta(self) -> Path:
        return self.root / self.RUN_META

    @property
    def lock(self) -> Path:
        """The lock of the sweep working in the run
        (:mod:`orchestrator.results.folders.folder_lock`)."""
        return self.root / self.LOCK

    @property
    def summary_csv(self) -> Path:
        return self.root / self.SUMMARY_CSV

    @property
    def summary_txt(self) -> Path:
        return self.root / self.SUMMARY_TXT

    @property
    def summary_png(self) -> Path:
        return self.root / self.SUMMARY_PNG

    @property
    def published(self) -> Path:
        return self.root / self.PUBLISHED

    @functools.cached_property
    def cells_dir(self) -> Path:
        return self.root / self.CELLS

    def superseded(self, cell_id: str, *why: str) -> Path:
        """Where an attempt of a cell that is not its result is kept:
        ``superseded/<cell id>-<why...>-<ms>``: ``superseded/`` made (never a link out of the
        run: :func:`make_folder`), the attempt's folder not."""
        return make_folder(self.root / self.SUPERSEDED) / "-".join(
            [cell_id, *why, str(int(time.time() * 1000))])

    def cell_dir(self, cell_id: str) -> Path:
        return self.cells_dir / cell_id

    @functools.cached_property
    def absolute_cells_dir(self) -> str:
        """The cells' folder as an absolute path without links on the way, resolved once (a
        cell's program may run in another folder, or on a node that shares this one)."""
        return str(self.cells_dir.resolve())

    def absolute_cell_dir(self, cell_id: str) -> str:
        """A cell's folder as its program is told it (:attr:`absolute_cells_dir`), as text: what
        an argv, an environment or a batch script carries."""
        return f"{self.absolute_cells_dir}/{cell_id}"

    def cell_log(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.CELL_LOG

    def cell_command(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.CELL_COMMAND

    def cell_metrics(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.CELL_METRICS

    def cell_result(self, cell_id: str) -> Path:
        return self.cell_dir(cell_id) / self.CELL_RESULT

    def result_files(self) -> list[Path]:
        """Every cell's ``result.json`` on disk, by cell id."""
        return sorted(self.cells_dir.glob(f"*/{self.CELL_RESULT}"))

    def meta_data(self) -> dict[str, Any]:
        """``run.json``'s object; {} where it is missing, damaged or not an object (what reads
        it for a table or a document goes on without it)."""
        try:
            meta = read_json(self.run_meta)
        except ConfigError:
            return {}
        return meta if isinstance(meta, dict) else {}

    def plan_data(self) -> dict[str, Any] | None:
        """``plan.json``'s object; None (with a warning) when it is missing or unreadable."""
        if not self.plan.exists():
            return None
        try:
            data = read_json(self.plan)
        except ConfigError as exc:
            log.warning("%s; using the cells found on disk", exc)
            return None
        if not isinstance(data, dict):
            log.warning("%s: not a JSON object; using the cells found on disk", self.plan)
            return None
        return data

    def results(self) -> list[CellResult]:
        """Every cell result on disk, in plan order where a plan exists.

        A result that cannot be read (truncated, unknown status, wrong types) is skipped with a
        warning: one damaged file never hides the rest of a run.
        """
        plan = self.plan_data() or {}
        listed = plan.get("cells")
        cells = listed if isinstance(listed, list) else []
        order = [c["id"] for c in cells if isinstance(c, dict) and isinstance(c.get("id"), str)]
        found = {p.parent.name: p for p in self.result_files()}
        ids = [i for i in order if i in found] + sorted(set(found) - set(order))
        out = []
        for cell_id in ids:
            try:
                out.append(CellResult.from_json(read_json(found[cell_id])))
            except ConfigError as exc:
                log.warning("skipping cell %s: %s", cell_id, exc)
            except ValueError as exc:
                log.warning("skipping cell %s: %s: %s", cell_id, found[cell_id], exc)
        return out


def parse_metric_lines(text: str) -> list[dict[str, Any]]:
    """The workload's structured lines: JSON objects with a ``type``, one per line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:  # a program's own lines may be anything: what is no metric line is skipped
            obj = safejson.loads(line, finite=False)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("type"), str):
            out.append(obj)
    return out


def find_run(results_root: Path, matrix_name: str, run_id: str | None = None) -> RunPaths:
    """A run folder: ``run_id`` (a run id, a unique prefix of one, ``latest`` or ``latest~N``,
    as the results store names runs) or the newest run of the matrix."""
    check_name(matrix_name, "matrix")
    where = ResultsRoot(check_results_root(results_root))
    base = where.matrix_dir(matrix_name)
    latest = re.fullmatch(r"latest(?:~(\d{1,6}))?", run_id or "")
    if run_id is not None and not latest:
        check_run_id(run_id)
        paths = where.run(matrix_name, run_id)
        if paths.root.is_dir():
            return _inside(results_root, paths)
        matches = [r for r in runs_of(results_root, matrix_name) if r.run_id.startswith(run_id)]
        if len(matches) == 1:
            return _inside(results_root, matches[0])
        many = f" ({len(matches)} runs start with it)" if matches else ""
        raise ConfigError(f"no run {run_id!r} under {base}{many}; `orchestrate runs "
                          f"{matrix_name}` lists them", field="run")
    runs = runs_of(results_root, matrix_name)
    if not runs:
        raise ConfigError(no_runs(results_root, matrix_name), field="run")
    back = int(latest.group(1) or 0) if latest else 0
    if back >= len(runs):
        raise ConfigError(f"{run_id!r}: {matrix_name!r} has {len(runs)} run(s) under "
                          f"{results_root}", field="run")
    return _inside(results_root, runs[-1 - back])


def _inside(results_root: Path, paths: RunPaths) -> RunPaths:
    """``paths`` if its folder is really under ``results_root``: a run folder that is a
    symbolic link out of it is refused (commands write into the run they are given)."""
    root = Path(results_root).resolve()
    where = paths.root.resolve()
    if not where.is_relative_to(root):
        raise ConfigError(f"{paths.root} leads (through a symbolic link) to {where}, outside "
                          f"the results folder {root}; give the results folder it lies in",
                          field="run")
    return paths


def runs_of(results_root: Path, matrix_name: str) -> list[RunPaths]:
    """Every finished-or-not run of a matrix, oldest first (run ids sort by time).

    Entries that are not run folders (a stray file, a hidden or oddly named folder) are left out.
    """
    check_name(matrix_name, "matrix")
    base = ResultsRoot(check_results_root(results_root)).matrix_dir(matrix_name)
    if not base.is_dir():
        return []
    return [
        RunPaths(p) for p in sorted(base.iterdir())
        if not name_problem(p.name) and p.is_dir() and RunPaths.is_run(p)
    ]


def matrices_with_runs(results_root: Path) -> list[str]:
    """The names of the matrices with at least one run under ``results_root``, sorted (none
    when it is not a folder); a folder whose name no matrix can have is left out."""
    root = Path(results_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if not name_problem(p.name) and p.is_dir() and runs_of(root, p.name))


def no_runs(results_root: Path, matrix_name: str) -> str:
    """'no runs of NAME under ROOT', with the matrix meant when NAME looks misspelt (``did you
    mean 'resnet_sweep'?``) or else the matrices that have runs there: the one wording of
    ``runs``, ``export``, ``report``, ``history`` and ``compare`` for a name without runs."""
    root = Path(results_root)
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = matrices_with_runs(root)
    said = f"no runs of {matrix_name!r} under {root}"
    close = difflib.get_close_matches(matrix_name, names, n=1, cutoff=0.6)
    if close:
        return f"{said}: did you mean {close[0]!r}?"
    if names:
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        return f"{said} (runs of {shown})"
    return said
