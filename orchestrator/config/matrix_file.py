"""The matrix file: typed models, loading and validation.

A matrix file is TOML with these tables (see docs/matrix-files.md):

``[matrix]``
    name, description, repeats, backend, timeout_s, one_cell_per_host.
``[workload]``
    defaults for every cell parameter (:class:`CellParams`).
``[axes]``
    parameter -> list of values; the cells are their cartesian product.
``[[zip]]``
    parameters whose values vary together (one combined axis).
``[[exclude]]`` / ``[[include]]``
    partial assignments to drop / extra cells to add.
``[hardware.NAME]``
    what a ``hardware`` value means (:class:`HardwareProfile`).
``[commands.NAME]``
    another program a cell can run instead of our workload (:class:`CommandTemplate`): a
    command line with ``{placeholders}`` (:mod:`orchestrator.config.argv_template`), how it is
    started
    for several GPUs, its working directory, environment and figures. A cell's ``program``
    (else its profile's) names it; :func:`program_of` resolves what a cell runs.
``[control]``
    a pinned measurement run between the configurations (:class:`ControlSpec`).
``[figures]``
    how the cells' figures of merit are read and judged (:mod:`orchestrator.config.figures`); also
    per profile and per command, the closest winning.

Validation reports every problem at once with the file and the field path.

Rules for every user file (matrix, hosts inventory, image manifest):

* It is read by :func:`~orchestrator.config.files.read_config_text` only: a regular file (never
  a FIFO, a device or a folder: checked before opening, so reading never blocks) of at most
  :data:`~orchestrator.config.files.MAX_FILE_BYTES`, UTF-8, nested at most
  :data:`~orchestrator.config.files.MAX_NESTING` tables/lists deep.
* Types are strict (no guessing): ``batch_size = "8"``, ``gpus = 1.0``, ``channels_last = 1``
  are errors naming the field; an integer is accepted where a float is expected
  (``timeout_s = 1800``). ``--only KEY=VALUE`` parses its strings by the same types.
* Every number has a range no real lab reaches but that stops a typo from bringing a machine
  down (each field's description in ``orchestrate schema`` gives it and why). A matrix plans at
  most :data:`MAX_CELLS` cells (checked from the axis lengths before any cell is built).
* A misspelt key is reported with the nearest valid key at that place.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from orchestrator.config import argv_template
from orchestrator.config.argv_template import TemplateError, Word
from orchestrator.config.figures import FiguresConfig
from orchestrator.config.files import (
    StrictModel,
    parse_toml,
    problems_from_validation,
    read_config_text,
)
from orchestrator.config.overrides import Override, apply_overrides, attribute, read_overrides
from orchestrator.config.publish import PublishSettings
from orchestrator.config.syntax import NAME_PATTERN
from orchestrator.errors import ConfigError, Problem

# --- limits ----------------------------------------------------------------------------------
# Limits no real lab reaches but that stop a typo from bringing a machine down.

#: Most cells one run may plan, after exclude/include and repeats (a nightly sweep of 10,000
#: cells of one minute each already takes a week).
MAX_CELLS = 10_000
#: Most combinations the axes and zips may multiply to before [[exclude]] drops some.
MAX_COMBINATIONS = 20_000
#: Most values in one axis / zip list and most [[include]] entries.
MAX_LIST = MAX_CELLS
#: Most [[exclude]] rules (every rule is matched against every combination).
MAX_EXCLUDES = 100
#: Most accelerators of one cell: eight full 8-GPU nodes.
MAX_GPUS = 64
#: Most nodes one cell spans (one CPU process or GPU on each at least).
MAX_NODES = MAX_GPUS
#: Longest per-cell timeout: a week.
MAX_TIMEOUT_S = 7 * 24 * 3600
#: Biggest memory size (shm_size, mem_limit, Slurm mem): more than any machine has.
MAX_MEMORY_BYTES = 1 << 44  # 16 TiB


# --- cell parameters -------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64)]
#: A path or other string that reaches argv, a file or an environment: no NUL byte (the kernel
#: cannot pass one), no line break, at most PATH_MAX.
PathText = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]+$")]


def _not_an_option(value: str) -> str:
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-': the program would read it as an option; "
                         f"write a path that does not (./{value})")
    return value


#: A dataset path handed to the program as ``--data VALUE``: never one that reads as an option.
DataPath = Annotated[PathText, AfterValidator(_not_an_option)]
#: An environment variable name as POSIX shells accept it.
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
#: An environment value: anything but a NUL byte (exec cannot pass one), at most 32 KiB.
EnvValue = Annotated[str, Field(pattern=r"^[^\x00]*$", max_length=32768)]
Precision = Literal["fp32", "amp", "bf16"]
Mode = Literal["train", "infer"]
CompileMode = Literal["none", "default", "reduce-overhead", "max-autotune"]
#: How PyTorch runs on Gaudi: op by op (eager), accumulated graphs flushed by mark_step (lazy,
#: Habana's graph mode since it replaced tracing), eager with torch.compile(backend="hpu_backend")
#: (compile), or the model traced by torch.jit.trace (graph: Habana's 0.13 "graph mode", seed
#: 004's; `validate` refuses it where the Gaudi software has no such mode, which is every release
#: still published).
HpuMode = Literal["eager", "lazy", "compile", "graph"]
Profiler = Literal["none", "torch", "nsys", "ncu", "nvprof"]
#: Profilers that wrap the command (the orchestrator starts them; see
# orchestrator/plan/profilers.py).
WRAPPING_PROFILERS = ("nsys", "ncu", "nvprof")
#: Shortest telemetry sampling period (s) other than 0 (off): NVML refreshes power about every
#: 100 ms (a median 99 ms between changes, sampled every 5 ms on an H100, 2026-11-25), so faster
#: sampling only repeats readings (the sampler itself kept 5 ms there at no measurable cost).
MIN_TELEMETRY_INTERVAL_S = 0.05

#: Parameters the orchestrator consumes itself; every other one is passed to the workload.
#: ``program`` picks what the cell runs; ``ngc_release`` the image it runs in (its profile's
#: ``base_tag``): neither is a flag of the workload.
ORCHESTRATOR_PARAMS = frozenset({"hardware", "gpus", "nodes", "program", "ngc_release"})
#: The program name of our own benchmark workload (every other program is a [commands.NAME]).
WORKLOAD_PROGRAM = "workload"
#: The table rules a matrix may name (:mod:`orchestrator.results.reports.table_rules` defines them).
TableRuleName = Literal["median", "dlperf", "dle", "tbd", "per-gpu", "habana"]
#: An NGC PyTorch release as a cell parameter: ``YY.MM`` (its image tag is ``YY.MM-py3``).
NGC_RELEASE_PATTERN = r"^[0-9]{2}\.[0-9]{2}$"


def nodes_problem(gpus: int, nodes: int) -> str | None:
    """Why a cell's ``gpus`` cannot be split evenly over its ``nodes`` (``gpus`` counts every
    node's), or None when they can (or ``nodes`` is no count to split by)."""
    if nodes <= 0 or not gpus % nodes:
        return None
    return (f"a cell has gpus = {gpus} and nodes = {nodes}: gpus counts the GPUs (or CPU "
            f"processes) of all its nodes, so give a multiple of nodes (e.g. gpus = "
            f"{gpus // nodes * nodes or nodes} or {(gpus // nodes + 1) * nodes})")


def _telemetry_period(value: float) -> float:
    if 0 < value < MIN_TELEMETRY_INTERVAL_S:
        raise ValueError(f"{value:g} s is shorter than {MIN_TELEMETRY_INTERVAL_S} s (NVML "
                         "refreshes power every 20-100 ms); use 0 to turn telemetry off")
    return value


