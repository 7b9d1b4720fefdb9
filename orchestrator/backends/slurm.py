"""Slurm backend: each cell is one batch job, submitted with ``sbatch``.

Slurm does the placement: every cell is submitted as soon as the sweep reaches it (optionally
capped per profile with ``[hardware.NAME.slurm] max_jobs``) and Slurm queues it until a node is
free. The job runs the same program argv as the process backend, with no container (our
workload, or a ``[commands.NAME]`` template, with this Python, ``sys.executable``, and this
checkout, or the command's ``workdir``, as its working directory:
:mod:`orchestrator.runtimes.none`), so the compute nodes must share this machine's filesystem
(the usual cluster setup; a single-node test cluster is this machine).

A cell's files, all in its cell folder:

- ``job.sbatch`` — the generated batch script (:func:`render_sbatch`, a pure function): the
  ``#SBATCH`` options, ``export`` of the workload's environment and ``exec`` of its argv, every
  value shell-quoted. Secret variables (:mod:`orchestrator.config.redact`) are named in a comment,
  never written: ``sbatch --export=ALL`` passes them from its own environment at submission.
  It is rendered into the cell's launch spec (``LaunchSpec.script``) and
  written when the cell is submitted. Slurm sets ``CUDA_VISIBLE_DEVICES`` for the
  ``--gres=gpu:N`` it grants.
- ``slurm-<job id>.out`` — the job's stdout and stderr, tailed live into ``log.txt``.
- ``command.json`` gains ``slurm.job_id``; the result's provenance has the job id, its final
  Slurm state and the node it ran on.

The job's state comes from ``squeue`` (polled at most once a second), its outcome from ``sacct``
where accounting is enabled, else from ``scontrol show job`` (which knows a finished job for
``MinJobAge`` seconds). A per-cell timeout or an interrupt ``scancel``\\ s the job and waits until
it has left the queue.

Under ``runtime = "apptainer"`` (or ``"singularity"``) the script runs ``srun apptainer exec
--nv --cleanenv ... IMAGE.sif <argv>`` in the cell folder, as the Apptainer runtime wraps a
batch job's command (:func:`orchestrator.runtimes.apptainer.batch_command`): the nodes need the
image and the results folder, not this checkout. ``--cleanenv`` drops the job's environment, so
the script exports what the container gets with the runtime's prefix (``APPTAINERENV_*``;
secrets again only named) and the GPUs Slurm granted as
``APPTAINERENV_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"``. ``prepare`` checks the
runtime binary and bind sources on this (submit) host and makes sure of the ``.sif`` here, in
an image dir the nodes must see (:func:`orchestrator.runtimes.apptainer.prepare`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Backend, Execution, ExitInfo, RunOptions
from orchestrator.config.matrix_file import HardwareProfile, SlurmOptions
from orchestrator.config.redact import Scrubber, public_env, secret_env
from orchestrator.errors import BackendUnavailable, LaunchError
from orchestrator.images.sif import LocalMachine
from orchestrator.plan.launch import LaunchSpec
from orchestrator.plan.matrix import Cell, Matrix
from orchestrator.plan.placement import Allocation
from orchestrator.results.run_folder import CellResult, RunPaths, Status, write_json
from orchestrator.runtimes import apptainer, none

log = logging.getLogger(__name__)

#: Added to the per-cell timeout for the job's ``--time``: the sweep's own timeout fires first.
TIME_MARGIN_S = 300
#: File names in the cell folder.
SCRIPT_NAME = "job.sbatch"
OUTPUT_PATTERN = "slurm-%j.out"
#: squeue polls of one job are at least this far apart.
POLL_INTERVAL_S = 1.0
#: A job still in the queue this long after ``scancel`` is left to Slurm (with a warning).
KILL_WAIT_S = 60.0
#: Slurm commands that fail this long in a row: the controller is gone, the cell is host_lost.
CONTROLLER_LOST_S = 120.0
#: Seconds to wait for one Slurm client command.
COMMAND_TIMEOUT_S = 30.0

#: Job states in which a job no longer runs.
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
})
#: Terminal states that mean the node (not the workload) failed: the sweep may retry the cell.
LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})

_SAFE_DIRECTIVE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


# --- the batch script (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class SbatchJob:
    """Everything the batch script of one cell says; :func:`render_sbatch` turns it into text."""

    cell_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    output: str  # the --output pattern (``%j`` is the job id)
    workdir: str
    time_limit: str
    gpus: int = 0  # --gres=gpu:N; 0 for CPU cells (and Bitfusion, whose GPUs are remote)
    options: SlurmOptions = field(default_factory=SlurmOptions)
    #: What program the job runs (for command.json and provenance; not in the script).
    program: dict[str, Any] = field(default_factory=dict, compare=False)
    #: A variable the script sets to the job's ``CUDA_VISIBLE_DEVICES`` (Slurm's allocation, at
    #: run time) before ``argv`` starts: ``APPTAINERENV_CUDA_VISIBLE_DEVICES`` carries it into
    #: an Apptainer container, whose ``--cleanenv`` drops the job's own environment.
    gpu_env: str | None = None
    #: The container runtime that runs ``argv`` (command.json and provenance; not in the script).
    runtime: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def job_name(self) -> str:
        return f"orchestrate-{self.cell_id}"

    def directives(self) -> list[str]:
        """The sbatch options, in script order."""
        opts = self.options
        out = [
            f"--job-name={self.job_name}",
            f"--output={self.output}",
            "--nodes=1",
            "--ntasks=1",
            f"--time={self.time_limit}",
            f"--chdir={self.workdir}",
        ]
        if self.gpus:
            out.append(f"--gres=gpu:{self.gpus}")
        for flag, value in (
            ("partition", opts.partition), ("account", opts.account), ("qos", opts.qos),
            ("cpus-per-task", opts.cpus_per_task), ("cpus-per-gpu", opts.cpus_per_gpu if
                                                    self.gpus else None),
            ("mem", opts.mem),
        ):
            if value is not None:
                out.append(f"--{flag}={value}")
        return out + list(opts.extra_args)


def directive_line(option: str) -> str:
    """One ``#SBATCH`` line; values sbatch would split are double-quoted (sbatch's own rules)."""
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in option):
        raise LaunchError(f"sbatch option {option!r} contains a control character")
    if _SAFE_DIRECTIVE.match(option):
        return f"#SBATCH {option}"
    name, eq, value = option.partition("=")
    if eq and _SAFE_DIRECTIVE.match(name):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'#SBATCH {name}="{escaped}"'
    escaped = option.replace("\\", "\\\\").replace('"', '\\"')
    return f'#SBATCH "{escaped}"'


