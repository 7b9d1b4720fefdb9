"""Slurm backend: each cell is a batch job; cells of one job shape go together as one job array.

Slurm does the placement: every cell is submitted as soon as the sweep reaches it (optionally
capped per profile with ``[hardware.NAME.slurm] max_jobs``) and Slurm queues it until nodes are
free. The job runs the same program argv as the process backend, with no container (our
workload, or a ``[commands.NAME]`` template, with this Python, ``sys.executable``, and this
checkout, or the command's ``workdir``, as its working directory:
:mod:`orchestrator.runtimes.none`), so the compute nodes must share this machine's filesystem
(the usual cluster setup). The scripts are text from :mod:`orchestrator.backends.slurm_jobs`
(pure, golden files).

**Which cluster**: Slurm's clients find it through ``SLURM_CONF`` (else their built-in path).
A profile's ``[hardware.NAME.slurm] conf`` sends its cells to another cluster: every command
for them (sbatch, squeue, sacct, scancel) runs with that ``SLURM_CONF``, and so do the jobs
(sbatch exports it; their ``srun`` reads it).

**Arrays**: cells placed together whose scripts have the same job shape (the same sbatch
options) are submitted as one ``sbatch --array=0-K[%N]`` (``N``: the profile's
``array_limit``); a cell waits at most :data:`BATCH_WINDOW_S` for the others placed with it.
Each task is one cell with its own job id ``ARRAY_TASK``, state, output, timeout and result: a
failed task is that cell's failed result. ``arrays = false`` submits one job per cell. An
interrupted sweep cancels all its jobs and arrays with one ``scancel``.

**Several nodes** (``nodes > 1``): one job of ``--nodes=N``, torchrun on every node (``srun``,
one task per node), the rendezvous on the allocation's first node; the result records every
node (``hosts``) and the workload every rank's host.

**Lost, preempted, requeued**: every job is ``--no-requeue``. A job that ends ``NODE_FAIL``,
``BOOT_FAIL`` or ``PREEMPTED`` gives ``host_lost`` with Slurm's state in the reason; the sweep
keeps that attempt under ``superseded/`` and submits the cell again (``[matrix] retries``). A
job seen back in the queue after it started (requeued anyway, e.g. by an administrator) is
cancelled and reported the same way: a cell's attempts never share a job id, so its figures
come from one run only.

A cell's files, all in its cell folder:

- ``job.sbatch`` — its batch script (:func:`~orchestrator.backends.slurm_jobs.render_sbatch`):
  secret variables (:mod:`orchestrator.config.redact`) are named in a comment, never written:
  ``sbatch --export=ALL`` passes them from its own environment at submission.
- ``slurm-<job id>.out`` — the job's stdout and stderr, tailed live into ``log.txt``.
- ``command.json`` gains ``slurm``: the job id (and the array's id, task and script).

An array's own script and output go to ``<run>/slurm/``. The result's provenance gets Slurm's
accounting of the job — from ``sacct`` where accounting is enabled, else from ``scontrol show
job`` (which knows a finished job for ``MinJobAge`` seconds): ``slurm_job_id``,
``slurm_state``, ``slurm_exit_code``, ``slurm_elapsed_s``, ``slurm_node_list`` (and
``slurm_array_job_id``, ``slurm_cluster``, ``slurm_accounting``: which of the two said it),
``host`` (the first node) and ``hosts`` (every node, for several). The job's state while it
runs comes from one ``squeue`` per interval for all jobs of the sweep. A per-cell timeout or
an interrupt ``scancel``\\ s the job and waits until it has left the queue.

Under ``runtime = "apptainer"`` (or ``"singularity"``) the script runs ``srun apptainer exec
--nv --cleanenv ... IMAGE.sif <argv>`` in the cell folder, as the Apptainer runtime wraps a
batch job's command (:func:`orchestrator.runtimes.apptainer.batch_command`): the nodes need the
image and the results folder, not this checkout. ``--cleanenv`` drops the job's
environment, so the script exports what the container gets with the runtime's prefix
(``APPTAINERENV_*``; secrets again only named) and the GPUs Slurm granted as
``APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"`` (per node for several
nodes, with the rendezvous variables). ``prepare`` checks the runtime binary and bind sources
on this (submit) host and makes sure of the ``.sif`` here, in an image dir the nodes must see
(:func:`orchestrator.runtimes.apptainer.prepare`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import REPO_ROOT
from orchestrator.backends.base import Backend, Execution, ExitInfo, RunOptions
from orchestrator.backends.slurm_jobs import (
    LOST_STATES,
    OUTPUT_PATTERN,
    REQUEUED_STATES,
    TERMINAL_STATES,
    ArrayJob,
    ArrayTask,
    JobOutcome,
    SbatchJob,
    array_output,
    directive_line,
    expand_hostlist,
    gpus_of_gres,
    output_pattern,
    parse_exit_code,
    parse_job_id,
    parse_sacct,
    parse_scontrol,
    render_array,
    render_sbatch,
    shape_of,
    slurm_time,
)
from orchestrator.config.matrix_file import HardwareProfile
from orchestrator.config.redact import Scrubber, public_env, secret_env
from orchestrator.errors import (
    SHORT,
    BackendUnavailable,
    ConfigError,
    LaunchError,
    Problem,
    Requirement,
)
from orchestrator.images.sif import LocalMachine
from orchestrator.plan.launch import LaunchSpec, ScheduledNodes
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation, holds_local_gpus
from orchestrator.results.folders.run_folder import (
    CellResult,
    RunPaths,
    Status,
    make_folder,
    read_json,
    read_regular,
    write_file,
    write_json,
)
from orchestrator.runtimes import apptainer, none

__all__ = [  # the pure half lives in slurm_jobs; these names stay importable from here
    "LOST_STATES", "OUTPUT_PATTERN", "TERMINAL_STATES", "JobOutcome", "QueueWatcher",
    "SbatchJob", "SlurmBackend", "SlurmExecution", "directive_line", "gpus_of_gres",
    "output_pattern", "parse_exit_code", "parse_job_id", "parse_sacct", "parse_scontrol",
    "render_sbatch", "slurm_time",
]

log = logging.getLogger(__name__)

#: Added to the per-cell timeout for the job's ``--time``: the sweep's own timeout fires first.
TIME_MARGIN_S = 300
#: File name of a cell's batch script in its folder.
SCRIPT_NAME = "job.sbatch"
#: squeue polls of one job are at least this far apart.
POLL_INTERVAL_S = 1.0
#: A job still in the queue this long after ``scancel`` is left to Slurm (with a warning).
KILL_WAIT_S = 60.0
#: Slurm commands that fail this long in a row: the controller is gone, the cell is host_lost.
CONTROLLER_LOST_S = 120.0
#: Seconds to wait for one Slurm client command.
COMMAND_TIMEOUT_S = 30.0
#: Seconds to wait for ``sbatch`` (a busy controller answers it last).
SUBMIT_TIMEOUT_S = 60.0
#: Longest a placed cell waits for the other cells placed with it before its array is submitted
#: without them (they normally all arrive within milliseconds).
BATCH_WINDOW_S = 2.0
#: The folder of a run that holds its arrays' scripts and outputs.
ARRAY_DIR = "slurm"
#: What squeue says of each job (``-O``: these fields, ``|`` after each but the last): its id
#: (``ARRAY_TASK`` for an array's task), state, reason, nodes and how often Slurm restarted it.
SQUEUE_FORMAT = "JobArrayID:|,State:|,Reason:|,NodeList:|,RestartCnt:"


# --- running Slurm's clients ------------------------------------------------------------------


def _slurm(args: Sequence[str], timeout: float = COMMAND_TIMEOUT_S,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client (argv, no shell; ``env`` added to its environment). OSError /
    timeout -> a failed CompletedProcess."""
    try:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL,
                              env={**os.environ, **env} if env else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(list(args), 255, "", str(exc))