class CellParams(StrictModel):
    """Every parameter of one cell. Axes, zips, includes and [workload] defaults set these."""

    hardware: Name = Field(description="Hardware profile name (a [hardware.NAME] table).")
    gpus: Annotated[int, Field(gt=0, le=MAX_GPUS)] = Field(
        1, description=f"Accelerators (or CPU worker processes) per cell, 1..{MAX_GPUS} (eight "
        "8-GPU nodes; a typo of 1000000 would start a million processes).",
    )
    nodes: Annotated[int, Field(gt=0, le=MAX_NODES)] = Field(
        1, description=f"Nodes the cell spans, 1..{MAX_NODES} (slurm backend): one job of "
        "--nodes=N with its `gpus` split evenly over them (gpus must be a multiple of nodes), "
        "one torchrun per node, the rendezvous on the first node.",
    )
    batch_size: Annotated[int, Field(gt=0, le=65536)] = Field(
        64, description="Batch size per GPU / rank, 1..65536 (beyond any accelerator's memory "
        "for these models).",
    )
    precision: Precision = Field("fp32", description="fp32, amp (fp16 autocast) or bf16.")
    mode: Mode = Field("train", description="train or infer.")
    arch: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        "resnet50", description="torchvision classification model name."
    )
    image_size: Annotated[int, Field(ge=16, le=4096)] = Field(
        224, description="Input size, px, 16..4096 (a 4096 px ResNet input is 200 MB a sample)."
    )
    warmup: Annotated[int, Field(ge=0, le=100_000)] = Field(
        20, description="Warmup iterations, excluded from metrics, 0..100000 (hours of warmup)."
    )
    iterations: Annotated[int, Field(gt=0, le=1_000_000)] = Field(
        100, description="Measured iterations, 1..1000000 (a day or more at a realistic step time)."
    )
    data: DataPath = Field(
        "synthetic",
        description="'synthetic' or an ImageFolder dataset path (as the runner sees it).",
    )
    channels_last: bool = Field(True, description="Use the channels-last memory format.")
    compile: CompileMode = Field("none", description="torch.compile mode, or none.")
    cuda_graphs: bool = Field(False, description="Capture the step in a CUDA graph.")
    pretrained: bool = Field(False, description="Load weights from the checkpoint dir (infer).")
    num_classes: Annotated[int, Field(gt=0, le=100_000)] = Field(
        1000, description="Classifier classes, 1..100000 (ImageNet-21k has 21841; a million "
        "would be an 8 GB classifier).",
    )
    workers: Annotated[int, Field(ge=0, le=256)] = Field(
        4, description="Data loader workers per rank (real data), 0..256 (more processes than "
        "any machine has cores).",
    )
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = Field(
        0, description="Random seed, 0..2^32-1 (the range numpy's generator takes)."
    )
    profiler: Profiler = Field(
        "none", description="Per-cell profiler: none, torch (torch.profiler), nsys, ncu, nvprof "
        "(CUDA 11 images and GPUs before Ampere only). It covers only the profile window.",
    )
    profile_start: Annotated[int, Field(ge=0, le=999_999)] = Field(
        0, description="First profiled iteration, as an index into the measured iterations "
        "(0 = the first after the warmup), 0..999999; with profile_iterations it must lie inside "
        "the measured window.",
    )
    profile_iterations: Annotated[int, Field(gt=0, le=1_000_000)] = Field(
        5, description="How many measured iterations the profiler covers, 1..1000000 (at most "
        "iterations - profile_start; ncu replays every kernel of them, so keep it small).",
    )
    telemetry_interval: Annotated[
        float, Field(ge=0, le=60, allow_inf_nan=False), AfterValidator(_telemetry_period)
    ] = Field(
        0.5, description=f"Telemetry sampling period in seconds: 0 (off) or "
        f"{MIN_TELEMETRY_INTERVAL_S}..60 (NVML refreshes power every 20-100 ms; faster sampling "
        "repeats readings and costs a CPU core).",
    )
    hpu_mode: HpuMode | None = Field(
        None, description="Gaudi execution mode (device = 'hpu' profiles only): eager "
        "(PT_HPU_LAZY_MODE=0), lazy (PT_HPU_LAZY_MODE=1, mark_step: Habana's graph mode since "
        "it replaced tracing), compile (PT_HPU_LAZY_MODE=0, torch.compile with the "
        "hpu_backend) or graph (torch.jit.trace, the 0.13 software's graph mode of seed 004: "
        "refused where the Gaudi software lacks it). Unset: lazy.",
    )
    program: Name | None = Field(
        None, description="What the cell runs: 'workload' (our benchmark workload) or the name "
        "of a [commands.NAME] template (another program, e.g. NVIDIA's main.py). Unset: its "
        "hardware profile's program, else the workload. An axis of it runs programs side by "
        "side (baseline = 'program=NAME' gives ours/theirs per configuration).",
    )
    ngc_release: Annotated[str, Field(pattern=NGC_RELEASE_PATTERN)] | None = Field(
        None, description="NGC PyTorch release the cell's image is built on, 'YY.MM' (e.g. "
        "'24.05'): sets its profile's base_tag to 'YY.MM-py3', so an axis of releases compares "
        "them on the same hardware (docker and ssh backends; the workload never sees it). "
        "Unset: the profile's own base_tag or release.",
    )

    @model_validator(mode="after")
    def _gpus_split_over_nodes(self) -> CellParams:
        problem = nodes_problem(self.gpus, self.nodes)
        if problem:
            raise ValueError(problem)
        return self

    @property
    def gpus_per_node(self) -> int:
        """Accelerators (or CPU worker processes) on each node of the cell."""
        return self.gpus // self.nodes

    def workload_params(self) -> dict[str, Any]:
        """The parameters the workload receives as command-line flags (unset ones left out)."""
        return {k: v for k, v in self.model_dump().items()
                if k not in ORCHESTRATOR_PARAMS and v is not None}


PARAM_NAMES: tuple[str, ...] = tuple(CellParams.model_fields)


def profile_window_problem(params: CellParams) -> str:
    """Why the cell's profile window does not fit its measured window ('' when it does, or
    when the cell runs no profiler)."""
    if params.profiler == "none":
        return ""
    end = params.profile_start + params.profile_iterations
    if end <= params.iterations:
        return ""
    return (f"the profile window (measured iterations {params.profile_start}.."
            f"{end - 1}: profile_start = {params.profile_start}, profile_iterations = "
            f"{params.profile_iterations}) ends after the {params.iterations} measured iterations; "
            f"lower profile_start/profile_iterations or raise iterations")


def param_type(name: str) -> Any:
    """The annotated type of cell parameter ``name`` (with its constraints)."""
    info = CellParams.model_fields[name]
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


def _derived(name: str, wrap: Callable[[Any], Any]) -> type[BaseModel]:
    fields: dict[str, Any] = {p: (wrap(param_type(p)), None) for p in PARAM_NAMES}
    return create_model(name, __base__=StrictModel, **fields)


# These models are made at run time (create_model): mypy cannot use them as types, hence the
# ``type: ignore[valid-type]`` where they appear in annotations; pydantic validates them all.

#: ``[workload]`` and each ``[[include]]``: any subset of the parameters.
PartialParams = _derived("PartialParams", lambda t: t | None)
#: ``[axes]`` and each ``[[zip]]``: parameter -> non-empty list of values.
AxisValues = _derived(
    "AxisValues",
    lambda t: Annotated[list[t], Field(min_length=1, max_length=MAX_LIST)] | None,  # type: ignore[valid-type]
)
#: ``[[exclude]]``: parameter -> a value or a list of values (any of them matches).
ExcludeRule = _derived("ExcludeRule", lambda t: t | list[t] | None)  # type: ignore[valid-type]


# --- hardware profiles -----------------------------------------------------------------------


class Mount(StrictModel):
    """A bind mount into the container (a dataset at /imagenet, checkpoints at the hub cache)."""

    source: PathText
    target: Annotated[PathText, Field(pattern=r"^/[^\x00-\x1f\x7f]*$")]
    read_only: bool = True