def render_sbatch(job: SbatchJob) -> str:
    """The batch script of ``job``. Pure; every value the shell sees is :func:`shlex.quote`\\ d."""
    lines = [
        "#!/bin/bash",
        f"# orchestrate cell {job.cell_id}: generated; submitted with `sbatch --parsable`.",
        *(directive_line(opt) for opt in job.directives()),
        "",
        'echo "# slurm job ${SLURM_JOB_ID:-?} on $(hostname)'
        ' CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"',
    ]
    for key in job.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"{job.cell_id}: environment variable name {key!r} is not valid")
    secret = sorted(set(job.env) - set(public_env(job.env)))
    if secret:
        lines.append(f"# passed by sbatch from the submitting environment, not written here: "
                     f"{' '.join(secret)}")
    for key, value in public_env(job.env).items():
        lines.append(f"export {key}={shlex.quote(value)}")
    if job.gpu_env and job.gpus:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", job.gpu_env):
            raise LaunchError(f"{job.cell_id}: environment variable name {job.gpu_env!r} is "
                              "not valid")
        lines.append("# the GPUs Slurm gave this job, passed into the container explicitly")
        lines.append(f'export {job.gpu_env}="${{CUDA_VISIBLE_DEVICES-}}"')
    lines.append("exec " + " ".join(shlex.quote(arg) for arg in job.argv))
    return "\n".join(lines) + "\n"


def slurm_time(seconds: float) -> str:
    """``--time`` for ``seconds``, rounded up to whole minutes: ``[D-]HH:MM:SS``."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def output_pattern(cell_dir: Path) -> str:
    """``--output`` for a cell folder: ``%`` in the folder escaped for Slurm's filename patterns."""
    return str(cell_dir).replace("%", "%%") + "/" + OUTPUT_PATTERN


# --- parsing Slurm's answers (pure) -----------------------------------------------------------