def _silent(conf: str | None) -> str:
    """Why the cluster of ``conf`` (None: this environment's) does not answer ``squeue``, in
    words ('' : it answers)."""
    proc = _slurm(["squeue", "-h", "-o", "%i"], timeout=15.0, env=conf_env(conf))
    if proc.returncode == 0:
        return ""
    lines = proc.stderr.strip().splitlines()
    return f"squeue: {lines[-1] if lines else 'no output'}"


def gpus_requested(cell: Cell, profile: HardwareProfile) -> int:
    """GPUs to ask Slurm for on each node: CUDA cells only (Bitfusion's GPUs are remote)."""
    if profile.device == "cuda" and holds_local_gpus(profile):
        return cell.params.gpus_per_node
    return 0


def partition_nodes(conf: str | None, partition: str | None) -> dict[str, int] | None:
    """The nodes of ``partition`` (None: the default) of the cluster of ``conf`` and the GPUs
    of each (``sinfo``), or None when sinfo can't tell."""
    args = ["sinfo", "-h", "-N", "-o", "%N|%G"] + (["-p", partition] if partition else [])
    proc = _slurm(args, timeout=15.0, env=conf_env(conf))
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    found: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        node, _, gres = line.strip().partition("|")
        if node:
            found[node] = max(found.get(node, 0), gpus_of_gres(gres))
    return found


def shortfall(gpus: int, nodes: int, found: dict[str, int], partition: str | None
              ) -> str | None:
    """Why a cell of ``nodes`` nodes with ``gpus`` GPUs each never fits the partition's nodes
    (``found``: node -> GPUs), or None."""
    where = f"partition {partition}" if partition else "the default partition"
    if nodes > len(found):
        return f"needs {nodes} nodes but {where} has {len(found)}"
    most = max(found.values(), default=0)
    if gpus > most:
        each = " on each of its nodes" if nodes > 1 else " on one node"
        return f"needs {gpus} GPUs{each} but the nodes of {where} have at most {most}"
    if nodes > 1 and gpus:
        enough = sum(1 for n in found.values() if n >= gpus)
        if enough < nodes:
            return f"needs {nodes} nodes with {gpus} GPUs each but {where} has {enough} such nodes"
    return None


def conf_env(conf: str | None) -> dict[str, str] | None:
    """The environment that points Slurm's clients at ``conf`` (None: this environment's)."""
    return {"SLURM_CONF": conf} if conf else None


def cluster_args(cluster: str | None) -> list[str]:
    """``-M CLUSTER`` for Slurm's commands when jobs run on a named cluster."""
    return ["-M", cluster] if cluster else []


def base_id(job_id: str) -> str:
    """The job id Slurm's queue knows a job by: an array task ``12_3`` -> its array ``12``."""
    return job_id.partition("_")[0]