#: A Docker memory size: digits and an optional unit (b, k, m, g).
MemorySize = Annotated[str, Field(pattern=r"^[0-9]{1,16}[bkmgBKMG]?$")]
#: The ulimits Docker knows (``docker run --ulimit``).
UlimitName = Literal[
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
    "rss", "rtprio", "rttime", "sigpending", "stack",
]
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def memory_bytes(value: str, default_unit: str = "") -> int:
    """``'16g'`` -> bytes (the unit is the last character when it is a letter, else
    ``default_unit``: bytes for Docker, ``"m"`` for Slurm's --mem). For every
    :data:`MemorySize` of at most :data:`MAX_MEMORY_BYTES` it is what docker-py's
    ``parse_bytes`` gives (tests/test_launch.py compares them)."""
    unit = value[-1].lower() if value[-1].isalpha() else ""
    return int(value[: len(value) - len(unit)]) * _UNITS[unit or default_unit]


class ContainerOptions(StrictModel):
    """How the container is started (Docker / Singularity backends)."""

    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: MemorySize = Field(
        "8g", description="/dev/shm size, e.g. '16g' (b/k/m/g), at most 16 TiB."
    )
    privileged: bool = False
    pid: Literal["host"] | None = Field(
        None, description="'host': the container shares the host's process namespace (docker "
        "run --pid=host; seed 000's Bitfusion client needs it).",
    )
    mounts: list[Mount] = Field([], max_length=256)
    devices: list[PathText] = Field(
        [], max_length=256, description="Extra device nodes, e.g. /dev/accel for Gaudi."
    )
    cap_add: list[Annotated[str, Field(pattern=r"^[A-Za-z_]{1,64}$")]] = Field(
        [], max_length=64, description="Linux capabilities, e.g. SYS_NICE."
    )
    ulimits: dict[UlimitName, Annotated[int, Field(ge=-1, le=2**63 - 1)]] = Field(
        {"memlock": -1, "stack": 67108864},
        description="ulimits (soft = hard); -1 is unlimited, else 0..2^63-1 (the kernel's "
        "range). NVIDIA's recommended defaults; a table here replaces them whole.",
    )
    mem_limit: MemorySize | None = Field(
        None, description="Container memory limit, e.g. '16g' (b/k/m/g), at most 16 TiB."
    )
    network: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")] | None = Field(
        None, description="Docker network mode, e.g. 'host'."
    )
    runtime: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] | None = Field(
        None, description="OCI runtime, e.g. 'habana'."
    )

    @field_validator("shm_size", "mem_limit")
    @classmethod
    def _memory_in_range(cls, value: str | None) -> str | None:
        if value is not None and memory_bytes(value) > MAX_MEMORY_BYTES:
            raise ValueError(f"{value!r} is more than 16 TiB (more memory than any machine has)")
        return value


class BitfusionOptions(StrictModel):
    """``bitfusion run -n GPUS -p PARTIAL [-l SERVERS] -- <workload>``."""

    partial: Annotated[float, Field(gt=0, le=1)] = Field(
        1.0, description="Fraction of each GPU's memory (0 < partial <= 1)."
    )
    servers: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]{1,255}$")]] = Field(
        [], max_length=256, description="Bitfusion servers, HOST[:PORT]."
    )
    extra_args: list[PathText] = Field([], max_length=64)


#: A value that ends up on an ``#SBATCH`` line: one line, no control characters.
SbatchValue = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]+$", max_length=1024)]

#: The sbatch options orchestrate sets itself (in every script, on the command line or through
#: a field of [hardware.NAME.slurm]), and why: ``extra_args`` may not set them again (sbatch
#: takes the last one given: ``--array=0-5%0`` beside the project's own array never ran).
SBATCH_OWN = {
    "--array": "the job arrays of the cells it places together (arrays, array_limit)",
    "--job-name": "each job is named after its cell or matrix, which it finds it by",
    "--output": "the job's output is the cell's log",
    "--error": "the job's output (stdout and stderr) is the cell's log",
    "--dependency": "jobs start as the sweep places them",
    "--gres": "the cell's GPUs (its gpus parameter)",
    "--gpus": "the cell's GPUs (its gpus parameter, as --gres)",
    "--gpus-per-node": "the cell's GPUs (its gpus parameter, as --gres)",
    "--gpus-per-task": "the cell's GPUs (its gpus parameter, as --gres)",
    "--nodes": "the cell's nodes parameter",
    "--ntasks": "one task per node",
    "--ntasks-per-node": "one task per node",
    "--time": "give it as time_limit of the slurm table (default: the cell's timeout plus 5 "
              "minutes)",
    "--chdir": "the cell's working directory",
    "--export": "the cell's environment (secrets by --export=ALL)",
    "--wrap": "the job runs the cell's script",
    "--partition": "give it as partition of the slurm table",
    "--account": "give it as account of the slurm table",
    "--qos": "give it as qos of the slurm table",
    "--cpus-per-task": "give it as cpus_per_task of the slurm table",
    "--cpus-per-gpu": "give it as cpus_per_gpu of the slurm table",
    "--mem": "give it as mem of the slurm table",
}
#: sbatch's one-letter forms of those options (``-a 0-5``, ``-J name``).
SBATCH_SHORT = {"a": "--array", "J": "--job-name", "o": "--output", "e": "--error",
                "d": "--dependency", "G": "--gpus", "N": "--nodes", "n": "--ntasks",
                "t": "--time", "D": "--chdir", "p": "--partition", "A": "--account",
                "q": "--qos", "c": "--cpus-per-task"}


def sbatch_option(arg: str) -> str | None:
    """The long name of the sbatch option ``arg`` sets (``--array=0-5``, ``--array 0-5``,
    ``-a0-5``: ``--array``), an unambiguous abbreviation (sbatch accepts ``--arr``) taken for
    the option of the project's it abbreviates; None: not an option."""
    if arg.startswith("--"):
        name = re.split(r"[=\s]", arg, maxsplit=1)[0]
        if name in SBATCH_OWN or len(name) < 4:
            return name
        longer = [own for own in SBATCH_OWN if own.startswith(name)]
        return longer[0] if len(longer) == 1 else name
    if arg.startswith("-") and len(arg) > 1:
        return SBATCH_SHORT.get(arg[1], arg[:2])
    return None


class SlurmOptions(StrictModel):
    """``sbatch`` options of a profile's cells (slurm backend)."""

    partition: SbatchValue | None = None
    account: SbatchValue | None = None
    qos: SbatchValue | None = None
    time_limit: Annotated[
        str, Field(pattern=r"^[0-9]{1,6}(-[0-9]{1,2})?(:[0-9]{1,2}){0,2}$")
    ] | None = Field(
        None, description="--time of every cell (Slurm format, e.g. '02:00:00'); default: "
        "the per-cell timeout plus 5 minutes.",
    )
    cpus_per_task: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        None, description="1..4096 (more cores than any node has)."
    )
    cpus_per_gpu: Annotated[int, Field(gt=0, le=4096)] | None = Field(
        None, description="1..4096 (more cores than any node has)."
    )
    mem: Annotated[str, Field(pattern=r"^[0-9]{1,10}[KMGT]?$")] | None = Field(
        None, description="--mem per node, e.g. '32G' (no unit: MB), at most 16 TiB."
    )
    max_jobs: Annotated[int, Field(gt=0, le=MAX_CELLS)] | None = Field(
        None, description="At most this many of the profile's cells in Slurm at once "
        f"(default: submit every cell; Slurm queues them), 1..{MAX_CELLS}.",
    )
    extra_args: list[SbatchValue] = Field(
        [], max_length=64, description="More sbatch options, one per #SBATCH line, in "
        "--name=value form, e.g. '--constraint=a100'; not one orchestrate sets itself "
        "(--array, --job-name, --output, --dependency, --gres/--gpus, ...: SBATCH_OWN) nor "
        "--requeue (a preempted cell is run again by the sweep, as a job of its own).",
    )
    conf: PathText | None = Field(
        None, description="The slurm.conf of the cluster these cells go to: SLURM_CONF of "
        "sbatch, squeue, sacct and scancel, and of the jobs (their srun). Default: this "
        "environment's SLURM_CONF, else Slurm's own.",
    )
    arrays: bool = Field(
        True, description="Submit the cells of one job shape (the same sbatch options) that "
        "the sweep places together as one job array: one sbatch for all of them. false: one "
        "sbatch per cell.",
    )
    array_limit: Annotated[int, Field(gt=0, le=MAX_CELLS)] | None = Field(
        None, description=f"At most this many tasks of each array run at once (sbatch "
        f"--array=0-K%N), 1..{MAX_CELLS}. Default: as many as Slurm can place.",
    )

    @field_validator("extra_args")
    @classmethod
    def _not_ours(cls, args: list[str]) -> list[str]:
        for arg in args:
            name = sbatch_option(arg)
            if name in ("--requeue", "--no-requeue"):
                raise ValueError(
                    f"{arg!r}: orchestrate submits every job with --no-requeue and runs a "
                    "preempted or lost cell again itself, as a new job ([matrix] retries): a "
                    "job Slurm requeued would run the cell twice under one id, into one output")
            ours = SBATCH_OWN.get(name or "")
            if ours is not None:
                raise ValueError(f"{arg!r}: orchestrate sets {name} itself ({ours}); a second "
                                 f"{name} would override it")
        return args

    @field_validator("mem")
    @classmethod
    def _mem_in_range(cls, value: str | None) -> str | None:
        if value is not None and memory_bytes(value, default_unit="m") > MAX_MEMORY_BYTES:
            raise ValueError(f"{value!r} is more than 16 TiB (more than any node has)")
        return value