def parse_job_id(text: str) -> tuple[str, str | None]:
    """``sbatch --parsable`` output -> (job id, cluster or None); ``123`` or ``123;cluster``."""
    line = text.strip().splitlines()[-1] if text.strip() else ""
    job_id, _, cluster = line.partition(";")
    job_id = job_id.strip()
    if not job_id.isdigit():
        raise LaunchError(f"sbatch printed no job id (got {text.strip()!r})")
    return job_id, cluster.strip() or None


def parse_exit_code(text: str) -> int | None:
    """Slurm's ``ExitCode`` ``"code:signal"`` -> a returncode (``-signal`` when killed)."""
    code, _, sig = text.strip().partition(":")
    try:
        status, signum = int(code), int(sig or 0)
    except ValueError:
        return None
    return -signum if signum else status


def gpus_of_gres(gres: str) -> int:
    """GPUs in an ``sinfo`` Gres string: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)`` -> 0."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres):
        parts = re.sub(r"\(.*\)", "", item).strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


@dataclass(frozen=True)
class JobOutcome:
    """How Slurm says a job ended."""

    state: str  # first word of the state: "CANCELLED by 0" -> CANCELLED
    exit_code: str = ""
    node: str | None = None
    reason: str = ""

    def exit_info(self) -> ExitInfo:
        """As the base's :class:`ExitInfo`."""
        code = parse_exit_code(self.exit_code) if self.exit_code else None
        where = f" on {self.node}" if self.node else ""
        if self.state == "COMPLETED":
            return ExitInfo(code=code or 0)
        if self.state == "FAILED":
            if code:
                return ExitInfo(code=code)
            why = self.reason or "no reason given"
            return ExitInfo(code=1, detail=f"Slurm: job FAILED{where} ({why})")
        if self.state == "OUT_OF_MEMORY":
            return ExitInfo(code=code, oom=True,
                            detail=f"Slurm: OUT_OF_MEMORY (the job exceeded its memory{where})")
        if self.state in LOST_STATES:
            return ExitInfo(code=code, host_lost=True, detail=f"Slurm: job {self.state}{where}")
        return ExitInfo(code=code, detail=f"Slurm: job {self.state}{where}")


def parse_sacct(text: str) -> JobOutcome | None:
    """The job's line of ``sacct -X -n -P -o State,ExitCode,NodeList``."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[0]:
            node = fields[2] if len(fields) > 2 and fields[2] not in ("", "None assigned") else None
            return JobOutcome(state=fields[0].split()[0], exit_code=fields[1], node=node)
    return None


def parse_scontrol(text: str) -> JobOutcome | None:
    """``scontrol show job -o ID``: JobState, ExitCode, NodeList, Reason."""
    values = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in values:
        return None
    node = values.get("NodeList")
    reason = values.get("Reason", "")
    return JobOutcome(
        state=values["JobState"], exit_code=values.get("ExitCode", ""),
        node=None if node in (None, "", "(null)") else node,
        reason="" if reason in ("None", "(null)") else reason,
    )


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


class QueueWatcher:
    """One ``squeue`` for every job of a sweep per interval, not one per job: Slurm's own advice
    is not to poll the controller in loops, and a sweep may have hundreds of jobs queued."""

    def __init__(self, cluster: str | None = None, interval_s: float = POLL_INTERVAL_S):
        self.cluster = cluster
        self.interval_s = interval_s
        self.jobs: set[str] = set()
        self._lock = threading.Lock()
        self._polled_at = float("-inf")
        self._lines: dict[str, str] = {}
        self._error: str | None = None

    def add(self, job_id: str) -> None:
        with self._lock:
            self.jobs.add(job_id)
            self._polled_at = float("-inf")  # a new job: its first look is not stale

    def discard(self, job_id: str) -> None:
        with self._lock:
            self.jobs.discard(job_id)

    def look(self, job_id: str) -> tuple[str | None, str]:
        """``(error, line)``: squeue's complaint or None, and ``STATE|reason|node`` of the job
        ("" once it has left the queue). Asks Slurm at most once per interval."""
        with self._lock:
            now = time.monotonic()
            if now - self._polled_at >= self.interval_s:
                self._polled_at = now
                # With several ids, squeue lists the live ones and skips finished ones.
                ids = ",".join(sorted(self.jobs | {job_id}))
                proc = _slurm(["squeue", *cluster_args(self.cluster), "-h", "-j", ids,
                               "-o", "%i|%T|%r|%N"])
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


def cluster_args(cluster: str | None) -> list[str]:
    """``-M CLUSTER`` for Slurm's commands when jobs run on a named cluster."""
    return ["-M", cluster] if cluster else []