class QueueWatcher:
    """One ``squeue`` for every job of a sweep per interval, not one per job: Slurm's own advice
    is not to poll the controller in loops, and a sweep may have hundreds of jobs queued. An
    array is asked for once, by its id (``-r``: one line per task)."""

    def __init__(self, cluster: str | None = None, interval_s: float = POLL_INTERVAL_S,
                 conf: str | None = None):
        self.cluster = cluster
        self.conf = conf
        self.interval_s = interval_s
        self.jobs: dict[str, set[str]] = {}  # queue id -> job ids (array tasks) watched
        self._lock = threading.Lock()
        self._polled_at = float("-inf")
        self._lines: dict[str, str] = {}
        self._error: str | None = None

    def add(self, job_id: str) -> None:
        with self._lock:
            self.jobs.setdefault(base_id(job_id), set()).add(job_id)
            self._polled_at = float("-inf")  # a new job: its first look is not stale

    def discard(self, job_id: str) -> None:
        with self._lock:
            watched = self.jobs.get(base_id(job_id), set())
            watched.discard(job_id)
            if not watched:
                self.jobs.pop(base_id(job_id), None)

    def look(self, job_id: str) -> tuple[str | None, str]:
        """``(error, line)``: squeue's complaint or None, and ``STATE|reason|nodes|restarts``
        of the job ("" once it has left the queue). Asks Slurm at most once per interval."""
        with self._lock:
            now = time.monotonic()
            if now - self._polled_at >= self.interval_s:
                self._polled_at = now
                # With several ids, squeue lists the live ones and skips finished ones.
                ids = ",".join(sorted(set(self.jobs) | {base_id(job_id)}))
                proc = _slurm(["squeue", *cluster_args(self.cluster), "-h", "-r", "-j", ids,
                               "-O", SQUEUE_FORMAT], env=conf_env(self.conf))
                if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
                    self._error = proc.stderr.strip() or f"exit code {proc.returncode}"
                else:
                    self._error = None
                    self._lines = {}
                    for raw in proc.stdout.splitlines():
                        jid, _, rest = raw.strip().partition("|")
                        if jid:
                            self._lines[jid] = rest
            return self._error, self._lines.get(job_id, "")