#: A container runtime a profile's cells run in: ``docker`` (the docker and ssh backends' engine)
#: or Apptainer / SingularityCE (``apptainer exec``; the process and slurm backends).
Runtime = Literal["docker", "apptainer", "singularity"]
#: The Apptainer-family runtimes (one flavour each: the binary's name and its environment prefix).
APPTAINER_RUNTIMES = ("apptainer", "singularity")
#: ``apptainer`` / ``singularity`` on PATH where the cell runs, or an absolute path to one.
RuntimeBinary = Annotated[str, Field(
    pattern=r"^(/[A-Za-z0-9._+@%,/-]{1,4095}|[A-Za-z0-9][A-Za-z0-9._+-]{0,63})$")]
#: A path where the cells run: absolute, or ``~/...`` (expanded on that machine).
MachinePath = Annotated[str, Field(min_length=2, max_length=4096,
                                   pattern=r"^(/|~/)[^\x00-\x1f\x7f]*$")]
#: One option of ``apptainer exec`` (an argv item that starts with ``-``).
ExecOption = Annotated[str, Field(min_length=2, max_length=4096,
                                  pattern=r"^-[^\x00-\x1f\x7f]*$")]


class ApptainerOptions(StrictModel):
    """``[hardware.NAME.apptainer]``: how cells run under Apptainer / SingularityCE
    (``runtime = "apptainer"`` or ``"singularity"``)."""

    binary: RuntimeBinary | None = Field(
        None, description="The runtime's program: a name looked up on PATH where the cell runs "
        "('apptainer', 'singularity') or an absolute path. Default: the runtime's name.",
    )
    sif: MachinePath | None = Field(
        None, description="A ready .sif image (an absolute or ~/ path where the cells run, e.g. "
        "one a centre's admins keep on a shared filesystem): nothing is built. Default: the .sif "
        "built from the profile's image template, named by its content hash.",
    )
    image_dir: MachinePath | None = Field(
        None, description="Folder of the built .sif files (absolute, or ~/...): "
        "<template>-<content hash>.sif. Default: $ORCHESTRATE_SIF_DIR, else "
        "~/.cache/orchestrate/sif (the slurm backend's nodes must see it: a shared filesystem).",
    )
    binds: list[Mount] = Field(
        [], max_length=256, description="Bind mounts for Apptainer only (container.mounts are "
        "bound too): --bind SOURCE:TARGET[:ro].",
    )
    extra_args: list[ExecOption] = Field(
        [], max_length=64, description="More options of `apptainer exec`, one argv item each "
        "(e.g. '--contain', '--writable-tmpfs').",
    )
    fakeroot: bool = Field(
        True, description="Build .sif files with `apptainer build --fakeroot` (no root needed).")


#: An accelerator model as vendors and nvidia-smi name it ("V100", "Tesla V100-SXM2-32GB",
#: "H100 80GB HBM3", "HL-205").
AcceleratorName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}$")]
# --- profilers (the tools' options; command lines in orchestrator/plan/profilers.py) -------------

#: One argument handed to a tool as is (an argv item: never a shell word).
ToolArg = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f\x7f]+$")]
#: An ncu/nvprof metric name, or ``regex:EXPR`` (ncu: every metric the expression matches). No
#: comma (the list becomes one comma-separated argument) and no white space.
MetricName = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^\s,\x00-\x1f]+$")]
#: An NVTX range name as the program pushes it (no ``@``: that separates a domain, no ``/``).
NvtxRange = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_. :-]+$")]
#: What part of a run a tool records: ``range`` (cudaProfilerStart/Stop, our workload's window),
#: ``nvtx`` (an NVTX range the program pushes), ``whole`` (start to exit).
Capture = Literal["range", "nvtx", "whole"]

#: ncu's default metrics: the pipe utilisations seed 001 asks for (FMA, FP16, Tensor Core, SFU
#: = XU), as % of peak sustained over active cycles, plus each kernel's duration (the weights).
#: Regular expressions, because the names differ by architecture (orchestrator/plan/profilers.py);
#: the per-SM-subpartition (smsp__) forms only (these were written ``^smsp?__``, which reads
#: "sms" + optional "p" and never matched an sm__ name: the real H100 profile had smsp__ alone).
DEFAULT_NCU_METRICS: tuple[str, ...] = (
    "gpu__time_duration.sum",
    r"regex:^smsp__inst_executed_pipe_(fma|fp16|xu|fma_type_fp16)"
    r"\.avg\.pct_of_peak_sustained_active$",
    r"regex:^smsp__pipe_(fma|fp16|tensor|tensor_op_hmma"
    r"|tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma)_cycles_active"
    r"\.avg\.pct_of_peak_sustained_active$",
)
#: nvprof's metrics for the same pipes (utilisation levels 0..10).
DEFAULT_NVPROF_METRICS: tuple[str, ...] = (
    "single_precision_fu_utilization", "half_precision_fu_utilization",
    "tensor_precision_fu_utilization", "special_fu_utilization",
)


class _ToolOptions(StrictModel):
    capture: Capture = Field(
        "range", description="What the tool records: 'range' (between the program's "
        "cudaProfilerStart/Stop: our workload's profile window), 'nvtx' (inside the NVTX range "
        "nvtx_range), 'whole' (start to exit: programs that mark nothing, e.g. DLE's main.py).",
    )
    nvtx_range: NvtxRange = Field(
        "profile", description="capture = 'nvtx': the NVTX push/pop range to record (our "
        "workload pushes 'profile' around its window).",
    )
    extra_args: list[ToolArg] = Field(
        [], max_length=64, description="More options for the tool, one argv item each.")


