"""Slurm's side of a cell as text: the batch scripts we write and Slurm's answers we read. Pure.

Nothing here runs a command or touches a file: :mod:`orchestrator.backends.slurm` does, with
these functions (golden files in ``tests/golden/sbatch-*.sh``).

**One cell, one script** (:class:`SbatchJob`, :func:`render_sbatch`): the ``#SBATCH`` options,
``export`` of the program's environment (every value :func:`shlex.quote`\\ d; secrets only
named) and ``exec`` of its argv. Every job is submitted ``--no-requeue``: Slurm never runs a
cell's job twice under one id (whose output would mix two runs); a preempted job ends
``PREEMPTED`` and the sweep submits the cell again as a new attempt.

**Several nodes** (``nodes > 1``): ``--nodes=N --ntasks-per-node=1``, ``--gres=gpu:G`` per node;
the script finds the allocation's first node (``scontrol show hostnames``), makes it the
rendezvous (``MASTER_ADDR``/``MASTER_PORT``; torchrun's ``PET_RDZV_ENDPOINT``), and ``srun``
starts one task per node; each sets its node rank from ``SLURM_NODEID`` (``NODE_RANK``,
torchrun's ``PET_NODE_RANK``) and runs the argv (torchrun with ``nproc_per_node`` = the node's
GPUs: :class:`~orchestrator.plan.launch.ScheduledNodes`). Slurm binds each node's GPUs
(``CUDA_VISIBLE_DEVICES`` per node). A program with its own launcher (``launcher = "self"``:
mpirun) is started once, on the first node, with the same variables, and spans the allocation
itself (``--ntasks-per-node`` = the node's GPUs: its slots). Under Apptainer each of those
variables is also exported with the runtime's prefix (``--cleanenv`` passes only those).

**An array** (:class:`ArrayJob`, :func:`render_array`): cells whose scripts have the same job
shape (their ``#SBATCH`` lines but name, output and working directory: :func:`shape_of`) are one
``sbatch --array=0-K[%N]``; task *i* runs cell *i*'s own script with bash in the cell's working
directory, its output into the cell folder (``slurm-<array id>_<i>.out``).

**Answers**: ``sbatch --parsable`` (:func:`parse_job_id`), ``sacct -P`` / ``scontrol show job``
(:func:`parse_sacct`, :func:`parse_scontrol` -> :class:`JobOutcome`), Slurm's host lists
(:func:`expand_hostlist`), ``Elapsed`` times (:func:`parse_elapsed`) and GRES strings
(:func:`gpus_of_gres`).
"""

from __future__ import annotations

import functools
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.base import ExitInfo
from orchestrator.config.matrix_file import SlurmOptions
from orchestrator.config.redact import public_env
from orchestrator.errors import LaunchError
from orchestrator.plan.launch import RDZV_PORT_BASE, RDZV_PORT_SPAN, quote

#: File names in the cell folder.
OUTPUT_PATTERN = "slurm-%j.out"

#: Job states in which a job no longer runs.
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
})
#: Terminal states that mean the node or the allocation (not the workload) failed: the sweep
#: runs the cell again (``[matrix] retries``).
LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
#: States of a job that Slurm put back into the queue after it had started.
REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PENDING"})
#: Why each lost state happened, in words.
_LOST_WHY = {
    "NODE_FAIL": "a node of the job failed",
    "BOOT_FAIL": "a node of the job failed to boot",
    "PREEMPTED": "a job of higher priority took its resources",
}
#: Options that are not part of a job's shape (each cell of an array has its own).
_PER_CELL_OPTIONS = ("--job-name=", "--output=", "--chdir=")

_SAFE_DIRECTIVE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# --- one cell's batch script ----------------------------------------------------------------