class SlurmExecution(Execution):
    """A submitted batch job (or array task): its state from ``squeue``, its output from the
    job's file."""

    _accounting: dict[str | None, bool] = {}  # sacct works (per SLURM_CONF; one probe each)

    def __init__(self, job_id: str, output_path: Path, cluster: str | None,
                 watcher: QueueWatcher, cancel: Callable[[SlurmExecution], None] | None = None):
        self.job_id = job_id
        self.output_path = output_path
        self.cluster = cluster
        self.watcher = watcher
        self.watcher.add(job_id)
        self.state = "PENDING"
        self.pending_reason = ""
        self.node: str | None = None
        #: How many nodes the job asked for: accounting that names fewer has not caught up yet.
        self.nodes = 1
        self.ran = False  # seen RUNNING (or later)
        self.killed = False
        self.outcome: JobOutcome | None = None
        #: Cancels this job in Slurm (default: ``scancel`` of it alone); the backend's cancels
        #: every job of an interrupted sweep at once.
        self.cancel = cancel or (lambda execution: execution.scancel())
        self._done = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._next_poll = 0.0
        self._failing_since: float | None = None
        self._lost_detail = ""
        #: Masks the cell's secrets in the job's output file once it ended.
        self.scrub = Scrubber(())

    @property
    def conf(self) -> str | None:
        """The slurm.conf of the job's cluster (None: this environment's)."""
        return self.watcher.conf

    @property
    def array_job_id(self) -> str | None:
        """The array's id when this job is one of its tasks."""
        return base_id(self.job_id) if "_" in self.job_id else None

    # --- state ---------------------------------------------------------------------------------

    def _poll(self) -> None:
        """The job's state from the sweep's :class:`QueueWatcher`; done once it left the queue."""
        with self._lock:
            if self._done.is_set():
                return
            error, line = self.watcher.look(self.job_id)
            if error is not None:
                now = time.monotonic()
                self._failing_since = self._failing_since or now
                log.warning("squeue for job %s failed: %s", self.job_id, error)
                if now - self._failing_since > CONTROLLER_LOST_S:
                    self._lost_detail = (f"Slurm stopped answering for {CONTROLLER_LOST_S:g} s "
                                         f"(squeue: {error})")
                    self._done.set()
                return
            self._failing_since = None
            if not line:  # gone from the queue: finished (or purged)
                self._done.set()
                self.watcher.discard(self.job_id)
                return
            state, reason, node, restarts = (line.split("|") + ["", "", ""])[:4]
            if (self.ran and state in REQUEUED_STATES) or restarts.strip() not in ("", "0"):
                self._requeued(state, reason)
                return
            self.state = state
            if state == "PENDING":
                self.pending_reason = reason
            else:
                self.ran = True
                self.node = node or self.node
            if state in TERMINAL_STATES:
                self._done.set()

    def _requeued(self, state: str, reason: str) -> None:
        """Slurm put the started job back into its queue: cancel it, report the host lost (the
        sweep runs the cell again as a new job; its runs never share one id and output)."""
        why = f"{state}, {reason}" if reason and reason != "None" else state
        self._lost_detail = (f"Slurm requeued job {self.job_id} ({why}) after it had started"
                             f"{f' on {self.node}' if self.node else ''}; cancelled, so that "
                             "the cell's attempts stay apart")
        log.info("%s", self._lost_detail)
        self.killed = True
        self.scancel()
        self.watcher.discard(self.job_id)
        self._done.set()

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not self._done.is_set():
            now = time.monotonic()
            if now >= self._next_poll:
                self._next_poll = now + self.watcher.interval_s
                self._poll()
                continue
            if now >= end:
                return False
            self._done.wait(min(end, self._next_poll) - now)
        return True

    # --- output --------------------------------------------------------------------------------

    def output(self) -> Iterator[bytes]:
        fh = None
        grace_until: float | None = None
        try:
            while not self._closed.is_set():
                finished = self._done.is_set()  # read *after* this check drains everything
                if fh is None and self.output_path.exists():
                    fh = self.output_path.open("rb")
                chunk = fh.read(65536) if fh is not None else b""
                if chunk:
                    yield chunk
                    continue
                if finished:
                    if fh is not None or not self.ran:
                        return
                    # it ran, but its file is not visible yet (a shared filesystem's delay)
                    grace_until = grace_until or time.monotonic() + 5.0
                    if time.monotonic() > grace_until:
                        return
                time.sleep(0.2)
        finally:
            if fh is not None:
                fh.close()

    # --- stop ----------------------------------------------------------------------------------

    def scancel(self, job_ids: Sequence[str] = ()) -> None:
        """``scancel`` this job (or ``job_ids`` of its cluster) now, without waiting."""
        proc = _slurm(["scancel", *cluster_args(self.cluster), *(job_ids or [self.job_id])],
                      env=conf_env(self.conf))
        if proc.returncode != 0:
            log.warning("scancel %s failed: %s", " ".join(job_ids or [self.job_id]),
                        proc.stderr.strip())

    def kill(self) -> None:
        if self._done.is_set() or self.killed:
            return
        self.killed = True
        self.cancel(self)
        if not self.wait(KILL_WAIT_S):
            log.warning("job %s is still in Slurm's queue %g s after scancel",
                        self.job_id, KILL_WAIT_S)

    # --- outcome -------------------------------------------------------------------------------

    def _query_outcome(self) -> JobOutcome | None:
        """The finished job's accounting: sacct (if accounting works on its cluster), else
        scontrol."""
        env = conf_env(self.conf)
        if SlurmExecution._accounting.get(self.conf) is not False:
            proc = _slurm(["sacct", *cluster_args(self.cluster), "-X", "-n", "-P",
                           "-j", self.job_id, "-o", "State,ExitCode,NodeList,Elapsed"], env=env)
            if proc.returncode != 0 and "accounting storage is disabled" in proc.stderr:
                SlurmExecution._accounting[self.conf] = False
            elif proc.returncode == 0:
                SlurmExecution._accounting[self.conf] = True
                found = parse_sacct(proc.stdout)
                if found and found.state in TERMINAL_STATES:
                    return found
        proc = _slurm(["scontrol", *cluster_args(self.cluster), "show", "job", "-o",
                       self.job_id], env=env)
        if proc.returncode == 0:
            found = parse_scontrol(proc.stdout)
            if found and found.state in TERMINAL_STATES:
                return found
        return None

    def exit_info(self) -> ExitInfo:
        if self._lost_detail:
            return ExitInfo(code=None, host_lost=True, detail=self._lost_detail)
        if self.outcome is None and self._done.is_set():
            deadline = time.monotonic() + 10.0  # accounting may lag a moment behind the queue
            while True:
                found = self._query_outcome()
                self.outcome = found or self.outcome
                if (found is not None and self._covers(found.node)) \
                        or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        if self.outcome is None:
            return ExitInfo(code=None, detail=f"Slurm reported no final state for job "
                            f"{self.job_id} (last seen {self.state})")
        if self.outcome.node and (not self.node or len(expand_hostlist(self.outcome.node))
                                  >= len(expand_hostlist(self.node))):
            self.node = self.outcome.node  # never narrowed: squeue may have seen them all
        return self.outcome.exit_info(self.job_id)

    def _covers(self, node_list: str | None) -> bool:
        """Whether accounting's ``node_list`` names every node the job asked for (slurmdbd
        records a multi-node job's end before its node list: ``COMPLETED|mn1`` for a second,
        then ``mn[1-2]``). A job that never started (cancelled while pending: ``None
        assigned``) or that the sweep cancelled has nothing more to wait for."""
        if self.nodes <= 1 or self.killed or (node_list is None and not self.ran):
            return True
        return node_list is not None and len(expand_hostlist(node_list)) >= self.nodes

    def close(self) -> None:
        self._closed.set()


# --- arrays: cells placed together, one submission per job shape ------------------------------


@dataclass(frozen=True)
class Submission:
    """One cell's script, ready to go to Slurm alone or in an array."""

    cell_id: str
    script: Path
    cell_dir: Path
    workdir: str
    #: The job shape and everything else its array must share (cluster, limit, secrets).
    key: tuple[Any, ...]
    conf: str | None
    limit: int | None
    secrets: dict[str, str]


@dataclass
class Batch:
    """Cells of one key waiting to be submitted together; filled in when it was."""

    submissions: list[Submission]
    deadline: float
    closed: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    job_id: str | None = None  # the array's id (or the one job's)
    cluster: str | None = None
    array: bool = False
    error: str = ""

    def job_of(self, index: int) -> str:
        """The job id of the batch's ``index``-th cell."""
        assert self.job_id is not None
        return f"{self.job_id}_{index}" if self.array else self.job_id


# --- the backend ------------------------------------------------------------------------------