class NsysOptions(_ToolOptions):
    """``[hardware.NAME.nsys]``: Nsight Systems (``nsys profile``)."""

    trace: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]] = Field(
        ["cuda", "nvtx", "osrt"], min_length=1, max_length=32,
        description="APIs to trace (nsys --trace), e.g. cuda, nvtx, osrt, cudnn, cublas.",
    )
    capture_range_end: Literal["stop", "stop-shutdown", "repeat", "none"] = Field(
        "stop", description="nsys --capture-range-end: 'stop' lets the program finish (its "
        "summary line is the cell's result); 'none' leaves the option out (nsys before 2021).",
    )
    delay_s: Annotated[float, Field(ge=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)] | None = Field(
        None, description="capture = 'whole': start collecting after this many seconds.")
    duration_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)] | None = (
        Field(None, description="capture = 'whole': collect this many seconds."))
    stats: bool = Field(
        True, description="After the run, export the kernel summary and GPU trace as CSV "
        "(nsys stats) for the per-cell figures nsys.*.",
    )

    @model_validator(mode="after")
    def _time_window_needs_whole(self) -> NsysOptions:
        if self.capture != "whole" and (self.delay_s is not None or self.duration_s is not None):
            raise ValueError("delay_s and duration_s bound a capture = 'whole' run; with "
                             f"capture = {self.capture!r} the program's markers bound it")
        return self


class NcuOptions(_ToolOptions):
    """``[hardware.NAME.ncu]``: Nsight Compute (``ncu``)."""

    metrics: list[MetricName] = Field(
        list(DEFAULT_NCU_METRICS), max_length=256,
        description="Metrics (ncu --metrics; 'regex:EXPR' collects every metric matching): by "
        "default the FMA, FP16, Tensor and XU (SFU) pipe utilisations and gpu__time_duration.sum "
        "(kernel-time weights of the ncu.* figures).",
    )
    sections: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")]] = Field(
        [], max_length=64, description="Sections (ncu --section), e.g. SpeedOfLight.")
    set: Annotated[str, Field(pattern=r"^[a-z]{1,32}$")] | None = Field(
        None, description="Section set (ncu --set), e.g. basic, detailed, full.")
    replay_mode: Literal["kernel", "application", "range", "app-range"] = Field(
        "kernel", description="ncu --replay-mode.")
    launch_skip: Annotated[int, Field(ge=0, le=10**9)] | None = Field(
        None, description="Kernel launches skipped before profiling (ncu --launch-skip).")
    launch_count: Annotated[int, Field(gt=0, le=10**9)] | None = Field(
        None, description="Kernel launches profiled at most (ncu --launch-count).")
    kernel_name: ToolArg | None = Field(
        None, description="Only kernels of this name (ncu --kernel-name; 'regex:EXPR').")


class NvprofOptions(_ToolOptions):
    """``[hardware.NAME.nvprof]``: nvprof (CUDA <= 11 toolkits, GPUs before Ampere)."""

    metrics: list[MetricName] = Field(
        list(DEFAULT_NVPROF_METRICS), max_length=256,
        description="Metrics (nvprof --metrics): by default the single/half/tensor precision "
        "and special function unit utilisations.",
    )

    @model_validator(mode="after")
    def _no_nvtx_capture(self) -> NvprofOptions:
        if self.capture == "nvtx":
            raise ValueError("nvprof has no NVTX capture range: use capture = 'range' (the "
                             "program's cudaProfilerStart/Stop) or 'whole'")
        return self


class HardwareProfile(StrictModel):
    """What a ``hardware`` value means: device, image, wrapper, container options, placement."""

    description: str = ""
    device: Literal["cuda", "hpu", "cpu"]
    gpu: AcceleratorName | None = Field(
        None, description="Which accelerator this is, e.g. 'V100', 'H100', 'HL-205' (Gaudi): "
        "`validate` then checks what it can do (bf16, Nsight Compute, torch.compile). Unset: "
        "not checked (validate says so).",
    )
    compute_capability: Annotated[str, Field(pattern=r"^[0-9]{1,2}\.[0-9]$")] | None = Field(
        None, description="CUDA compute capability, e.g. '7.0' (V100), '9.0' (H100): for a GPU "
        "`gpu` does not name, or to override it.",
    )
    image: str | None = Field(None, description="Image template name (images/NAME).")
    release: Literal["auto"] | None = Field(
        None, description="'auto': every host gets the image of the newest release its driver "
        "runs, decided when the sweep reaches it: NGC PyTorch from the NVIDIA driver (and the "
        "GPU's architecture) and orchestrator/data/ngc_releases.toml, Intel Gaudi from the "
        "host's Gaudi software version (orchestrator/data/habana_releases.toml). Unset: the "
        "release image_vars name (base_tag, or synapse_version and torch_version).",
    )
    forward_compat: bool = Field(
        False, description="With release = 'auto' on data-center GPUs: also count releases the "
        "driver runs through CUDA forward compatibility (NVIDIA's compatibility package in the "
        "container; not for GeForce/RTX cards).",
    )
    image_vars: dict[str, Any] = Field(
        {}, description="Template variables (checked by the template's declared types and kinds)."
    )
    wrapper: Literal["none", "bitfusion"] = "none"
    bitfusion: BitfusionOptions = BitfusionOptions()
    container: ContainerOptions = ContainerOptions()
    slurm: SlurmOptions = SlurmOptions()
    runtime: Runtime | None = Field(
        None, description="What the cells run in: 'docker' (the docker and ssh backends), "
        "'apptainer' or 'singularity' (apptainer exec --nv --cleanenv IMAGE.sif on the "
        "process and slurm backends). Unset: what the backend implies (docker for "
        "docker/ssh, none for process/slurm).",
    )
    apptainer: ApptainerOptions = ApptainerOptions()
    env: dict[EnvName, EnvValue] = Field(
        {}, description="Environment of every cell (names as shells accept them; no NUL)."
    )
    hosts: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        [], max_length=1024, description="Hosts (inventory names) allowed to run it."
    )
    gpu_ids: list[Annotated[int, Field(ge=0, le=255)]] | None = Field(
        None, max_length=256,
        description="Local GPU ids to use (default: all visible), each 0..255, no repeats.",
    )
    multi_node: bool = False
    checkpoint_dir: PathText | None = Field(
        None, description="Where pretrained weights are (the torch hub cache as mounted)."
    )
    nsys: NsysOptions = NsysOptions()
    ncu: NcuOptions = NcuOptions()
    nvprof: NvprofOptions = NvprofOptions()
    program: Name | None = Field(
        None, description="What this profile's cells run unless a cell's own program says "
        "otherwise: 'workload' or a [commands.NAME] template. Unset: the workload.",
    )
    figures: FiguresConfig | None = Field(
        None, description="How this profile's cells' figures are read and judged (a [figures] "
        "table); a command's own figures come first, the matrix's [figures] after.",
    )

    @field_validator("gpu_ids")
    @classmethod
    def _gpu_ids_unique(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and len(set(ids)) != len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"GPU ids listed twice: {twice}")
        return ids

    @model_validator(mode="after")
    def _wrapper_needs_cuda(self) -> HardwareProfile:
        if self.wrapper == "bitfusion" and self.device != "cuda":
            raise ValueError("wrapper 'bitfusion' needs device = 'cuda'")
        if self.compute_capability is not None and self.device != "cuda":
            raise ValueError(f"compute_capability describes a CUDA GPU; this profile's device "
                             f"is {self.device!r}")
        if self.gpu is not None and self.device == "cpu":
            raise ValueError("gpu names the accelerator of a cuda or hpu profile; this "
                             "profile's device is 'cpu'")
        if self.forward_compat and self.release != "auto":
            raise ValueError("forward_compat is how release = 'auto' picks on data-center GPUs; "
                             "set release = 'auto' or remove forward_compat")
        if self.release == "auto" and self.image is None:
            raise ValueError("release = 'auto' picks the base of the profile's image: give an "
                             "image template")
        if self.runtime not in APPTAINER_RUNTIMES and self.apptainer != ApptainerOptions():
            raise ValueError("[apptainer] options apply to runtime = 'apptainer' or "
                             "'singularity'; set runtime, or remove the table")
        return self

    @property
    def apptainer_runtime(self) -> bool:
        """Whether the cells run under Apptainer / SingularityCE."""
        return self.runtime in APPTAINER_RUNTIMES


# --- command templates: a cell that runs another program ---------------------------------------

