"""The results store: an SQLite index over the run folders, for queries across many runs.

Rules:

* **The run folders are the source of truth.** The index (``<results>/.orchestrate-index.sqlite``,
  stdlib :mod:`sqlite3`) only caches what they hold; deleting it loses nothing, and every query
  first brings it up to date with the folders (:meth:`Store.refresh`).
* **Staleness is detected cheaply**: each run folder has a *signature* of sizes and mtimes
  (``stat`` calls only, no reads). A run still going (no ``finished_at`` in ``run.json``): its
  ``run.json``, ``plan.json`` and every ``cells/*/result.json``. A run that has ended: its
  ``run.json``, ``plan.json`` and ``cells`` folder only (3 stat calls, so a year of nightlies
  refreshes in milliseconds): its results change only through ``--resume``, which rewrites
  ``run.json`` at its end. A result edited by hand in an ended run is not noticed:
  ``orchestrate runs --reindex`` rebuilds the index. A run whose signature differs from the
  indexed one is read again; a run folder that is gone is dropped; an index of another schema
  version is rebuilt from scratch.
* **Concurrency**: WAL journal (readers never block the writer nor each other), a 30 s busy
  timeout, every change in an ``IMMEDIATE`` transaction, one run per transaction, so a reader
  sees each run either wholly indexed or not at all. Parsing happens outside transactions.
  Queries that belong together run in :meth:`Store.snapshot` (one read transaction): a run
  re-indexed by another process between two queries would otherwise change its key.
* **Read-only results** (an archive): the index goes to a cache file instead
  (``$XDG_CACHE_HOME/orchestrate/index-<hash of the results path>.sqlite``), or, when that cannot
  be written either, into memory; :attr:`Store.note` says which, for the CLI to show.
* **What a configuration is**: the content hash of the cell's parameters and hardware profile
  (``config_hash`` in ``result.json``, else the cell's ``hash`` in ``plan.json``, else a hash of
  the parameters alone for folders older than both). The display id (cell group) is only a
  label. The software/hardware **stack** it ran on (image, torch, CUDA, cuDNN, driver, GPU or
  CPU model, host, Python) is recorded beside it, from ``result.json``'s ``env`` (what the
  workload saw) and ``provenance`` (what the backend launched); matching by configuration and
  stack is the business of :mod:`orchestrator.results.reports.history` and
  :mod:`orchestrator.results.reports.compare`.

Tables: ``meta`` (schema version), ``runs`` (one per run folder), ``stacks`` (distinct stacks),
``cells`` (one per ``result.json``; ``value`` is the headline throughput, images/s),
``params`` (cell parameters as key/value rows, for filters) and ``figures`` (every numeric
metric of a cell, plus ``train.step_ips_p90`` / ``val.step_ips_p90`` derived from its
per-iteration times: see :data:`STEP_IPS_P90`, plus the normalised figures ``norm.F``). A cell
that ran as a Slurm job keeps Slurm's accounting of it (``cells.slurm``: :func:`slurm_of`), its
run the ids of its jobs and arrays (``runs.slurm_jobs``).

**Controls** (a matrix's ``[control]``, :mod:`orchestrator.plan.controls`): their results are
cells with ``role = 'control'`` (``config`` for every configuration), never counted as a
run's configurations (``n_cells`` / ``n_ok``; a failed control still makes the run
``failed``). When a run is indexed, every ok configuration cell with a nearest control gets
``norm.F`` = F / the control's figure for each of its throughput figures, and ``norm_from``
names the control measurements used (:mod:`orchestrator.results.statistics.normalise`).
"""

from __future__ import annotations

import calendar
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sqlite3
import stat
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator.config.syntax import check_name
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.results.folders import folder_lock
from orchestrator.results.folders.run_folder import (
    CellResult,
    ResultsRoot,
    RunPaths,
    lock_wait_of,
    no_runs,
    read_json,
    throughput_key,
)
from orchestrator.results.statistics.normalise import PREFIX as NORM_PREFIX
from orchestrator.results.statistics.normalise import Measured, normalise

log = logging.getLogger(__name__)