class SlurmExecution(Execution):
    """A submitted batch job: its state from ``squeue``, its output from the job's file."""

    _accounting: bool | None = None  # sacct works here (shared: one probe per process)

    def __init__(self, job_id: str, output_path: Path, cluster: str | None,
                 watcher: QueueWatcher):
        self.job_id = job_id
        self.output_path = output_path
        self.cluster = cluster
        self.watcher = watcher
        self.watcher.add(job_id)
        self.state = "PENDING"
        self.pending_reason = ""
        self.node: str | None = None
        self.ran = False  # seen RUNNING (or later)
        self.killed = False
        self.outcome: JobOutcome | None = None
        self._done = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._next_poll = 0.0
        self._failing_since: float | None = None
        self._lost_detail = ""
        #: Masks the cell's secrets in the job's output file once it ended.
        self.scrub = Scrubber(())

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
            state, _, rest = line.partition("|")
            reason, _, node = rest.partition("|")
            self.state = state
            if state == "PENDING":
                self.pending_reason = reason
            else:
                self.ran = True
                self.node = node or self.node
            if state in TERMINAL_STATES:
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

    def kill(self) -> None:
        if self._done.is_set() or self.killed:
            return
        self.killed = True
        proc = _slurm(["scancel", *cluster_args(self.cluster), self.job_id])
        if proc.returncode != 0:
            log.warning("scancel %s failed: %s", self.job_id, proc.stderr.strip())
        if not self.wait(KILL_WAIT_S):
            log.warning("job %s is still in Slurm's queue %g s after scancel",
                        self.job_id, KILL_WAIT_S)

    # --- outcome -------------------------------------------------------------------------------

    def _query_outcome(self) -> JobOutcome | None:
        """The finished job's state: sacct (if accounting works here), else scontrol."""
        if SlurmExecution._accounting is not False:
            proc = _slurm(["sacct", *cluster_args(self.cluster), "-X", "-n", "-P",
                           "-j", self.job_id, "-o", "State,ExitCode,NodeList"])
            if proc.returncode != 0 and "accounting storage is disabled" in proc.stderr:
                SlurmExecution._accounting = False
            elif proc.returncode == 0:
                SlurmExecution._accounting = True
                found = parse_sacct(proc.stdout)
                if found and found.state in TERMINAL_STATES:
                    return found
        proc = _slurm(["scontrol", *cluster_args(self.cluster), "show", "job", "-o", self.job_id])
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
            while self.outcome is None:
                self.outcome = self._query_outcome()
                if self.outcome is not None or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        if self.outcome is None:
            return ExitInfo(code=None, detail=f"Slurm reported no final state for job "
                            f"{self.job_id} (last seen {self.state})")
        self.node = self.outcome.node or self.node
        return self.outcome.exit_info()

    def close(self) -> None:
        self._closed.set()


# --- the backend ------------------------------------------------------------------------------