#: Placeholders every command template has besides the cell parameters and its own
#: ``[commands.NAME.placeholders]``: what only the backend knows, and a derived count.
BUILTIN_PLACEHOLDERS: dict[str, str] = {
    "python": "the Python interpreter where the cell runs (this one for the process and slurm "
    "backends, python3 in an image)",
    "output_dir": "the cell's folder as the program sees it: what the program writes there "
    "(a DLLogger raport, a trace) ends up in the cell folder",
    "total_iterations": "warmup + iterations, for a program that counts its warmup in (DLE's "
    "--prof)",
    "gpus_per_node": "gpus / nodes: the processes (GPUs) of each node of a multi-node cell",
    "cell_id": "the cell's id",
}
#: How a command is started for several GPUs: ``torchrun`` starts one process per GPU with
#: torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR ...); ``self`` starts it
#: once, and it spawns its own ranks (it gets ``{gpus}`` and CUDA_VISIBLE_DEVICES).
Launcher = Literal["torchrun", "self"]
#: A placeholder's name, as templates write it.
PlaceholderName = Annotated[str, Field(pattern=argv_template.NAME_RE.pattern, max_length=64)]
#: One argv item a placeholder stands for: any one-line text (it never meets a shell).
ArgText = Annotated[str, Field(max_length=4096, pattern=r"^[^\x00-\x1f\x7f]*$")]


def _items(value: Any) -> Any:
    """A placeholder entry as argv items: a string is one item (``"x"`` is ``["x"]``)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ValueError(f"give a string (one argv item) or a list of strings (got {value!r})")
    return value


#: What a placeholder entry stands for: argv items (a string in the file is one item).
ArgItems = Annotated[list[ArgText], BeforeValidator(_items), Field(max_length=256)]


def value_text(value: Any) -> str:
    """A parameter's value as a command gets it (and as a placeholder's ``values`` key names
    it): booleans as TOML writes them (``true``), numbers and texts as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@functools.cache
def _adapter(param: str) -> TypeAdapter[Any]:
    return TypeAdapter(param_type(param))


def _canonical(param: str, key: str) -> str | None:
    """``key`` as :func:`value_text` writes a value of ``param`` (``True`` -> ``true``), or None
    when it is no value of ``param``."""
    try:
        return value_text(_adapter(param).validate_strings(key))
    except ValidationError:
        return None


class Placeholder(StrictModel):
    """``[commands.NAME.placeholders.P]``: what ``{P}`` stands for, per value of a parameter."""

    param: PlaceholderName | None = Field(
        None, description="The cell parameter whose value picks the entry (default: the "
        "placeholder's own name, e.g. {arch} maps arch).",
    )
    values: dict[Annotated[str, Field(min_length=1, max_length=256)], ArgItems] = Field(
        ..., min_length=1, max_length=MAX_LIST,
        description="Parameter value -> one argv item (a string) or several (a list, [] for "
        "none), e.g. amp = [\"--amp\", \"--static-loss-scale\", \"256\"]. A value the cells "
        "take that is not listed is an error.",
    )

    def entry(self, param: str, value: Any) -> list[str] | None:
        """What the placeholder stands for when ``param`` is ``value`` (None: not listed)."""
        wanted = value_text(value)
        for key, mapped in self.values.items():
            if (_canonical(param, key) or key) == wanted:
                return mapped
        return None