@dataclass(frozen=True)
class SbatchJob:
    """Everything the batch script of one cell says; :func:`render_sbatch` turns it into text."""

    cell_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    output: str  # the --output pattern (``%j`` is the job id)
    workdir: str
    time_limit: str
    #: --gres=gpu:N on each node; 0 for CPU cells (and Bitfusion, whose GPUs are remote).
    gpus: int = 0
    options: SlurmOptions = field(default_factory=SlurmOptions)
    #: What program the job runs (for command.json and provenance; not in the script).
    program: dict[str, Any] = field(default_factory=dict, compare=False)
    #: A variable the script (each node's task, for several nodes) sets to the job's
    #: ``CUDA_VISIBLE_DEVICES`` (Slurm's allocation, at run time) before ``argv`` starts:
    #: ``APPTAINERENV_CUDA_VISIBLE_DEVICES`` carries it into an Apptainer container, whose
    #: ``--cleanenv`` drops the job's own environment.
    gpu_env: str | None = None
    #: The container runtime that runs ``argv`` (command.json and provenance; not in the script).
    runtime: dict[str, Any] = field(default_factory=dict, compare=False)
    #: Nodes of the job (--nodes).
    nodes: int = 1
    #: Several nodes: ``srun`` runs ``argv`` once per node (torchrun on each); False: once, on
    #: the first node (a program that spans the allocation itself, e.g. mpirun).
    per_node: bool = True
    #: Prefix under which the rendezvous variables are exported too (``APPTAINERENV_``).
    env_prefix: str = ""
    #: Several nodes: Slurm tasks (slots) per node: 1 for torchrun's one task per node; the
    #: GPUs (ranks) of a node for a program that starts its ranks itself (mpirun's slots).
    tasks_per_node: int = 1

    @property
    def job_name(self) -> str:
        return f"orchestrate-{self.cell_id}"

    def directives(self) -> list[str]:
        """The sbatch options, in script order."""
        opts = self.options
        tasks = ([f"--ntasks-per-node={self.tasks_per_node}"] if self.nodes > 1
                 else ["--ntasks=1"])
        out = [
            f"--job-name={self.job_name}",
            f"--output={self.output}",
            f"--nodes={self.nodes}",
            *tasks,
            f"--time={self.time_limit}",
            f"--chdir={self.workdir}",
            "--no-requeue",
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


@functools.lru_cache(maxsize=4096)
def directive_line(option: str) -> str:
    """One ``#SBATCH`` line; values sbatch would split are double-quoted (sbatch's own rules).
    Each option written once (the cells of a matrix share most of theirs)."""
    if _CONTROL.search(option):
        raise LaunchError(f"sbatch option {option!r} contains a control character")
    if _SAFE_DIRECTIVE.match(option):
        return f"#SBATCH {option}"
    name, eq, value = option.partition("=")
    if eq and _SAFE_DIRECTIVE.match(name):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'#SBATCH {name}="{escaped}"'
    escaped = option.replace("\\", "\\\\").replace('"', '\\"')
    return f'#SBATCH "{escaped}"'


def _check_name(cell_id: str, name: str) -> None:
    if not _ENV_NAME.fullmatch(name):
        raise LaunchError(f"{cell_id}: environment variable name {name!r} is not valid")


def render_sbatch(job: SbatchJob) -> str:
    """The batch script of ``job``. Pure; every value the shell sees is :func:`shlex.quote`\\ d."""
    lines = [
        "#!/bin/bash",
        f"# orchestrate cell {job.cell_id}: generated; submitted with `sbatch --parsable`.",
        *(directive_line(opt) for opt in job.directives()),
        "",
        # an array's task by its array id and index (the id the sweep knows it by)
        'job=${SLURM_JOB_ID:-?}; [ -z "${SLURM_ARRAY_JOB_ID:-}" ] || '
        'job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}',
        'echo "# slurm job $job on $(hostname) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"',
    ]
    for key in job.env:
        _check_name(job.cell_id, key)
    public = public_env(job.env)
    secret = sorted(set(job.env) - set(public))
    if secret:
        lines.append(f"# passed by sbatch from the submitting environment, not written here: "
                     f"{' '.join(secret)}")
    for key, value in public.items():
        lines.append(f"export {key}={quote(value)}")
    if job.gpu_env:
        _check_name(job.cell_id, job.gpu_env)
    if job.env_prefix:
        _check_name(job.cell_id, job.env_prefix)
    command = " ".join(map(quote, job.argv))
    if job.nodes > 1:
        return "\n".join(lines + _multi_node_lines(job, command)) + "\n"
    if job.gpu_env and job.gpus:
        lines.append("# the GPUs Slurm gave this job, passed into the container explicitly")
        lines.append(f'export {job.gpu_env}="${{CUDA_VISIBLE_DEVICES-}}"')
    lines.append("exec " + command)
    return "\n".join(lines) + "\n"


def _exports(names_values: Sequence[tuple[str, str]], prefix: str) -> str:
    """``export NAME="value" ...`` (values are fixed shell expansions), with ``prefix`` too."""
    names = [(name, value) for name, value in names_values]
    if prefix:
        names += [(prefix + name, value) for name, value in names_values]
    return "export " + " ".join(f'{name}="{value}"' for name, value in names)


def _multi_node_lines(job: SbatchJob, command: str) -> list[str]:
    """The end of a multi-node script: the rendezvous on the first node, then one task per node
    (``srun``) or the program once (its own launcher)."""
    rendezvous = [("MASTER_ADDR", "$head"), ("MASTER_PORT", "$port"),
                  ("PET_RDZV_ENDPOINT", "$head:$port")]
    lines = [
        f"# {job.nodes} nodes: the first node of the allocation hosts the rendezvous",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"port=$(({RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN}))",
        _exports(rendezvous, job.env_prefix),
        'echo "# rendezvous $head:$port of nodes $SLURM_JOB_NODELIST"',
    ]
    if not job.per_node:  # the program's own launcher spans the allocation
        if job.gpu_env and job.gpus:
            lines.append(f'export {job.gpu_env}="${{CUDA_VISIBLE_DEVICES-}}"')
        return lines + ["exec " + command]
    per_node = [("NODE_RANK", "$SLURM_NODEID"), ("PET_NODE_RANK", "$SLURM_NODEID")]
    node_script = _exports(per_node, job.env_prefix)
    if job.gpu_env and job.gpus:  # each node's own GPUs, as srun bound them there
        node_script += f' {job.gpu_env}="${{CUDA_VISIBLE_DEVICES-}}"'
    node_script += '; exec "$@"'
    lines += [
        "# one task per node; each takes its node rank from Slurm",
        f"exec srun --nodes={job.nodes} --ntasks={job.nodes} --ntasks-per-node=1 "
        f"--kill-on-bad-exit=1 bash -c {shlex.quote(node_script)} orchestrate-node {command}",
    ]
    return lines


def slurm_time(seconds: float) -> str:
    """``--time`` for ``seconds``, rounded up to whole minutes: ``[D-]HH:MM:SS``."""
    minutes = max(1, math.ceil(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def output_pattern(cell_dir: Path | str) -> str:
    """``--output`` for a cell folder: ``%`` in the folder escaped for Slurm's filename patterns."""
    return str(cell_dir).replace("%", "%%") + "/" + OUTPUT_PATTERN


# --- arrays: cells of one job shape, one submission -----------------------------------------


def shape_of(script: str) -> tuple[str, ...]:
    """The job shape of a rendered cell script: its ``#SBATCH`` lines but the name, output and
    working directory, which each cell of an array has of its own."""
    shape = []
    for line in script.splitlines():
        if not line.startswith("#SBATCH "):
            continue
        option = line[len("#SBATCH "):].lstrip('"')
        if not option.startswith(_PER_CELL_OPTIONS):
            shape.append(line)
    return tuple(shape)


@dataclass(frozen=True)
class ArrayTask:
    """One cell of an array: its folder (script and output go there) and working directory."""

    cell_dir: str
    workdir: str
    script: str  # the cell's job.sbatch, run with bash


@dataclass(frozen=True)
class ArrayJob:
    """Cells of one job shape as one ``sbatch --array`` (:func:`render_array`)."""

    name: str
    shape: tuple[str, ...]  # the #SBATCH lines every task shares (:func:`shape_of`)
    tasks: tuple[ArrayTask, ...]
    output: str  # --output of the array itself (what fails before a cell's script starts)
    #: At most this many tasks run at once (``%N``); None: as many as Slurm can.
    limit: int | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"{self.name}: an array needs at least one task")

    @property
    def array_spec(self) -> str:
        """``--array``'s value: ``0-K`` and ``%N`` when limited."""
        spec = f"0-{len(self.tasks) - 1}"
        return f"{spec}%{self.limit}" if self.limit else spec


def array_output(cell_dir: str, array_id: str, index: int) -> str:
    """Where task ``index`` of array ``array_id`` writes its output (in its cell folder)."""
    return f"{cell_dir}/slurm-{array_id}_{index}.out"


def render_array(job: ArrayJob) -> str:
    """The batch script of an array: task *i* runs cell *i*'s script (its own ``#SBATCH``
    lines are comments to bash) in the cell's working directory, output into its folder."""
    lines = [
        "#!/bin/bash",
        f"# orchestrate: {len(job.tasks)} cells of one job shape as one array; task i runs "
        "cell i's job.sbatch.",
        directive_line(f"--job-name={job.name}"),
        directive_line(f"--output={job.output}"),
        directive_line(f"--array={job.array_spec}"),
        *job.shape,
        "",
        'case "${SLURM_ARRAY_TASK_ID:-}" in',
    ]
    for index, task in enumerate(job.tasks):
        lines.append(f"    {index}) cell={shlex.quote(task.cell_dir)} "
                     f"dir={shlex.quote(task.workdir)} script={shlex.quote(task.script)} ;;")
    lines += [
        '    *) echo "orchestrate: array task ${SLURM_ARRAY_TASK_ID:-?} has no cell" >&2; '
        "exit 2 ;;",
        "esac",
        'cd "$dir" || exit 2',
        'exec bash "$script" >"$cell/slurm-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out" 2>&1',
    ]
    return "\n".join(lines) + "\n"


# --- Slurm's answers ------------------------------------------------------------------------


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


def parse_elapsed(text: str) -> int | None:
    """Slurm's ``[D-][HH:]MM:SS`` (``Elapsed``, ``RunTime``) -> seconds; None if it is none."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def gpus_of_gres(gres: str) -> int:
    """GPUs in an ``sinfo`` Gres string: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``(null)`` -> 0."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres):
        parts = re.sub(r"\(.*\)", "", item).strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list -> host names: ``mn[1-2],gpu[01-03,07],login`` -> ``mn1, mn2, gpu01,
    gpu02, gpu03, gpu07, login`` (zero padding kept; what ``scontrol show hostnames`` does)."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text.strip()):
        names = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            names = [n + literal for n in names]
            if ranges:
                names = [n + part for n in names for part in _expand_ranges(ranges)]
        hosts += [n for n in names if n]
    return hosts


def _expand_ranges(text: str) -> list[str]:
    out: list[str] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if dash and low.isdigit() and high.isdigit():
            out += [str(i).zfill(len(low)) for i in range(int(low), int(high) + 1)]
        elif part:
            out.append(part)
    return out


@dataclass(frozen=True)
class JobOutcome:
    """How Slurm says a job ended (its accounting: sacct, else scontrol)."""

    state: str  # first word of the state: "CANCELLED by 0" -> CANCELLED
    exit_code: str = ""
    node: str | None = None  # Slurm's node list (``mn[1-2]``), None when it ran nowhere
    reason: str = ""
    elapsed_s: int | None = None
    #: Where this came from: "sacct" or "scontrol".
    source: str = ""

    @property
    def hosts(self) -> list[str]:
        """The job's nodes, one name each."""
        return expand_hostlist(self.node) if self.node else []

    def exit_info(self, job_id: str = "") -> ExitInfo:
        """As the base's :class:`~orchestrator.backends.base.ExitInfo` (``job_id``: named in
        its detail)."""
        code = parse_exit_code(self.exit_code) if self.exit_code else None
        where = f" on {self.node}" if self.node else ""
        job = f"job {job_id}" if job_id else "job"
        if self.state == "COMPLETED":
            return ExitInfo(code=code or 0)
        if self.state == "FAILED":
            if code:
                return ExitInfo(code=code)
            why = self.reason or "no reason given"
            return ExitInfo(code=1, detail=f"Slurm: {job} FAILED{where} ({why})")
        if self.state == "OUT_OF_MEMORY":
            return ExitInfo(code=code, oom=True,
                            detail=f"Slurm: OUT_OF_MEMORY (the job exceeded its memory{where})")
        if self.state in LOST_STATES:
            return ExitInfo(code=code, host_lost=True,
                            detail=f"Slurm: {job} {self.state}{where} ({_LOST_WHY[self.state]})")
        return ExitInfo(code=code, detail=f"Slurm: {job} {self.state}{where}")


def parse_sacct(text: str) -> JobOutcome | None:
    """The job's line of ``sacct -X -n -P -o State,ExitCode,NodeList[,Elapsed]``."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[0]:
            node = fields[2] if len(fields) > 2 and fields[2] not in ("", "None assigned") else None
            elapsed = parse_elapsed(fields[3]) if len(fields) > 3 else None
            return JobOutcome(state=fields[0].split()[0], exit_code=fields[1], node=node,
                              elapsed_s=elapsed, source="sacct")
    return None


def parse_scontrol(text: str) -> JobOutcome | None:
    """``scontrol show job -o ID``: JobState, ExitCode, NodeList, Reason, RunTime."""
    values = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobState" not in values:
        return None
    node = values.get("NodeList")
    reason = values.get("Reason", "")
    return JobOutcome(
        state=values["JobState"], exit_code=values.get("ExitCode", ""),
        node=None if node in (None, "", "(null)") else node,
        reason="" if reason in ("None", "(null)") else reason,
        elapsed_s=parse_elapsed(values.get("RunTime", "")), source="scontrol",
    )