class SlurmBackend(Backend):
    """Run each cell as a Slurm batch job (cells of one shape as one array); Slurm places them,
    several cells at once."""

    name = "slurm"

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        super().__init__(matrix, paths, options)
        self._lock = threading.Lock()
        self._live: set[SlurmExecution] = set()  # jobs not yet finished: cancelled at close()
        # (conf, cluster) -> one squeue per interval for all jobs there
        self._watchers: dict[tuple[str | None, str | None], QueueWatcher] = {}
        self._in_flight: dict[str, int] = {}  # hardware profile -> cells submitted
        # (conf, partition) -> {node: GPUs} (sinfo), None when sinfo can't tell
        self._nodes: dict[tuple[str | None, str | None], dict[str, int] | None] = {}
        self._coming: set[str] = set()  # cells placed that have not reached launch yet
        self._batches: dict[tuple[Any, ...], Batch] = {}  # open batches by key
        self._arrays = 0  # arrays submitted (their script names)
        self._cancelled_all = False
        # every cell a spec was made for (configurations, and the control measurements the
        # sweep runs between them, which are no cells of the matrix's plan)
        self._cells = {cell.id: cell for cell in matrix.cells}

    @classmethod
    def check_available(cls) -> None:
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "scontrol")
                   if shutil.which(tool) is None]
        if missing:
            raise BackendUnavailable(
                f"the slurm backend needs the Slurm client tools ({', '.join(missing)} not on "
                "PATH): install them (Debian: apt-get install -y slurm-client) with your "
                "cluster's slurm.conf, or choose --backend process"
            )
        silent = _silent(None)
        if silent:
            raise BackendUnavailable(
                f"Slurm does not answer ({silent}): start slurmctld/slurmd and munge "
                "(a single-node test cluster: bash tests/infra/start-slurm.sh), point "
                "SLURM_CONF at your cluster's slurm.conf, or choose --backend process"
            )

    @classmethod
    def runtime_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """Every other cluster a profile names (``slurm.conf``) answers (else a requirement of
        kind ``scheduler``, as for this environment's cluster), then the base's problems
        (Apptainer profiles), before a run folder exists."""
        cells = list(cells)
        problems: list[Problem] = []
        asked: dict[str, str] = {}  # conf -> why it does not answer ("" : it does)
        for hw in sorted({c.hardware for c in cells}):
            conf = matrix.profiles[hw].slurm.conf
            if conf is None:
                continue  # this environment's cluster: check_available asked it
            if conf not in asked:
                asked[conf] = _silent(conf)
            if asked[conf]:
                problems.append(Requirement(str(matrix.path), f"hardware.{hw}.slurm.conf", (
                    f"the Slurm cluster of {conf} does not answer ({asked[conf]}): check the "
                    "path and that its slurmctld runs, or remove conf to use this "
                    "environment's cluster"), kind="scheduler"))
        return problems + super().runtime_problems(matrix, cells)

    # --- placement: Slurm's job ----------------------------------------------------------------


    def _partition_nodes(self, profile: HardwareProfile) -> dict[str, int] | None:
        """The nodes of the profile's partition and the GPUs of each (sinfo), or None when sinfo
        can't tell."""
        opts = profile.slurm
        key = (opts.conf, opts.partition)
        with self._lock:
            if key in self._nodes:
                return self._nodes[key]
        found = partition_nodes(opts.conf, opts.partition)
        with self._lock:
            self._nodes[key] = found
        return found

    def unplaceable(self, cell: Cell) -> str | None:
        profile = self.matrix.profile(cell)
        gpus = gpus_requested(cell, profile)
        nodes = cell.params.nodes
        if not gpus and nodes == 1:
            return None
        found = self._partition_nodes(profile)
        return None if found is None else shortfall(gpus, nodes, found, profile.slurm.partition)

    @classmethod
    def target_problems(cls, matrix: Matrix, cells: Iterable[Cell]) -> list[Problem]:
        """The cluster answers (:meth:`check_available`), then what its partitions say of the
        cells, each partition asked once (``sinfo``): cells that need more nodes or GPUs than
        a partition has would be recorded unplaceable (a requirement that falls short)."""
        problems = super().target_problems(matrix, cells)
        if problems:
            return problems
        by_shape: dict[tuple[str, int, int], list[Cell]] = {}
        for cell in cells:
            gpus = gpus_requested(cell, matrix.profile(cell))
            if gpus or cell.params.nodes > 1:
                by_shape.setdefault((cell.hardware, gpus, cell.params.nodes), []).append(cell)
        asked: dict[tuple[str | None, str | None], dict[str, int] | None] = {}
        found: list[Problem] = []
        for (hw, gpus, nodes), group in sorted(by_shape.items()):
            opts = matrix.profiles[hw].slurm
            if (opts.conf, opts.partition) not in asked:
                asked[(opts.conf, opts.partition)] = partition_nodes(opts.conf, opts.partition)
            known = asked[(opts.conf, opts.partition)]
            why = None if known is None else shortfall(gpus, nodes, known, opts.partition)
            if why:
                found.append(Requirement(str(matrix.path), f"hardware.{hw}.slurm", (
                    f"{len(group)} cells ({', '.join(c.id for c in group[:2])}"
                    f"{', ...' if len(group) > 2 else ''}): each {why}: they would be recorded "
                    "unplaceable"), kind="GPUs" if gpus else "scheduler",
                    cells=tuple(c.id for c in group), state=SHORT))
        return found

    def allocate(self, cell: Cell) -> Allocation | None:
        profile = self.matrix.profile(cell)
        cap = profile.slurm.max_jobs
        with self._lock:
            count = self._in_flight.get(cell.hardware, 0)
            if cap is not None and count >= cap:
                return None
            self._in_flight[cell.hardware] = count + 1
            self._coming.add(cell.id)
        return Allocation.local(cell.id)  # the nodes and their GPUs: Slurm's choice

    def lock_requests(self, cell: Cell, allocation: Allocation) -> tuple[()]:
        """Nothing: Slurm allocates nodes and GPUs itself, to one job at a time."""
        return ()

    def release(self, cell: Cell, allocation: Allocation) -> None:
        with self._lock:
            self._in_flight[cell.hardware] = max(0, self._in_flight.get(cell.hardware, 1) - 1)
            ripe = self._arrived(cell.id)
        self._submit_all(ripe)

    # --- cells ---------------------------------------------------------------------------------

    def _time_limit(self, profile: HardwareProfile) -> str:
        return profile.slurm.time_limit or slurm_time(self.options.timeout_s + TIME_MARGIN_S)

    def _multi_node(self, cell: Cell) -> ScheduledNodes | None:
        """The torchrun role of every node of a multi-node cell; None for one node, or for a
        program that starts its own ranks (``launcher = "self"``: started once)."""
        program = self.matrix.program(cell)
        if cell.params.nodes == 1 or (program.command and program.command.launcher == "self"):
            return None
        return ScheduledNodes(cell.params.nodes, cell.params.gpus_per_node, cell.id)

    def sbatch_job(self, cell: Cell) -> SbatchJob:
        """The batch script's content for ``cell`` (what
        :func:`~orchestrator.backends.slurm_jobs.render_sbatch` renders): its program with this
        Python, in this checkout or the command's ``workdir``
        (:func:`orchestrator.runtimes.none.command`)."""
        profile = self.matrix.profile(cell)
        cell_dir = self.paths.absolute_cell_dir(cell.id)  # the job may run elsewhere
        if profile.apptainer_runtime:
            return self._apptainer_job(cell, cell_dir)
        node = self._multi_node(cell)
        command = none.command(cell, profile, self.matrix.program(cell),
                               output_dir=cell_dir, node=node)  # GPUs: Slurm's
        env = dict(command.env)
        env["PYTHONPATH"] = none.python_path()
        assert command.workdir is not None  # none.command's: the command's, else this checkout
        return SbatchJob(
            cell_id=cell.id,
            argv=tuple(command.argv),
            env=env,
            output=output_pattern(cell_dir),
            workdir=command.workdir,
            time_limit=self._time_limit(profile),
            gpus=gpus_requested(cell, profile),
            options=profile.slurm,
            program=command.program,
            nodes=cell.params.nodes,
            per_node=node is not None,
            tasks_per_node=1 if node is not None else cell.params.gpus_per_node,
        )

    def _apptainer_job(self, cell: Cell, cell_dir: str) -> SbatchJob:
        """The batch script of an Apptainer cell: ``srun apptainer exec ... IMAGE.sif <argv>``
        in the cell folder (the nodes need the image and that folder, not this checkout); the
        variables ``--env`` cannot carry exported with the runtime's prefix (secrets: passed by
        sbatch, never written), the job's GPUs passed in at run time. Several nodes: the
        multi-node ``srun`` runs ``apptainer exec`` on each."""
        profile = self.matrix.profile(cell)
        node = self._multi_node(cell)
        gpus = gpus_requested(cell, profile)
        command = apptainer.batch_command(cell, profile, self.matrix.program(cell),
                                          image=self.runtime_image(cell),
                                          output_dir=cell_dir, gpus=bool(gpus), node=node)
        prefix = apptainer.env_prefix(apptainer.binary_of(profile))
        nodes = cell.params.nodes
        return SbatchJob(
            cell_id=cell.id,
            argv=tuple(command.argv) if nodes > 1 else ("srun", *command.argv),
            env=command.env,
            output=output_pattern(cell_dir),
            workdir=str(cell_dir),
            time_limit=self._time_limit(profile),
            gpus=gpus,
            options=profile.slurm,
            program=command.program,
            gpu_env=command.gpu_env,
            runtime=command.runtime,
            nodes=nodes,
            per_node=node is not None,
            env_prefix=prefix if nodes > 1 else "",
            tasks_per_node=1 if node is not None else cell.params.gpus_per_node,
        )

    def submission_lines(self, cells: list[Cell]) -> list[str]:
        """How ``cells`` would go to Slurm if the sweep placed them together (``--dry-run``):
        the arrays (cells of one job shape, cluster and limit) and the jobs of their own, each
        with its shape. Nothing is submitted."""
        groups: dict[tuple[Any, ...], list[Cell]] = {}
        shapes: dict[int, tuple[Any, ...]] = {}  # the repeats of a configuration share one
        for cell in cells:
            opts = self.matrix.profile(cell).slurm
            shape = shapes.get(id(cell.params))
            if shape is None:
                job = self.sbatch_job(cell)
                shape = shapes[id(cell.params)] = (
                    shape_of(render_sbatch(job)), opts.conf, opts.array_limit,
                    tuple(sorted(set(job.env) - set(public_env(job.env)))))
            groups.setdefault((*shape, None if opts.arrays else cell.id), []).append(cell)
        lines = ["slurm submissions (cells of one job shape placed together: one array):"]
        for (shape, conf, limit, *_), members in groups.items():
            options = " ".join(line.removeprefix("#SBATCH ") for line in shape)
            where = f" on {conf}" if conf else ""
            if len(members) == 1:
                lines.append(f"  job {members[0].id}{where}: {options}")
            else:
                spec = f"0-{len(members) - 1}" + (f"%{limit}" if limit else "")
                lines.append(f"  array of {len(members)} cells (--array={spec}){where}: "
                             f"{options}")
        return lines

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Apptainer profiles: their runtime binary and bind sources on this (submit) host, the
        best proxy for the nodes that share its filesystem; their images made here, where the
        nodes see them (a shared image dir)."""
        if any(self.matrix.profile(c).apptainer_runtime for c in cells):
            self.sif_paths = apptainer.prepare(self.matrix, cells, LocalMachine(), on_log=on_log)

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        """The cell's argv and environment, with the batch script that runs them."""
        with self._lock:
            self._cells.setdefault(cell.id, cell)
        job = self.sbatch_job(cell)
        profile = self.matrix.profile(cell)
        env = {k: v for k, v in job.env.items() if k != "PYTHONPATH"}
        cell_dir = str(self.paths.cell_dir(cell.id))
        return LaunchSpec(
            cell_id=cell.id, argv=job.argv, env=env, device=profile.device,
            workdir=job.workdir, output_dir=cell_dir,
            labels={"slurm.script": f"{cell_dir}/{SCRIPT_NAME}"},
            attempt=attempt, script=render_sbatch(job), program=job.program,
            image=job.runtime.get("image"), runtime=job.runtime,
        )

    def _submission(self, spec: LaunchSpec, script: Path) -> Submission:
        """What goes to Slurm for ``spec`` and with which other cells it may share an array."""
        assert spec.script is not None
        cell = self._cells.get(spec.cell_id)
        if cell is None:
            raise LaunchError(f"{spec.cell_id}: not a cell of matrix {self.matrix.name}")
        opts = self.matrix.profile(cell).slurm
        secrets = secret_env(spec.env)  # never in the script: sbatch's environment carries them
        # without arrays, a key of its own: never batched with another cell
        key: tuple[Any, ...] = (shape_of(spec.script), opts.conf, opts.array_limit,
                                tuple(sorted(secrets.items())),
                                None if opts.arrays else spec.cell_id)
        return Submission(spec.cell_id, script, script.parent.resolve(),
                          spec.workdir or str(REPO_ROOT), key, opts.conf, opts.array_limit,
                          secrets)

    def launch(self, spec: LaunchSpec) -> Execution:
        """Write the spec's batch script into the cell folder and hand it to Slurm: alone, or
        in one array with the other cells of its shape placed with it (waiting for them at
        most :data:`BATCH_WINDOW_S`)."""
        if spec.script is None:
            raise LaunchError(f"{spec.cell_id}: no batch script was rendered for it")
        cell_dir = self.paths.cell_dir(spec.cell_id)
        script_path = cell_dir / SCRIPT_NAME
        write_file(script_path, spec.script)
        submission = self._submission(spec, script_path)
        with self._lock:
            batch = self._batches.get(submission.key)
            if batch is None or batch.closed:
                batch = self._batches[submission.key] = Batch(
                    [], time.monotonic() + BATCH_WINDOW_S)
            batch.submissions.append(submission)
            index = len(batch.submissions) - 1
            ripe = self._arrived(spec.cell_id)
        self._submit_all(ripe)
        self._wait_submitted(batch)
        if batch.error:
            raise LaunchError(f"sbatch refused {spec.cell_id}: {batch.error}")
        job_id = batch.job_of(index)
        log.info("%s: submitted as Slurm job %s", spec.cell_id, job_id)
        output = (Path(array_output(str(cell_dir), str(batch.job_id), index)) if batch.array
                  else cell_dir / f"slurm-{job_id}.out")
        with self._lock:
            watcher = self._watchers.setdefault(
                (submission.conf, batch.cluster),
                QueueWatcher(batch.cluster, conf=submission.conf))
        execution = SlurmExecution(job_id, output, batch.cluster, watcher, cancel=self._cancel)
        execution.scrub = Scrubber(submission.secrets.values())
        execution.nodes = self._cells[spec.cell_id].params.nodes
        with self._lock:
            self._live.add(execution)
        self._record_job(spec.cell_id, execution, script_path, batch)
        return execution

    def _arrived(self, cell_id: str) -> list[Batch]:
        """(Lock held.) ``cell_id`` reached launch or ended: when no placed cell is still on
        its way, every open batch is ripe; they are returned closed, to be submitted."""
        self._coming.discard(cell_id)
        if self._coming:
            return []
        ripe = [b for b in self._batches.values() if not b.closed]
        for batch in ripe:
            batch.closed = True
        self._batches.clear()
        return ripe

    def _wait_submitted(self, batch: Batch) -> None:
        """Until ``batch`` was submitted; past its deadline, this thread submits it."""
        while not batch.done.is_set():
            left = batch.deadline - time.monotonic()
            if left <= 0:
                with self._lock:
                    mine = not batch.closed
                    batch.closed = True
                    for key, open_batch in list(self._batches.items()):
                        if open_batch is batch:
                            del self._batches[key]
                if mine:
                    self._submit(batch)
                batch.done.wait(SUBMIT_TIMEOUT_S + 5.0)
                if not batch.done.is_set():
                    batch.error = batch.error or "the submission did not finish"
                return
            batch.done.wait(left)

    def _submit_all(self, batches: list[Batch]) -> None:
        for batch in batches:
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        """One ``sbatch`` for the whole batch: its cell's own script when it has one cell, else
        an array of them all; sets the batch's job id (or error) and wakes its cells."""
        try:
            first = batch.submissions[0]
            array = len(batch.submissions) > 1
            script = self._write_array(batch) if array else first.script
            export = ["--export=ALL"] if first.secrets else []
            env = {**first.secrets, **(conf_env(first.conf) or {})}
            proc = _slurm(["sbatch", "--parsable", *export, str(script)],
                          timeout=SUBMIT_TIMEOUT_S, env=env or None)
            if proc.returncode != 0:
                batch.error = (proc.stderr.strip() or proc.stdout.strip()
                               or f"exit code {proc.returncode}")
            else:
                batch.job_id, batch.cluster = parse_job_id(proc.stdout)
                batch.array = array
                if array:
                    log.info("%d cells submitted as array %s (%s)", len(batch.submissions),
                             batch.job_id, script)
        except (OSError, LaunchError) as exc:
            batch.error = str(exc)
        finally:
            batch.done.set()

    def _write_array(self, batch: Batch) -> Path:
        """The array script of ``batch`` in the run's ``slurm/`` folder."""
        folder = make_folder(self.paths.root / ARRAY_DIR)
        with self._lock:
            self._arrays += 1
            number = self._arrays
        while (folder / f"array-{number}.sbatch").exists():  # a resumed run's earlier arrays
            number += 1
        first = batch.submissions[0]
        job = ArrayJob(
            name=f"orchestrate-{self.matrix.name}",
            shape=first.key[0],
            tasks=tuple(ArrayTask(str(s.cell_dir), s.workdir, str(s.script.resolve()))
                        for s in batch.submissions),
            output=str(folder.resolve()).replace("%", "%%") + "/array-%A_%a.out",
            limit=first.limit,
        )
        path = folder / f"array-{number}.sbatch"
        write_file(path, render_array(job))
        return path

    def _record_job(self, cell_id: str, execution: SlurmExecution, script: Path,
                    batch: Batch) -> None:
        """Add the job id to command.json right away (an interrupted sweep keeps it too)."""
        path = self.paths.cell_command(cell_id)
        try:
            command = read_json(path)
            if not isinstance(command, dict):
                raise ValueError("not an object")
        except (ConfigError, ValueError):
            command = {"cell_id": cell_id}
        record: dict[str, Any] = {"job_id": execution.job_id, "cluster": execution.cluster,
                                  "script": str(script), "output": str(execution.output_path)}
        if execution.conf:
            record["conf"] = execution.conf
        if batch.array:
            record.update(array_job_id=batch.job_id, array_task=int(
                execution.job_id.rpartition("_")[2]), array_size=len(batch.submissions))
        command["slurm"] = record
        write_json(path, command)

    def _cancel(self, execution: SlurmExecution) -> None:
        """Cancel ``execution``'s job: alone (its timeout), or, once the sweep is interrupted,
        every job and array of the sweep with one ``scancel`` per cluster."""
        if not self.options.cancel.is_set():
            execution.scancel()
            return
        with self._lock:
            if self._cancelled_all:
                return
            self._cancelled_all = True
            live = list(self._live)
        by_target: dict[tuple[str | None, str | None], SlurmExecution] = {}
        ids: dict[tuple[str | None, str | None], set[str]] = {}
        for job in [execution, *live]:
            target = (job.conf, job.cluster)
            by_target.setdefault(target, job)
            ids.setdefault(target, set()).add(job.array_job_id or job.job_id)
        for target, job in by_target.items():
            log.info("the sweep was interrupted: cancelling Slurm jobs %s",
                     " ".join(sorted(ids[target])))
            job.scancel(sorted(ids[target]))

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """Add Slurm's accounting of the job (id, state, exit code, elapsed, nodes); explain
        Slurm's own ends."""
        assert isinstance(execution, SlurmExecution)
        with self._lock:
            self._live.discard(execution)
        result.provenance.update(slurm_accounting(execution))
        hosts = expand_hostlist(execution.node) if execution.node else []
        if hosts:
            result.provenance["host"] = hosts[0]
        if len(hosts) > 1:
            result.provenance["hosts"] = hosts
        if execution.scrub and execution.output_path.exists():
            # Slurm wrote what the workload printed, secrets too: mask them there as in log.txt
            data = read_regular(execution.output_path)
            write_file(execution.output_path, execution.scrub(data))
        self._explain(result, execution)

    def _explain(self, result: CellResult, execution: SlurmExecution) -> None:
        """Slurm's own ends (its time limit, an outside scancel) and queue waits, in words."""
        state = execution.outcome.state if execution.outcome else None
        if result.status is Status.TIMEOUT and not execution.ran:
            result.reason += (f"; the job never started: Slurm kept it PENDING "
                              f"({execution.pending_reason or 'no reason given'})")
        elif execution.killed or result.status is not Status.FAILED:
            return
        elif state in ("TIMEOUT", "DEADLINE"):
            result.status = Status.TIMEOUT
            result.reason = f"Slurm stopped job {execution.job_id} at its time limit ({state})"
        elif state == "CANCELLED":
            result.status = Status.CANCELLED
            result.reason = f"Slurm job {execution.job_id} was cancelled outside the sweep"

    def close(self) -> None:
        """Cancel any job of this sweep still in Slurm (cells that never reported back)."""
        with self._lock:
            left = list(self._live)
            self._live.clear()
        for execution in left:
            execution.kill()
            execution.close()


def slurm_accounting(execution: SlurmExecution) -> dict[str, Any]:
    """The provenance keys of a job's accounting: its id, Slurm's final state, exit code,
    elapsed time and node list, and where they came from (sacct or scontrol)."""
    outcome = execution.outcome
    info: dict[str, Any] = {
        "slurm_job_id": execution.job_id,
        "slurm_state": outcome.state if outcome else execution.state,
    }
    if execution.array_job_id:
        info["slurm_array_job_id"] = execution.array_job_id
    if execution.cluster:
        info["slurm_cluster"] = execution.cluster
    if outcome is not None:
        info.update(slurm_exit_code=outcome.exit_code or None,
                    slurm_elapsed_s=outcome.elapsed_s, slurm_accounting=outcome.source)
    if execution.node:
        info["slurm_node_list"] = execution.node
    return info