class SlurmBackend(Backend):
    """Run each cell as a Slurm batch job; Slurm places them, several cells at once."""

    name = "slurm"

    def __init__(self, matrix: Matrix, paths: RunPaths, options: RunOptions):
        super().__init__(matrix, paths, options)
        self._lock = threading.Lock()
        self._live: set[SlurmExecution] = set()  # jobs not yet finished: cancelled at close()
        self._watchers: dict[str | None, QueueWatcher] = {}  # cluster -> one squeue per interval
        self._in_flight: dict[str, int] = {}  # hardware profile -> cells submitted
        self._max_gpus: dict[str | None, int | None] = {}  # partition -> most GPUs of a node

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
        proc = _slurm(["squeue", "-h", "-o", "%i"], timeout=15.0)
        if proc.returncode != 0:
            detail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"
            raise BackendUnavailable(
                f"Slurm does not answer (squeue: {detail}): start slurmctld/slurmd and munge "
                "(a single-node test cluster: bash tests/infra/start-slurm.sh), "
                "or choose --backend process"
            )

    # --- placement: Slurm's job ----------------------------------------------------------------

    def _gpus_requested(self, cell: Cell, profile: HardwareProfile) -> int:
        """GPUs to ask Slurm for: CUDA cells only (Bitfusion's GPUs are remote)."""
        if profile.device == "cuda" and profile.wrapper == "none":
            return cell.params.gpus
        return 0

    def _partition_max_gpus(self, partition: str | None) -> int | None:
        """Most GPUs one node of ``partition`` has (sinfo), or None when sinfo can't tell."""
        with self._lock:
            if partition in self._max_gpus:
                return self._max_gpus[partition]
        args = ["sinfo", "-h", "-N", "-o", "%G"] + (["-p", partition] if partition else [])
        proc = _slurm(args, timeout=15.0)
        lines = proc.stdout.split() if proc.returncode == 0 else []
        found = max((gpus_of_gres(g) for g in lines), default=0) if lines else None
        with self._lock:
            self._max_gpus[partition] = found
        return found

    def unplaceable(self, cell: Cell) -> str | None:
        profile = self.matrix.profile(cell)
        gpus = self._gpus_requested(cell, profile)
        if not gpus:
            return None
        partition = profile.slurm.partition
        most = self._partition_max_gpus(partition)
        if most is not None and gpus > most:
            where = f"partition {partition}" if partition else "the default partition"
            return f"needs {gpus} GPUs on one node but the nodes of {where} have at most {most}"
        return None

    def allocate(self, cell: Cell) -> Allocation | None:
        profile = self.matrix.profile(cell)
        cap = profile.slurm.max_jobs
        with self._lock:
            count = self._in_flight.get(cell.hardware, 0)
            if cap is not None and count >= cap:
                return None
            self._in_flight[cell.hardware] = count + 1
        return Allocation.local(cell.id)  # the node and its GPUs: Slurm's choice

    def lock_requests(self, cell: Cell, allocation: Allocation) -> tuple[()]:
        """Nothing: Slurm allocates nodes and GPUs itself, to one job at a time."""
        return ()

    def release(self, cell: Cell, allocation: Allocation) -> None:
        with self._lock:
            self._in_flight[cell.hardware] = max(0, self._in_flight.get(cell.hardware, 1) - 1)

    # --- cells ---------------------------------------------------------------------------------

    def sbatch_job(self, cell: Cell) -> SbatchJob:
        """The batch script's content for ``cell`` (what :func:`render_sbatch` renders): its
        program with this Python, in this checkout or the command's ``workdir``
        (:func:`orchestrator.runtimes.none.command`)."""
        profile = self.matrix.profile(cell)
        cell_dir = self.paths.cell_dir(cell.id).resolve()  # the job may run elsewhere
        if profile.apptainer_runtime:
            return self._apptainer_job(cell, cell_dir)
        command = none.command(cell, profile, self.matrix.program(cell),
                               output_dir=str(cell_dir))  # GPUs: Slurm sets CUDA_VISIBLE_DEVICES
        env = dict(command.env)
        env["PYTHONPATH"] = none.python_path()
        opts = profile.slurm
        assert command.workdir is not None  # none.command's: the command's, else this checkout
        return SbatchJob(
            cell_id=cell.id,
            argv=tuple(command.argv),
            env=env,
            output=output_pattern(cell_dir),
            workdir=command.workdir,
            time_limit=opts.time_limit or slurm_time(self.options.timeout_s + TIME_MARGIN_S),
            gpus=self._gpus_requested(cell, profile),
            options=opts,
            program=command.program,
        )

    def _apptainer_job(self, cell: Cell, cell_dir: Path) -> SbatchJob:
        """The batch script of an Apptainer cell: ``srun apptainer exec ... IMAGE.sif <argv>``
        in the cell folder (the nodes need the image and that folder, not this checkout); the
        variables ``--env`` cannot carry exported with the runtime's prefix (secrets: passed by
        sbatch, never written), the job's GPUs passed in at run time."""
        profile = self.matrix.profile(cell)
        gpus = self._gpus_requested(cell, profile)
        command = apptainer.batch_command(cell, profile, self.matrix.program(cell),
                                          image=self.runtime_image(cell),
                                          output_dir=str(cell_dir), gpus=bool(gpus))
        opts = profile.slurm
        return SbatchJob(
            cell_id=cell.id,
            argv=("srun", *command.argv),
            env=command.env,
            output=output_pattern(cell_dir),
            workdir=str(cell_dir),
            time_limit=opts.time_limit or slurm_time(self.options.timeout_s + TIME_MARGIN_S),
            gpus=gpus,
            options=opts,
            program=command.program,
            gpu_env=command.gpu_env,
            runtime=command.runtime,
        )

    def prepare(self, cells: list[Cell], on_log: Callable[[str], None] | None = None) -> None:
        """Apptainer profiles: their runtime binary and bind sources on this (submit) host, the
        best proxy for the nodes that share its filesystem; their images made here, where the
        nodes see them (a shared image dir)."""
        if any(self.matrix.profile(c).apptainer_runtime for c in cells):
            self.sif_paths = apptainer.prepare(self.matrix, cells, LocalMachine(), on_log=on_log)

    def spec(self, cell: Cell, allocation: Allocation, attempt: int = 1) -> LaunchSpec:
        """The cell's argv and environment, with the batch script that runs them."""
        job = self.sbatch_job(cell)
        profile = self.matrix.profile(cell)
        env = {k: v for k, v in job.env.items() if k != "PYTHONPATH"}
        return LaunchSpec(
            cell_id=cell.id, argv=job.argv, env=env, device=profile.device,
            workdir=job.workdir, output_dir=str(self.paths.cell_dir(cell.id)),
            labels={"slurm.script": str(self.paths.cell_dir(cell.id) / SCRIPT_NAME)},
            attempt=attempt, script=render_sbatch(job), program=job.program,
            image=job.runtime.get("image"), runtime=job.runtime,
        )

    def launch(self, spec: LaunchSpec) -> Execution:
        """Write the spec's batch script into the cell folder and ``sbatch`` it."""
        if spec.script is None:
            raise LaunchError(f"{spec.cell_id}: no batch script was rendered for it")
        cell_dir = self.paths.cell_dir(spec.cell_id)
        script_path = cell_dir / SCRIPT_NAME
        script_path.write_text(spec.script, encoding="utf-8")
        secrets = secret_env(spec.env)  # never in the script: sbatch's environment carries them
        export = ["--export=ALL"] if secrets else []
        proc = _slurm(["sbatch", "--parsable", *export, str(script_path)], timeout=60.0,
                      env=secrets)
        if proc.returncode != 0:
            detail = proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}"
            raise LaunchError(f"sbatch refused {spec.cell_id}: {detail}")
        job_id, cluster = parse_job_id(proc.stdout)
        log.info("%s: submitted as Slurm job %s", spec.cell_id, job_id)
        with self._lock:
            watcher = self._watchers.setdefault(cluster, QueueWatcher(cluster))
        execution = SlurmExecution(job_id, cell_dir / f"slurm-{job_id}.out", cluster, watcher)
        execution.scrub = Scrubber(secrets.values())
        with self._lock:
            self._live.add(execution)
        self._record_job(spec.cell_id, job_id, cluster, script_path, execution.output_path)
        return execution

    def _record_job(self, cell_id: str, job_id: str, cluster: str | None, script: Path,
                    output: Path) -> None:
        """Add the job id to command.json right away (an interrupted sweep keeps it too)."""
        path = self.paths.cell_command(cell_id)
        try:
            command = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            command = {"cell_id": cell_id}
        command["slurm"] = {"job_id": job_id, "cluster": cluster, "script": str(script),
                            "output": str(output)}
        write_json(path, command)

    def finish(self, cell: Cell, result: CellResult, execution: Execution) -> None:
        """Add the job id, Slurm's final state and the node; explain Slurm's own ends."""
        assert isinstance(execution, SlurmExecution)
        with self._lock:
            self._live.discard(execution)
        outcome = execution.outcome
        result.provenance.update(
            slurm_job_id=execution.job_id,
            slurm_state=outcome.state if outcome else execution.state,
            host=execution.node or result.provenance.get("host"),
        )
        if execution.cluster:
            result.provenance["slurm_cluster"] = execution.cluster
        if execution.scrub and execution.output_path.exists():
            # Slurm wrote what the workload printed, secrets too: mask them there as in log.txt
            data = execution.output_path.read_bytes()
            execution.output_path.write_bytes(execution.scrub(data))
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