class CommandRenderError(ValueError):
    """A cell whose values do not fit a command template: ``problems`` are (field under the
    command's table, message) pairs, every one of them."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(message for _, message in problems))
        self.problems = problems


class Requirement(StrictModel):
    """``[[commands.NAME.requires]]``: a file or folder a cell of the command needs when it runs
    (a dataset, pretrained weights, a client's configuration), checked before the run."""

    path: Annotated[str, Field(min_length=1, max_length=4096,
                               pattern=r"^[/{][^\x00-\x1f\x7f]*$")] = Field(
        description="Where the program reads it when the cell runs: an absolute path in the "
        "container (docker: mapped to the host through the profile's mounts; a path inside the "
        "image is the image's) or on the machine (process, slurm); {name} placeholders as in "
        "the command (a placeholder mapped to [] makes the cell need nothing here).",
    )
    what: Annotated[str, Field(max_length=1024)] = Field(
        "", description="What it is and where it comes from (shown when it is missing).",
    )


class CommandTemplate(StrictModel):
    """``[commands.NAME]``: another program a cell can run instead of our workload."""

    description: str = ""
    command: Annotated[str, Field(min_length=1, max_length=65536)] = Field(
        description="The command line: words as a shell splits them (quotes group), never run "
        "by a shell; {name} is a cell parameter, a [commands.NAME.placeholders] entry or "
        f"{', '.join('{' + n + '}' for n in BUILTIN_PLACEHOLDERS)}; a value is one argv item "
        "(a list mapping: several), never split or parsed.",
    )
    launcher: Launcher = Field(
        "torchrun", description="Several GPUs: 'torchrun' starts one process per GPU under "
        "torch.distributed.run (RANK, LOCAL_RANK, WORLD_SIZE ... in the environment; several "
        "nodes: one torchrun per node); 'self' starts the program once, it spawns its own ranks "
        "({gpus}, CUDA_VISIBLE_DEVICES).",
    )
    workdir: PathText | None = Field(
        None, description="Working directory of the program: an absolute path where the cell "
        "runs (in the image for docker/ssh), or \"$env:NAME\" (read from this environment when "
        "the cell starts). Default: the backend's (this checkout; the image's).",
    )
    env: dict[EnvName, EnvValue] = Field(
        {}, description="Environment of the program, added to its hardware profile's (names as "
        "shells accept them; \"$env:NAME\" values are read when the cell starts, kept secret).",
    )
    placeholders: dict[PlaceholderName, Placeholder] = Field(
        {}, max_length=256, description="Placeholders whose value depends on a parameter's "
        "value: precision amp -> [\"--amp\", \"--static-loss-scale\", \"256\"], our arch names "
        "-> the program's.",
    )
    figures: FiguresConfig | None = Field(
        None, description="How the program's figures are read and judged (parser dllogger, "
        "regex ...); default: the hardware profile's, the matrix's [figures], else our "
        "workload's JSON lines.",
    )
    requires: list[Requirement] = Field(
        [], max_length=256, description="Files and folders the program needs when a cell runs "
        "(datasets, pretrained weights, client configurations): `validate` (and the sweep) "
        "refuse a cell whose file is missing where it runs.",
    )
    _words: tuple[Word, ...] = PrivateAttr(default=())
    _required: tuple[tuple[Word, ...], ...] = PrivateAttr(default=())

    @field_validator("command")
    @classmethod
    def _splits(cls, value: str) -> str:
        try:
            argv_template.parse(value)
        except TemplateError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("requires")
    @classmethod
    def _one_word_paths(cls, value: list[Requirement]) -> list[Requirement]:
        for entry in value:
            try:
                words = argv_template.parse(entry.path)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
            if len(words) != 1:
                raise ValueError(f"requires path {entry.path!r} must be one word (no spaces)")
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_or_reference(cls, value: str | None) -> str | None:
        if value is None or value.startswith("/"):
            return value
        if value.startswith("$env:") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value[5:]):
            return value
        raise ValueError("must be an absolute path (where the cell runs) or \"$env:NAME\"")

    def model_post_init(self, context: Any, /) -> None:
        self._words = argv_template.parse(self.command)
        self._required = tuple(argv_template.parse(r.path) for r in self.requires)

    @property
    def words(self) -> tuple[Word, ...]:
        """The template's words, split once when it was loaded."""
        return self._words

    def uses(self) -> list[str]:
        """Every placeholder of the template (its requires paths too), each once, in order."""
        return argv_template.names(self._words + tuple(w for r in self._required for w in r))

    def params_used(self) -> set[str]:
        """The cell parameters whose values reach the command (directly or through a
        placeholder; ``total_iterations`` uses warmup and iterations)."""
        used: set[str] = set()
        for name in self.uses():
            if name in self.placeholders:
                used.add(self.placeholders[name].param or name)
            elif name == "total_iterations":
                used |= {"warmup", "iterations"}
            elif name in PARAM_NAMES:
                used.add(name)
        return used

    def problems(self) -> list[tuple[str, str]]:
        """Every problem of the template's names: (field under its table, message). Checked
        when the matrix is loaded."""
        out: list[tuple[str, str]] = []
        known = [*PARAM_NAMES, *BUILTIN_PLACEHOLDERS, *self.placeholders]
        used = self.uses()
        for name in used:
            if name not in known:
                out.append(("command", f"unknown placeholder {{{name}}}{_did_you_mean(name, known)}"
                            f"; a template knows the cell parameters, "
                            f"{', '.join('{' + n + '}' for n in BUILTIN_PLACEHOLDERS)} and its "
                            "[placeholders] entries"))
        embedded = argv_template.embedded(self._words)
        for name, holder in self.placeholders.items():
            out += self._placeholder_problems(name, holder, used, embedded)
        return out

    def _placeholder_problems(self, name: str, holder: Placeholder, used: list[str],
                              embedded: set[str]) -> list[tuple[str, str]]:
        where = f"placeholders.{name}"
        if name in BUILTIN_PLACEHOLDERS:
            return [(where, f"{{{name}}} is given by orchestrate ({BUILTIN_PLACEHOLDERS[name]}); "
                            "name this placeholder otherwise")]
        param = holder.param or name
        if param not in PARAM_NAMES:
            field = f"{where}.param" if holder.param else where
            hint = "" if holder.param else " (set param = the parameter it maps)"
            return [(field, f"{param!r} is not a cell parameter"
                            f"{_did_you_mean(param, PARAM_NAMES)}{hint}")]
        out = []
        if name not in used:
            out.append((where, f"not used: the command has no {{{name}}}"
                               f"{_did_you_mean(name, used)}"))
        for key, mapped in holder.values.items():
            if _canonical(param, key) is None:
                message = _adapter_message(param, key)
                out.append((f"{where}.values.{key}", f"{key!r} is not a value of {param}: "
                                                      f"{message}"))
            elif len(mapped) != 1 and name in embedded:
                out.append((f"{where}.values.{key}", (
                    f"{len(mapped)} argv items, but {{{name}}} sits inside a word "
                    "with other text: make it a string, or give {" + name + "} a word of "
                    "its own")))
        return out

    def render(self, values: Mapping[str, Any]) -> list[str]:
        """The argv items of the template for one cell: ``values`` has every cell parameter
        and every built-in placeholder. Raises :class:`CommandRenderError` with every problem
        (a value no placeholder entry lists, a parameter value that would be read as an
        option)."""
        problems: list[tuple[str, str]] = []
        value = self._values(values, problems)
        try:
            items = argv_template.render(self._words, value)
        except TemplateError as exc:
            problems.append(("command", str(exc)))
            items = []
        for word in self._words:  # a parameter's own value never becomes an option
            name = argv_template.whole(word)
            if (name in PARAM_NAMES and name not in self.placeholders
                    and value_text(values.get(name)).startswith("-")):
                problems.append(("command", (
                    f"{{{name}}} is a word of its own, and {name} = "
                    f"{value_text(values.get(name))!r} starts with '-': the program would read "
                    f"it as an option; write it inside a word (--{name.replace('_', '-')}="
                    f"{{{name}}}) or map it under placeholders.{name}")))
        if not items and not problems:
            problems.append(("command", "renders to no word at all for this cell"))
        if problems:
            raise CommandRenderError(list(dict.fromkeys(problems)))
        return items

    def required_paths(self, values: Mapping[str, Any]) -> list[tuple[int, str]]:
        """The ``requires`` paths one cell needs, as (index, path): ``values`` as for
        :meth:`render`; an entry whose placeholder maps to [] is not needed. Raises
        :class:`CommandRenderError` like :meth:`render`."""
        problems: list[tuple[str, str]] = []
        value = self._values(values, problems)
        out = []
        for i, words in enumerate(self._required):
            try:
                items = argv_template.render(words, value)
            except TemplateError as exc:
                problems.append((f"requires[{i}].path", str(exc)))
                continue
            out += [(i, item) for item in items]
        if problems:
            raise CommandRenderError(list(dict.fromkeys(problems)))
        return out

    def _values(self, values: Mapping[str, Any], problems: list[tuple[str, str]]
                ) -> Callable[[str], str | list[str]]:
        """What each placeholder stands for in one cell; problems are appended."""

        def value(name: str) -> str | list[str]:
            holder = self.placeholders.get(name)
            if holder is not None:
                param = holder.param or name
                mapped = holder.entry(param, values.get(param))
                if mapped is None:
                    problems.append((f"placeholders.{name}.values", (
                        f"no entry for {param} = {value_text(values.get(param))!r}: add it "
                        f"(or exclude those cells)")))
                    return ""
                return mapped[0] if len(mapped) == 1 else mapped
            got = values.get(name)
            if got is None:
                problems.append(("command", f"{{{name}}} has no value in this cell (set "
                                            f"{name}, or map it under placeholders.{name})"))
                return ""
            return value_text(got)

        return value


def _adapter_message(param: str, key: str) -> str:
    try:
        _adapter(param).validate_strings(key)
    except ValidationError as exc:
        return str(exc.errors(include_url=False)[0]["msg"])
    return ""


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {{{close[0]}}}?)" if close else ""


def command_values(params: CellParams, program: str, *, python: str, output_dir: str,
                   cell_id: str) -> dict[str, Any]:
    """What a command template's placeholders read for one cell: every parameter (``program``
    as resolved) and the built-in placeholders."""
    return {**params.model_dump(), "program": program, "python": python,
            "output_dir": output_dir, "cell_id": cell_id,
            "total_iterations": params.warmup + params.iterations,
            "gpus_per_node": params.gpus_per_node}


@dataclass(frozen=True)
class Program:
    """What a cell runs: our workload (``command`` None) or a matrix's command template, and
    how its figures are read (``figures`` None: our workload's JSON lines)."""

    name: str
    command: CommandTemplate | None = None
    figures: FiguresConfig | None = None

    @property
    def parser(self) -> str:
        """The figures parser of the cell (workload, dllogger, regex)."""
        return self.figures.parser if self.figures is not None else "workload"


def program_of(params: CellParams, profile: HardwareProfile,
               commands: Mapping[str, CommandTemplate],
               figures: FiguresConfig | None = None) -> Program:
    """The program of a cell: its ``program``, else its profile's, else the workload; its
    figures: the command's ``figures``, else the profile's, else the matrix's (``figures``).
    A name that is no command is a :class:`ConfigError` (``load_matrix`` reports it first)."""
    name = params.program or profile.program or WORKLOAD_PROGRAM
    command = None
    if name != WORKLOAD_PROGRAM:
        command = commands.get(name)
        if command is None:
            raise ConfigError(f"no [commands.{name}] template for program {name!r}")
    found = (command.figures if command else None) or profile.figures or figures
    return Program(name, command, found)


# --- the matrix file -------------------------------------------------------------------------