INDEX_NAME = ResultsRoot.INDEX
#: Bump when the tables or what goes into them change: older indexes are rebuilt.
#: 2: cells' role (config / control) and normalised figures (``norm.*``, issue 25); cells'
#: Slurm accounting and runs' Slurm jobs (issue 26). 3: both (either 2 lacks the other's).
#: 4: runs' lock waits (``lock_wait_s``, issue 31). 5: cells in plan order (their ``cell_pk``),
#: as the report shows them, not in cell-id text order (batch 16 before 8).
SCHEMA_VERSION = 5
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    run_pk INTEGER PRIMARY KEY,
    matrix TEXT NOT NULL,
    run_id TEXT NOT NULL,
    path TEXT NOT NULL UNIQUE,
    signature TEXT NOT NULL,
    backend TEXT,
    started_at REAL,
    finished_at REAL,
    git_revision TEXT,
    orchestrate_version TEXT,
    controller_host TEXT,
    repeats INTEGER,
    planned INTEGER NOT NULL,
    n_cells INTEGER NOT NULL,
    n_ok INTEGER NOT NULL,
    status TEXT NOT NULL,
    slurm_jobs TEXT,
    lock_wait_s REAL NOT NULL DEFAULT 0,
    UNIQUE (matrix, run_id)
);
CREATE INDEX runs_by_matrix ON runs (matrix, started_at);
CREATE INDEX runs_by_start ON runs (started_at);
CREATE TABLE stacks (
    stack_pk INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    image TEXT, image_id TEXT, torch TEXT, cuda TEXT, cudnn TEXT, driver TEXT, gpu TEXT,
    host TEXT, python TEXT
);
CREATE TABLE cells (
    cell_pk INTEGER PRIMARY KEY,
    run_pk INTEGER NOT NULL REFERENCES runs (run_pk) ON DELETE CASCADE,
    cell_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    repeat INTEGER,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    duration_s REAL,
    started_at REAL,
    attempts INTEGER,
    stack_pk INTEGER REFERENCES stacks (stack_pk),
    metric TEXT,
    value REAL,
    params TEXT NOT NULL,
    slurm TEXT,
    role TEXT NOT NULL DEFAULT 'config',
    norm_from TEXT
);
CREATE INDEX cells_by_run ON cells (run_pk);
CREATE INDEX cells_by_config ON cells (config);
CREATE TABLE params (
    cell_pk INTEGER NOT NULL REFERENCES cells (cell_pk) ON DELETE CASCADE,
    key TEXT NOT NULL,
    value TEXT
);
CREATE INDEX params_by_cell ON params (cell_pk);
CREATE INDEX params_by_key ON params (key, value);
CREATE TABLE figures (
    cell_pk INTEGER NOT NULL REFERENCES cells (cell_pk) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX figures_by_cell ON figures (cell_pk);
"""
_TABLES = ("figures", "params", "cells", "stacks", "runs", "meta")


# --- values ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedStack:
    """The software and hardware a cell ran on, as its result recorded it. Empty fields: not
    recorded. (What a profile's cells are planned to run on, before anything is built, is
    :class:`orchestrator.plan.software.PlannedStack`.)"""

    image: str | None = None
    image_id: str | None = None
    torch: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    driver: str | None = None
    gpu: str | None = None
    host: str | None = None
    python: str | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Field names, in display order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_result(cls, env: dict[str, Any], provenance: dict[str, Any]) -> RecordedStack | None:
        """The stack of a result: None when the workload reported no environment (it never
        started, or failed before its first line) and the backend recorded no image."""
        if not env and not provenance.get("image"):
            return None

        def text(value: Any) -> str | None:
            return None if value is None or value == "" else str(value)

        gpu = env.get("device_name") if env.get("device") not in (None, "cpu") else (
            env.get("cpu_model") or env.get("device_name"))
        return cls(
            image=text(provenance.get("image")),
            image_id=text(provenance.get("image_id") or provenance.get("image_digest")),
            torch=text(env.get("torch_version")),
            cuda=text(env.get("cuda_version")),
            cudnn=text(env.get("cudnn_version")),
            driver=text(env.get("driver_version")),
            gpu=text(gpu),
            host=text(provenance.get("host") or env.get("hostname")),
            python=text(env.get("python_version")),
        )

    def as_dict(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in self.names()}

    def key(self, ignore: Iterable[str] = ()) -> str:
        """A short hash of the fields not in ``ignore``: equal stacks, equal keys."""
        skip = set(ignore)
        blob = json.dumps({k: v for k, v in self.as_dict().items() if k not in skip},
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def differences(self, other: RecordedStack, ignore: Iterable[str] = ()
                    ) -> dict[str, tuple[Any, Any]]:
        """``{field: (ours, theirs)}`` for every field that differs."""
        skip = set(ignore)
        return {
            name: (getattr(self, name), getattr(other, name))
            for name in self.names()
            if name not in skip and getattr(self, name) != getattr(other, name)
        }


def stack_field_values(stacks: Iterable[RecordedStack | None]) -> dict[str, list[str]]:
    """Per stack field, the distinct values ``stacks`` hold (sorted; a None stack is skipped)."""
    out: dict[str, set[str]] = {name: set() for name in RecordedStack.names()}
    for stack in stacks:
        if stack is not None:
            for name, value in stack.as_dict().items():
                if value is not None:
                    out[name].add(value)
    return {name: sorted(values) for name, values in out.items()}


@dataclass(frozen=True)
class RunRecord:
    """One run folder as indexed."""

    pk: int
    matrix: str
    run_id: str
    path: str
    backend: str | None
    started_at: float | None
    finished_at: float | None
    git_revision: str | None
    orchestrate_version: str | None
    controller_host: str | None
    repeats: int | None
    planned: int
    cells: int
    ok: int
    #: ok | failed | interrupted | empty: how it ended; unfinished: no end recorded and nobody
    #: works in it (the sweep crashed or was killed); running: a sweep works in it now.
    status: str
    #: The Slurm jobs (and arrays, by their id) its cells ran as, in submission order.
    slurm_jobs: tuple[str, ...] = ()
    #: Seconds of its wall time spent only waiting for another sweep's locks
    #: (:func:`~orchestrator.results.folders.run_folder.lock_wait_of`).
    lock_wait_s: float = 0.0
    #: Who works in it now (a sweep or ``--resume`` holds its folder's lock), in words; '' when
    #: nobody does. Looked up by :meth:`Store.runs`, never indexed.
    live: str = ""

    @property
    def failed(self) -> int:
        """Cells with a result that did not end ok."""
        return self.cells - self.ok

    @property
    def missing(self) -> int:
        """Planned cells with no result (a sweep that died or was stopped, a cell skipped); 0
        while a sweep works in the run: its cells without a result are :attr:`to_run`."""
        return 0 if self.status == "running" else max(0, self.planned - self.cells)

    @property
    def to_run(self) -> int:
        """A live run's planned cells with no result yet (0 once nobody works in it)."""
        return max(0, self.planned - self.cells) if self.status == "running" else 0

    @property
    def elapsed_s(self) -> float | None:
        """Its wall time, start to end (None: not ended)."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def duration_s(self) -> float | None:
        """Its time without the lock waits: what its cells took (None: not ended)."""
        elapsed = self.elapsed_s
        return None if elapsed is None else max(0.0, elapsed - self.lock_wait_s)

    @property
    def label(self) -> str:
        return f"{self.matrix}:{self.run_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "matrix": self.matrix, "run_id": self.run_id, "path": self.path,
            "status": self.status, "backend": self.backend, "started_at": self.started_at,
            "finished_at": self.finished_at, "duration_s": self.duration_s,
            "lock_wait_s": self.lock_wait_s, "elapsed_s": self.elapsed_s,
            "git_revision": self.git_revision, "orchestrate_version": self.orchestrate_version,
            "controller_host": self.controller_host, "repeats": self.repeats,
            "planned": self.planned, "cells": self.cells, "ok": self.ok, "failed": self.failed,
            "missing": self.missing,
            **({"to_run": self.to_run} if self.status == "running" else {}),
            **({"slurm_jobs": list(self.slurm_jobs)} if self.slurm_jobs else {}),
            **({"live": self.live} if self.live else {}),
        }


@dataclass(frozen=True)
class CellRecord:
    """One cell result as indexed."""

    pk: int
    run_pk: int
    cell_id: str
    group: str
    repeat: int | None
    config: str
    status: str
    reason: str
    duration_s: float | None
    started_at: float | None
    attempts: int | None
    stack: RecordedStack | None
    metric: str | None
    value: float | None
    params: dict[str, Any]
    figures: dict[str, float] = field(default_factory=dict)
    #: Slurm's accounting of the cell's job (:func:`slurm_of`); empty when it was none.
    slurm: dict[str, Any] = field(default_factory=dict)

    role: str = "config"
    #: ``norm.F`` of this cell's figure (``metric``): its ratio to the nearest controls (None:
    #: no control, or not asked for).
    norm: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_control(self) -> bool:
        return self.role == "control"


#: What the index keeps of a Slurm job, from a result's provenance (``slurm_<name>``).
SLURM_FIELDS = ("job_id", "state", "exit_code", "elapsed_s", "node_list")


def slurm_of(provenance: dict[str, Any]) -> dict[str, Any]:
    """Slurm's accounting of a cell's job as recorded in its provenance
    (:mod:`orchestrator.backends.slurm`): ``job_id``, ``state``, ``exit_code``, ``elapsed_s``,
    ``node_list``; empty for a cell that was no Slurm job."""
    if not provenance.get("slurm_job_id"):
        return {}
    return {name: provenance.get(f"slurm_{name}") for name in SLURM_FIELDS}


def _slurm_job_ids(results: Iterable[dict[str, Any]]) -> list[str]:
    """The distinct jobs of a run's results, an array by its id, in order of submission."""
    ids: set[str] = set()
    for res in results:
        prov = res.get("provenance") or {}
        job = prov.get("slurm_array_job_id") or prov.get("slurm_job_id")
        if isinstance(job, str | int) and str(job):
            ids.add(str(job))
    return sorted(ids, key=lambda j: (len(j), j))


# --- reading run folders (no database) -------------------------------------------------------


def _stat(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return "-"
    return f"{st.st_mtime_ns}:{st.st_size}"


def shallow_signature(run_dir: Path) -> str:
    """``run.json``, ``plan.json`` and the ``cells`` folder (3 stat calls): enough for a run
    that has ended, whose results change only through ``--resume``, which rewrites
    ``run.json`` when it ends and moves replaced cell folders out of ``cells``."""
    paths = RunPaths(run_dir)
    parts = [_stat(paths.run_meta), _stat(paths.plan), _stat(paths.cells_dir)]
    return "s:" + hashlib.sha1("|".join(parts).encode()).hexdigest()


def run_signature(run_dir: Path) -> str:
    """Sizes and mtimes of every file of a run the index reads, ``result.json`` files included;
    stat calls only (for a run still going)."""
    paths = RunPaths(run_dir)
    parts = [_stat(paths.run_meta), _stat(paths.plan)]
    try:
        entries = sorted(e.name for e in os.scandir(paths.cells_dir) if e.is_dir())
    except OSError:
        entries = []
    parts += [f"{name}={_stat(paths.cell_result(name))}" for name in entries]
    return "d:" + hashlib.sha1("|".join(parts).encode()).hexdigest()


def params_hash(params: dict[str, Any]) -> str:
    """The configuration key of a result whose run recorded no content hash (old folders)."""
    blob = json.dumps(params, sort_keys=True, default=str)
    return "p" + hashlib.sha256(blob.encode()).hexdigest()[:11]


def headline(params: dict[str, Any], metrics: dict[str, Any]) -> tuple[str, float | None]:
    """The figure a configuration is judged by: ``train.total_ips`` / ``val.total_ips``."""
    name = throughput_key(str(params.get("mode", "train")))
    value = metrics.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return name, float(value)
    return name, None


#: The derived figure: per-step images/s at the 90th percentile (global batch / the 10th
#: percentile of the measured iteration times). Contention on a shared machine only ever slows
#: a step down, so the fast steps are the least disturbed estimate of what the code can do.
STEP_IPS_P90 = "step_ips_p90"


def derived_figures(params: dict[str, Any], metrics: dict[str, Any]) -> dict[str, float]:
    """Figures the index computes from a result's per-iteration times (5 or more)."""
    times = metrics.get("iteration_times")
    batch = metrics.get("global_batch_size")
    if not isinstance(times, list) or not isinstance(batch, int | float) or len(times) < 5:
        return {}
    clean = [float(t) for t in times if isinstance(t, int | float) and t > 0]
    if len(clean) < 5:
        return {}
    p10 = statistics.quantiles(clean, n=10, method="inclusive")[0]
    return {throughput_key(str(params.get("mode", "train")), STEP_IPS_P90): float(batch) / p10}


def is_throughput(name: str) -> bool:
    """Whether a figure is a throughput (images/s, higher is better): ``*.total_ips``,
    ``*.compute_ips``, ``*.step_ips_p90`` ..."""
    return "ips" in name.rsplit(".", 1)[-1].split("_")


def _read(path: Path) -> Any:
    """A run's JSON file (:func:`read_json`: regular files only, so a FIFO planted in a shared
    results folder cannot hang a refresh); None, warned, when it cannot be read."""
    try:
        return read_json(path)
    except ConfigError as exc:
        log.warning("not read: %s", exc)  # exc names the file
        return None


def _run_started(run_dir: Path, meta: dict[str, Any]) -> float | None:
    started = meta.get("started_at")
    if isinstance(started, int | float):
        return float(started)
    with contextlib.suppress(ValueError):  # run ids start with a UTC stamp
        return float(calendar.timegm(time.strptime(run_dir.name[:15], "%Y%m%d-%H%M%S")))
    return None


@dataclass
class ParsedRun:
    """A run folder read from disk, ready to insert."""

    matrix: str
    run_id: str
    path: str
    signature: str
    meta: dict[str, Any]
    plan: dict[str, Any]
    results: list[dict[str, Any]]


def read_run_folder(run_dir: Path) -> ParsedRun:
    """Everything the index keeps of one run folder. The signatures are taken first: a file
    written while we read makes the next refresh read the run again."""
    shallow, deep = shallow_signature(run_dir), run_signature(run_dir)
    paths = RunPaths(run_dir)
    meta = _read(paths.run_meta) or {}
    plan = _read(paths.plan) or {}
    results = []
    cells_dir = paths.cells_dir
    if cells_dir.is_dir():
        for entry in sorted(os.scandir(cells_dir), key=lambda e: e.name):
            path = paths.cell_result(entry.name)
            if not (entry.is_dir() and path.is_file()):
                continue  # not yet written
            try:  # the same rules as every reader of result.json (RunPaths.results)
                data = read_json(path)
                CellResult.from_json(data)
            except (ConfigError, ValueError) as exc:
                log.warning("skipping cell %s: %s: %s", entry.name, path, exc)
                continue
            results.append(data)
    plan = plan if isinstance(plan, dict) else {}
    listed = plan.get("cells")
    position = {c["id"]: i for i, c in enumerate(listed if isinstance(listed, list) else [])
                if isinstance(c, dict) and isinstance(c.get("id"), str)}
    # plan order, as RunPaths.results and the report (a cell the plan does not list: last)
    results.sort(key=lambda r: position.get(r.get("cell_id"), len(position)))
    meta = meta if isinstance(meta, dict) else {}
    ended = bool(meta.get("finished_at") or meta.get("interrupted"))
    return ParsedRun(run_dir.parent.name, run_dir.name, str(run_dir), shallow if ended else deep,
                     meta, plan, results)


def live_holder(run_dir: Path) -> str:
    """Who works in a run folder now (a sweep or ``--resume``: it holds the folder's lock
    until it ends), in words; '' when nobody does. A lock belongs to a live process: the kernel
    drops it when the process ends, even by ``kill -9``, so a crashed sweep, or another
    process that reuses its pid, never reads as running. Only looks."""
    return folder_lock.holder(RunPaths(run_dir).lock) or ""


def _run_status(meta: dict[str, Any], planned: int, n_cells: int, n_ok: int,
                controls_failed: int = 0) -> str:
    if meta.get("interrupted"):
        return "interrupted"
    if not meta.get("finished_at") and meta:
        return "unfinished"
    if n_cells == 0:
        return "empty"
    return "ok" if n_ok == n_cells and n_cells >= planned and not controls_failed else "failed"


def _measured(index: int, res: dict[str, Any], figures: dict[str, float]) -> Measured:
    """What :func:`~orchestrator.results.statistics.normalise.normalise` needs of one result."""
    params = res.get("params") or {}
    prov = res.get("provenance") or {}
    found = prov.get("gpu_ids")
    gpus: list[Any] = found if isinstance(found, list) else []
    started, finished = res.get("started_at"), res.get("finished_at")
    return Measured(
        key=index, role=str(res.get("role") or "config"), hardware=str(params.get("hardware")),
        host=str(prov["host"]) if prov.get("host") is not None else None,
        gpus=tuple(g for g in gpus if isinstance(g, int)),
        started=float(started) if isinstance(started, int | float) else None,
        finished=float(finished) if isinstance(finished, int | float) else None,
        ok=res.get("status") == "ok", headline=headline(params, {})[0], figures=figures)


# --- the store -------------------------------------------------------------------------------


def _cache_index_path(results_root: Path) -> Path:
    """Where the index of a results folder that cannot hold its own lives: in orchestrate's
    cache folder, ``$ORCHESTRATE_CACHE``, else ``$XDG_CACHE_HOME/orchestrate``, else
    ``~/.cache/orchestrate``, one file per results folder."""
    base = Path(os.environ.get("ORCHESTRATE_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchestrate")
    digest = hashlib.sha256(str(results_root.resolve()).encode()).hexdigest()[:16]
    return base / f"index-{digest}.sqlite"


class Store:
    """The index of a results root. Use :func:`open_store`; close it (or use ``with``)."""

    def __init__(self, results_root: Path, conn: sqlite3.Connection, location: str,
                 note: str | None = None) -> None:
        self.root = Path(results_root)
        self.conn = conn
        self.location = location  # the index file, or ":memory:"
        self.note = note  # why the index is not where it normally is
        self._stacks: dict[int, RecordedStack | None] = {}

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """An IMMEDIATE transaction: the write lock is taken at once (waits up to the busy
        timeout for another writer)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Store]:
        """Queries inside see one consistent state of the index (a read transaction), even
        while another process re-indexes runs. Re-entrant."""
        if self.conn.in_transaction:
            yield self
            return
        self.conn.execute("BEGIN")
        try:
            yield self
        finally:
            self.conn.execute("COMMIT")

    def _ensure_schema(self) -> None:
        version = self._schema_version()
        if version == SCHEMA_VERSION:
            return
        with self._write() as conn:
            # another process may have created it meanwhile
            if self._schema_version() == SCHEMA_VERSION:
                return
            for table in _TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        if version is not None:
            log.info("index %s: schema %s -> %s, rebuilt", self.location, version, SCHEMA_VERSION)

    def _schema_version(self) -> int | None:
        try:
            row = self.conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:
            return None
        return int(row[0]) if row else None

    # -- refresh ----------------------------------------------------------------------------

    def matrices_on_disk(self) -> list[str]:
        """Matrix folders under the results root."""
        if not self.root.is_dir():
            return []
        return sorted(e.name for e in os.scandir(self.root)
                      if e.is_dir() and not e.name.startswith("."))

    def refresh(self, matrices: Sequence[str] | None = None) -> int:
        """Bring the index up to date with the run folders of ``matrices`` (default: all).

        Returns how many runs were (re)read or dropped. Cheap when nothing changed: one
        ``stat`` per indexed file and one read-only query.
        """
        names = list(matrices) if matrices is not None else self.matrices_on_disk()
        on_disk: dict[str, Path] = {}
        for name in names:
            base = ResultsRoot(self.root).matrix_dir(name)
            if not base.is_dir():
                continue
            for entry in os.scandir(base):
                if entry.is_dir() and RunPaths(Path(entry.path)).plan.exists():
                    on_disk[str(Path(entry.path))] = Path(entry.path)
        indexed = self._signatures(names if matrices is not None else None)
        changed = []
        for key, run_dir in sorted(on_disk.items()):
            known = indexed.get(key)
            if known is not None and known.startswith("s:"):
                if known == shallow_signature(run_dir):
                    continue
            elif known is not None and known == run_signature(run_dir):
                continue
            changed.append(run_dir)
        gone = [key for key in indexed if key not in on_disk]
        for key in gone:
            with self._write() as conn:
                conn.execute("DELETE FROM runs WHERE path = ?", (key,))
        for run_dir in changed:
            parsed = read_run_folder(run_dir)
            with self._write() as conn:
                # another process may have indexed this very state meanwhile
                row = conn.execute("SELECT signature FROM runs WHERE path = ?",
                                   (parsed.path,)).fetchone()
                if row and row[0] == parsed.signature:
                    continue
                conn.execute("DELETE FROM runs WHERE path = ?", (parsed.path,))
                self._insert(conn, parsed)
        if changed or gone:
            log.info("index %s: %d run(s) read, %d dropped", self.location, len(changed),
                     len(gone))
        return len(changed) + len(gone)

    def _signatures(self, matrices: Sequence[str] | None) -> dict[str, str]:
        if matrices is None:
            rows = self.conn.execute("SELECT path, signature FROM runs")
        else:
            marks = ",".join("?" * len(matrices))
            rows = self.conn.execute(
                f"SELECT path, signature FROM runs WHERE matrix IN ({marks})", list(matrices))
        return dict(rows.fetchall())

    def _stack_pk(self, conn: sqlite3.Connection, stack: RecordedStack | None) -> int | None:
        if stack is None:
            return None
        key = stack.key()
        row = conn.execute("SELECT stack_pk FROM stacks WHERE key = ?", (key,)).fetchone()
        if row:
            return int(row[0])
        values = stack.as_dict()
        cur = conn.execute(
            f"INSERT INTO stacks (key, {', '.join(values)}) VALUES "
            f"(?, {', '.join('?' * len(values))})", (key, *values.values()))
        assert cur.lastrowid is not None  # an INSERT into a rowid table
        return cur.lastrowid

    def _insert(self, conn: sqlite3.Connection, run: ParsedRun) -> None:
        meta, plan = run.meta, run.plan
        hashes = {c.get("id"): c.get("hash") for c in plan.get("cells", []) or []
                  if isinstance(c, dict)}
        planned = len(hashes)
        configs = [r for r in run.results if (r.get("role") or "config") != "control"]
        n_ok = sum(1 for r in configs if r.get("status") == "ok")
        n_cells = len(configs)
        controls_failed = sum(1 for r in run.results
                              if r.get("role") == "control" and r.get("status") != "ok")
        run_dir = Path(run.path)
        cur = conn.execute(
            "INSERT INTO runs (matrix, run_id, path, signature, backend, started_at, "
            "finished_at, git_revision, orchestrate_version, controller_host, repeats, planned, "
            "n_cells, n_ok, status, slurm_jobs, lock_wait_s) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run.matrix, run.run_id, run.path, run.signature,
             meta.get("backend") or plan.get("backend"), _run_started(run_dir, meta),
             meta.get("finished_at"), meta.get("git_revision"), meta.get("orchestrate_version"),
             meta.get("controller_host"), plan.get("repeats"), planned, n_cells, n_ok,
             _run_status(meta, planned, n_cells, n_ok, controls_failed),
             json.dumps(_slurm_job_ids(run.results)) if _slurm_job_ids(run.results) else None,
             _lock_wait(meta, run.results)),
        )
        run_pk = cur.lastrowid
        param_rows: list[tuple[int, str, str]] = []
        figure_rows: list[tuple[int, str, float]] = []
        figures = [_figures(res) for res in run.results]
        normalised = normalise([_measured(i, res, figures[i])
                                for i, res in enumerate(run.results)], is_throughput) if any(
            res.get("role") == "control" for res in run.results) else {}
        for i, res in enumerate(run.results):
            params = res.get("params") or {}
            metrics = res.get("metrics") or {}
            cell_id = str(res.get("cell_id", ""))
            config = res.get("config_hash") or hashes.get(cell_id) or params_hash(params)
            stack = RecordedStack.from_result(res.get("env") or {}, res.get("provenance") or {})
            metric, value = headline(params, metrics)
            norm = normalised.get(i)
            used = ",".join(str(run.results[k].get("cell_id"))
                            for k in norm.controls) if norm else None
            slurm = slurm_of(res.get("provenance") or {})
            cur = conn.execute(
                "INSERT INTO cells (run_pk, cell_id, grp, repeat, config, status, reason, "
                "duration_s, started_at, attempts, stack_pk, metric, value, params, slurm, "
                "role, norm_from) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_pk, cell_id, str(res.get("group", cell_id)), res.get("repeat"), config,
                 str(res.get("status")), res.get("reason") or "", res.get("duration_s"),
                 res.get("started_at"), res.get("attempts"), self._stack_pk(conn, stack),
                 metric, value, json.dumps(params, sort_keys=True, default=str),
                 json.dumps(slurm, default=str) if slurm else None,
                 str(res.get("role") or "config"), used),
            )
            cell_pk = cur.lastrowid
            assert cell_pk is not None  # an INSERT into a rowid table
            param_rows += [(cell_pk, k, _param_text(v)) for k, v in params.items()]
            figure_rows += [(cell_pk, k, v) for k, v in figures[i].items()]
            if norm:
                figure_rows += [(cell_pk, k, v) for k, v in norm.figures.items()]
        conn.executemany("INSERT INTO params VALUES (?,?,?)", param_rows)
        conn.executemany("INSERT INTO figures VALUES (?,?,?)", figure_rows)

    def rebuild(self) -> int:
        """Forget everything and read every run folder again. Returns the runs read."""
        with self._write() as conn:
            conn.execute("DELETE FROM runs")
            conn.execute("DELETE FROM stacks")
        self._stacks.clear()
        return self.refresh()

    # -- queries ----------------------------------------------------------------------------

    def runs(
        self,
        matrix: str | None = None,
        since: float | None = None,
        until: float | None = None,
        status: Sequence[str] = (),
        run_ids: Sequence[str] = (),
    ) -> list[RunRecord]:
        """Indexed runs, oldest first, filtered by matrix, start time range, status, run ids.

        A run a sweep works in now (its folder's lock held: :func:`live_holder`) has status
        ``running``, whatever its run.json says (a run being resumed has the end of its first
        sweep), and says who in ``live``."""
        where: list[str] = []
        args: list[Any] = []
        if matrix:
            where.append("matrix = ?")
            args.append(matrix)
        if since is not None:
            where.append("started_at >= ?")
            args.append(since)
        if until is not None:
            where.append("started_at < ?")
            args.append(until)
        if run_ids:
            where.append(f"run_id IN ({','.join('?' * len(run_ids))})")
            args += list(run_ids)
        sql = ("SELECT run_pk, matrix, run_id, path, backend, started_at, finished_at, "
               "git_revision, orchestrate_version, controller_host, repeats, planned, n_cells, "
               "n_ok, status, slurm_jobs, lock_wait_s FROM runs")
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at, run_id"
        found = [_live(_run_record(row)) for row in self.conn.execute(sql, args)]
        return [r for r in found if r.status in status] if status else found

    def resolve(self, spec: str, matrix: str | None = None) -> RunRecord:
        """A run from ``RUN_ID`` (or a unique prefix of one), ``MATRIX:RUN_ID``,
        ``MATRIX:latest`` or ``MATRIX:latest~N`` (the N-th run before the newest); ``latest``
        without a matrix is the newest of the one matrix the results hold."""
        name, sep, rest = spec.rpartition(":")
        if sep:
            matrix = check_name(name, "run") if name else matrix  # it names a folder
        else:
            rest = spec
        candidates = self.runs(matrix=matrix)
        if matrix and not candidates:  # no run of it at all: its name is the likely mistake
            raise ConfigError(no_runs(self.root, matrix), field="run")
        if rest == "latest" or rest.startswith("latest~"):
            if not matrix:
                matrices = sorted({r.matrix for r in candidates})
                if len(matrices) != 1:
                    which = f" (runs of {', '.join(matrices)})" if matrices else ""
                    raise ConfigError(f"{spec!r}: say which matrix, e.g. MATRIX:{rest}{which}",
                                      field="run")
                matrix = matrices[0]
            back = rest.partition("~")[2]
            if back and not (back.isdigit() and len(back) <= 6):
                raise ConfigError(f"{spec[:80]!r}: expected latest~N with N a number below "
                                  "a million", field="run")
            n = int(back or 0)
            if n >= len(candidates):
                raise ConfigError(f"{spec!r}: {matrix!r} has {len(candidates)} run(s) under "
                                  f"{self.root}", field="run")
            return candidates[-1 - n]
        found = [r for r in candidates if r.run_id == rest] or [
            r for r in candidates if r.run_id.startswith(rest)]
        if not found:
            where = f" of {matrix!r}" if matrix else ""
            raise ConfigError(f"no run {rest!r}{where} under {self.root} "
                              "(see `orchestrate runs`)", field="run")
        if len(found) > 1:
            names = ", ".join(r.label for r in found[:5])
            raise ConfigError(f"{spec!r} names {len(found)} runs ({names}); give MATRIX:RUN_ID "
                              "or more of the id", field="run")
        return found[0]

    def _stack(self, stack_pk: int | None) -> RecordedStack | None:
        if stack_pk is None:
            return None
        if stack_pk not in self._stacks:
            row = self.conn.execute(
                f"SELECT {', '.join(RecordedStack.names())} FROM stacks WHERE stack_pk = ?",
                (stack_pk,)).fetchone()
            self._stacks[stack_pk] = RecordedStack(*row) if row else None
        return self._stacks[stack_pk]

    def cells(self, run_pks: Sequence[int], figures: bool = False, metric: str | None = None
              ) -> list[CellRecord]:
        """The cells of the given runs (in run order, then plan order), controls included (their
        ``role``); ``figures``: with every numeric metric; ``metric``: ``value`` is this figure
        instead of the headline. ``norm`` is the same figure normalised (``norm.`` + its name;
        None where the run had no control)."""
        if not run_pks:
            return []
        marks = ",".join("?" * len(run_pks))
        columns = ("c.cell_pk, run_pk, cell_id, grp, repeat, config, status, reason, "
                   "duration_s, started_at, attempts, stack_pk")
        norm_join = ("LEFT JOIN figures n ON n.cell_pk = c.cell_pk AND n.name = "
                     f"'{NORM_PREFIX}' || COALESCE(?, c.metric)")
        if metric:
            sql = (f"SELECT {columns}, ?, f.value, params, slurm, role, n.value FROM cells c "
                   "LEFT JOIN figures f ON f.cell_pk = c.cell_pk AND f.name = ? "
                   f"{norm_join} WHERE run_pk IN ({marks}) ORDER BY run_pk, c.cell_pk")
            args: list[Any] = [metric, metric, metric, *run_pks]
        else:
            sql = (f"SELECT {columns}, c.metric, c.value, params, slurm, role, n.value "
                   f"FROM cells c {norm_join} WHERE run_pk IN ({marks}) ORDER BY run_pk, c.cell_pk")
            args = [None, *run_pks]
        rows = self.conn.execute(sql, args).fetchall()
        figs: dict[int, dict[str, float]] = {}
        if figures and rows:
            for cell_pk, name, value in self.conn.execute(
                "SELECT f.cell_pk, f.name, f.value FROM figures f JOIN cells c "
                f"ON c.cell_pk = f.cell_pk WHERE c.run_pk IN ({marks})", list(run_pks)):
                figs.setdefault(cell_pk, {})[name] = value
        return [
            CellRecord(pk, run_pk, cell_id, grp, repeat, config, status, reason or "",
                       duration, started, attempts, self._stack(stack_pk), metric, value,
                       json.loads(params), figs.get(pk, {}), json.loads(slurm) if slurm else {},
                       role, norm)
            for (pk, run_pk, cell_id, grp, repeat, config, status, reason, duration, started,
                 attempts, stack_pk, metric, value, params, slurm, role, norm) in rows
        ]

    def expected_durations(self, matrix: str, last: int = 5) -> dict[str, float]:
        """Median duration (s) of each configuration's ok cells over the last ``last`` runs of
        ``matrix`` that have any: what :mod:`orchestrator.plan.ordering` sorts by."""
        runs = [r for r in self.runs(matrix=matrix) if r.ok > 0]
        runs = runs[-last:] if last > 0 else []
        durations: dict[str, list[float]] = {}
        for cell in self.cells([r.pk for r in runs]):
            if cell.ok and cell.duration_s is not None and not cell.is_control:
                durations.setdefault(cell.config, []).append(cell.duration_s)
        return {config: statistics.median(v) for config, v in durations.items()}


def _run_record(row: Sequence[Any]) -> RunRecord:
    """A run from its row of ``runs`` (the columns of :meth:`Store.runs`, slurm_jobs and
    lock_wait_s last)."""
    jobs = tuple(json.loads(row[-2])) if row[-2] else ()
    return dataclasses.replace(RunRecord(*row[:-2]), slurm_jobs=jobs,
                               lock_wait_s=float(row[-1] or 0.0))


def _live(run: RunRecord) -> RunRecord:
    """``run`` as ``running`` when a sweep works in its folder now (:func:`live_holder`; an
    ended run too: a ``--resume`` may work in it). Costs one failed ``open`` of the lock file
    for a run nobody works in (the file goes when its holder lets go)."""
    holder = live_holder(Path(run.path))
    return dataclasses.replace(run, status="running", live=holder) if holder else run


def _lock_wait(meta: dict[str, Any], results: list[dict[str, Any]]) -> float:
    """A run's lock waits: run.json's ``lock_wait_s`` (a sweep writes it when it ends), else
    counted from its results (a run that has not ended, or one recorded before it was
    written)."""
    recorded = meta.get("lock_wait_s")
    if isinstance(recorded, int | float) and not isinstance(recorded, bool):
        return float(recorded)
    return lock_wait_of(results)


def _figures(res: dict[str, Any]) -> dict[str, float]:
    """Every numeric metric of a result and the figures derived from it."""
    params = res.get("params") or {}
    metrics = res.get("metrics") or {}
    out = {k: float(v) for k, v in metrics.items()
           if isinstance(v, int | float) and not isinstance(v, bool)}
    out.update(derived_figures(params, metrics))
    return out


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


# --- opening -----------------------------------------------------------------------------------


def _connect(location: str, busy: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    conn = sqlite3.connect(location, timeout=busy, isolation_level=None,
                           check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
        if location != ":memory:":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"journal mode {mode}, not wal")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def open_store(results_root: Path, matrices: Sequence[str] | None = None,
               refresh: bool = True, busy_timeout_s: float | None = None) -> Store:
    """Open (creating if needed) the index of ``results_root`` and refresh it for ``matrices``
    (default: every matrix). Falls back to a cache file, then to memory, where the results
    folder cannot be written.

    An index that is damaged (truncated, not a database) or is not a file at all (a folder or
    a FIFO in its place) is only a cache: it is set aside (``.damaged-<time>``) and built
    again, never taken for a read-only folder. ``busy_timeout_s``: how long to wait for another
    process writing the index (default :data:`BUSY_TIMEOUT_S`; a sweep that only wants its
    expected durations waits less)."""
    root = Path(results_root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is not a folder (give the results folder: --results, "
                          "$ORCHESTRATE_RESULTS or `results` in the config file)",
                          field="--results")
    if not root.is_dir():
        raise ConfigError(f"no results folder {root} (run a matrix first, or give the results "
                          "folder: --results, $ORCHESTRATE_RESULTS or `results` in the config "
                          "file)", field="--results")
    for name in matrices or ():
        check_name(name, "matrix")  # each names a folder under the root, never elsewhere
    busy = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    candidates: list[tuple[str, str | None]] = []
    index = ResultsRoot(root).index
    if _writable(root) and _usable_file(index):
        candidates.append((str(index), None))
    cache = _cache_index_path(root)
    candidates.append((str(cache), f"{root} <why>: index kept in {cache}"))
    candidates.append((":memory:", f"{root} <why> and {cache.parent} cannot be "
                       "written: index built in memory for this command"))
    errors = []
    why = "is read-only"  # or what the index there met (a full disk is never called damaged)
    for location, template in candidates:
        note = template.replace("<why>", why, 1) if template else None
        for attempt in (1, 2):
            try:
                if location != ":memory:":
                    Path(location).parent.mkdir(parents=True, exist_ok=True)
                store = _open_at(root, location, note, busy)
            except (OSError, sqlite3.DatabaseError) as exc:
                _refuse_if_busy(location, exc, busy)
                errors.append(f"{location}: {exc}")
                log.debug("index at %s not usable: %s", location, exc)
                why = f"cannot hold the index ({exc})"
                break
            try:
                if refresh:
                    store.refresh(matrices)
            except sqlite3.DatabaseError as exc:
                store.close()
                _refuse_if_busy(location, exc, busy)
                if attempt == 1 and _damaged(exc) and _set_aside(location, exc):
                    continue  # a damaged index, found only when read: rebuilt
                errors.append(f"{location}: {exc}")
                why = f"cannot hold the index ({exc})"
                break
            return store
    raise OrchestratorError("no usable results index: " + "; ".join(errors))


def _usable_file(index: Path) -> bool:
    """Whether ``index`` can be the index file: missing (it is made), or a writable regular
    file. Anything else in its place (a folder, a FIFO, a link) is set aside first, and so is
    anything but a regular file where SQLite keeps its write-ahead log and shared memory
    (``-wal``, ``-shm``: SQLite would write through a link there)."""
    for companion in ("-wal", "-shm"):
        side = index.with_name(index.name + companion)
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(side.lstat().st_mode):
                os.replace(side, side.with_name(f"{side.name}.damaged-{int(time.time())}"))
                log.warning("%s was not a regular file: moved aside", side)
    try:
        mode = index.lstat().st_mode
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if stat.S_ISREG(mode):
        return os.access(index, os.W_OK)
    return _set_aside(str(index), "not a regular file")


def _refuse_if_busy(location: str, exc: BaseException, busy: float) -> None:
    """An index another process keeps locked past the wait is that, not a read-only folder:
    an OrchestratorError saying so (no index is built elsewhere for it)."""
    if isinstance(exc, sqlite3.OperationalError) and any(
            word in str(exc).lower() for word in ("locked", "busy")):
        raise OrchestratorError(f"the results index {location} stayed locked by another "
                                f"orchestrate for {busy:g} s (a long re-index?); try again "
                                "when it has finished") from None


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the index file is damaged: not merely locked by another process,
    read-only, or on a full disk (SQLite's "database or disk is full", "disk I/O error": a
    healthy index is never set aside for them)."""
    text = str(exc).lower()
    return not any(word in text for word in ("locked", "busy", "readonly", "read-only",
                                             "unable to open", "full", "disk i/o"))


def _set_aside(location: str, why: object) -> bool:
    """Move a damaged index (and its WAL files) aside; whether it could be."""
    if location == ":memory:":
        return False
    aside = f"{location}.damaged-{int(time.time())}"
    try:
        os.replace(location, aside)
    except OSError as exc:
        log.debug("index %s cannot be set aside: %s", location, exc)
        return False
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.replace(location + suffix, aside + suffix)
    log.warning("index %s was damaged (%s; moved to %s); rebuilding", location, why, aside)
    return True


def _open_at(root: Path, location: str, note: str | None, busy: float = BUSY_TIMEOUT_S
             ) -> Store:
    try:
        conn = _connect(location, busy)
        store = Store(root, conn, location, note)
        store._ensure_schema()
        return store
    except sqlite3.DatabaseError as exc:
        if location == ":memory:" or not _damaged(exc) or not _set_aside(location, exc):
            raise
    # a damaged index file: it is only a cache; it was set aside, start again
    conn = _connect(location, busy)
    store = Store(root, conn, location, note)
    store._ensure_schema()
    return store