class MatrixSettings(StrictModel):
    name: Name | None = Field(None, description="Defaults to the file name without .toml.")
    description: str = ""
    repeats: Annotated[int, Field(gt=0, le=1000)] = Field(
        1, description="Copies of every cell, 1..1000 (the planned cells are capped at "
        f"{MAX_CELLS} too)."
    )
    backend: str = "process"
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, allow_inf_nan=False)] = Field(
        1800, description=f"Per-cell timeout in seconds, 0 < timeout_s <= {MAX_TIMEOUT_S} "
        "(a week; inf is refused: a hung cell must end).",
    )
    one_cell_per_host: bool = Field(False, description="Never run two cells on a host at once.")
    retries: Annotated[int, Field(ge=0, le=100)] = Field(
        1, description="Retries of a cell whose host was lost, 0..100."
    )
    hosts: str | None = Field(
        None, description="Hosts inventory (TOML) for the ssh backend, relative to this file."
    )
    rerun_throttled: Annotated[int, Field(ge=0, le=10)] = Field(
        0, description="Run a cell again (up to this many times, 0..10) when its GPU throttled "
        "during the measured window (telemetry.throttled); the throttled attempt is kept under "
        "superseded/. 0: never.",
    )
    baseline: Annotated[str, Field(pattern=r"^[a-z_]+=.+$")] | None = Field(
        None, description="KEY=VALUE row the table compares against, e.g. 'hardware=v100' "
        "for Bitfusion/native ratios.",
    )
    table_rule: TableRuleName = Field(
        "median", description="How the table's numbers are made from the cells' figures: "
        "median (ours: median images/s of the ok repeats), or a seed's own rule: dlperf "
        "(DLPerf's median/average/speedup, seed 003), dle (DLE's compute_ips, seed 000), tbd "
        "(TBD's coreutil.py utilisations, seed 001), per-gpu (one column per GPU, seed 002), "
        "habana (images/s per card and scaling %, seed 004). The table names its rule.",
    )


#: Default of ``[control] every``: a control measurement after every this many configuration
#: cells on one host and GPU set.
DEFAULT_CONTROL_EVERY = 2


class ControlSpec(StrictModel):
    """``[control]``: a pinned measurement the sweep runs between the configurations, on the
    same hosts and GPUs, so that their figures can be judged as ratios to it (the machine's own
    drift cancels; :mod:`orchestrator.plan.controls`,
    :mod:`orchestrator.results.statistics.normalise`).

    Exactly one of ``params`` (a fixed setting of our workload, or of a ``[commands.NAME]``
    program with ``program = NAME``; ``[workload]`` fills what it leaves out) and ``cell`` (the
    group id of one of the matrix's cells, which then runs as the control instead of as a
    configuration). The control takes each calibrated cell's ``hardware``: it runs on every
    hardware profile of the matrix.
    """

    params: PartialParams | None = Field(  # type: ignore[valid-type]
        None, description="The control's parameters (our workload at a fixed setting, or a "
        "[commands.NAME] program with program = NAME); [workload] fills the rest; no "
        "hardware: the control runs on each calibrated cell's hardware, host and GPUs.",
    )
    cell: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        None, description="The group id of a cell of this matrix (as `orchestrate plan` "
        "prints it, without -rN) that runs as the control instead of as a configuration.",
    )
    every: Annotated[int, Field(ge=1, le=1000)] = Field(
        DEFAULT_CONTROL_EVERY, description="A control measurement after every N configuration "
        "cells on one host and GPU set, 1..1000 (and one before the first and after the last "
        "cell there); smaller: controls closer in time to each cell, a longer sweep.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ControlSpec:
        if (self.params is None) == (self.cell is None):
            raise ValueError("give exactly one of params (the control's own parameters) and "
                             "cell (a cell of this matrix that runs as the control)")
        return self


class MatrixFile(StrictModel):
    """The whole file, as written (before expansion)."""

    matrix: MatrixSettings = MatrixSettings()
    workload: PartialParams = PartialParams()  # type: ignore[valid-type]
    axes: AxisValues = AxisValues()  # type: ignore[valid-type]
    zip: list[AxisValues] = Field([], max_length=64)  # type: ignore[valid-type]
    include: list[PartialParams] = Field([], max_length=MAX_LIST)  # type: ignore[valid-type]
    exclude: list[ExcludeRule] = Field(  # type: ignore[valid-type]
        [], max_length=MAX_EXCLUDES,
        description=f"At most {MAX_EXCLUDES} rules (each is matched against every combination).",
    )
    hardware: dict[Name, HardwareProfile] = Field({}, max_length=1024)
    commands: dict[Name, CommandTemplate] = Field(
        {}, max_length=256, description="Programs cells can run instead of our workload "
        "(a cell's program = NAME).",
    )
    figures: FiguresConfig | None = Field(
        None, description="How every cell's figures are read and judged, unless its command or "
        "hardware profile says otherwise (default: our workload's JSON lines).",
    )
    control: ControlSpec | None = Field(
        None, description="A pinned measurement run between the configurations on their hosts "
        "and GPUs; history and compare then judge each figure as a ratio to it.",
    )
    publish: PublishSettings | None = Field(
        None, description="Where the matrix's runs are published (an MLflow tracking server, "
        "an HTTP collector) and whether every sweep is, when it ends.",
    )


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a matrix file, for editors (``orchestrate schema``)."""
    schema = MatrixFile.model_json_schema()
    schema["title"] = "orchestrate matrix file"
    return schema


# --- loading ---------------------------------------------------------------------------------




def parse_matrix_file(path: Path, overrides: Sequence[Override] = ()
                      ) -> tuple[MatrixFile, dict[str, Any], str]:
    """Validate a matrix file's structure and types, with ``overrides`` (``--set``,
    :mod:`orchestrator.config.overrides`) applied to its TOML first: each problem they cause
    says so. Returns the model, the raw TOML (overridden) and the text it was parsed from
    (saved with each run, as written)."""
    text = read_config_text(path)
    raw = parse_toml(text, str(path))
    if raw and set(raw) <= {"hosts", "options"}:  # a mix-up, not a matrix with a typo
        raise ConfigError("this is a hosts inventory, not a matrix file (`orchestrate hosts "
                          "check FILE` reads it; a matrix names it with --hosts or [matrix] "
                          "hosts)", file=str(path))
    if overrides:
        raw, problems = apply_overrides(raw, overrides, str(path))
        if problems:
            raise ConfigError(problems)
    try:
        return MatrixFile.model_validate(raw), raw, text
    except ValidationError as exc:
        problems = problems_from_validation(str(path), exc, model=MatrixFile)
        problems += hardware_reference_problems(raw, str(path), problems)
        raise ConfigError(attribute(problems, overrides)) from None


def parse_overrides(items: Sequence[str]) -> list[Override]:
    """``--set KEY=VALUE`` texts as overrides of a matrix file (its field types direct how a
    VALUE is read); a ConfigError listing every one that is no ``KEY=VALUE``."""
    found, problems = read_overrides(items, MatrixFile)
    if problems:
        raise ConfigError(problems)
    return found


def hardware_reference_problems(
    raw: dict[str, Any], file: str, already: list[Problem] | None = None
) -> list[Problem]:
    """Every ``hardware`` value that names no ``[hardware.NAME]`` profile.

    Works on the raw TOML, so it also runs when type errors stopped the model (fields already
    reported in ``already`` are not reported twice).
    """
    profiles: dict[str, Any] = raw["hardware"] if isinstance(raw.get("hardware"), dict) else {}
    places: list[tuple[str, Any]] = []
    workload, axes = raw.get("workload"), raw.get("axes")
    if isinstance(workload, dict) and "hardware" in workload:
        places.append(("workload.hardware", workload["hardware"]))
    if isinstance(axes, dict) and isinstance(axes.get("hardware"), list):
        places += [(f"axes.hardware[{i}]", v) for i, v in enumerate(axes["hardware"])]
    for z, group in enumerate(raw.get("zip") or []):
        if isinstance(group, dict) and isinstance(group.get("hardware"), list):
            places += [(f"zip[{z}].hardware[{i}]", v) for i, v in enumerate(group["hardware"])]
    for i, entry in enumerate(raw.get("include") or []):
        if isinstance(entry, dict) and "hardware" in entry:
            places.append((f"include[{i}].hardware", entry["hardware"]))
    hint = (f"defined profiles: {', '.join(sorted(profiles))}" if profiles
            else "no [hardware.NAME] table defined")
    seen = {p.field for p in already or []}
    return [
        Problem(file, where, f"unknown hardware profile {value!r}; {hint}")
        for where, value in places
        if isinstance(value, str) and value not in profiles and where not in seen
    ]
