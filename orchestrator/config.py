"""The matrix file: typed models, loading and validation.

A matrix file is TOML with these tables (see README, "Matrix files"):

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

Validation reports every problem at once with the file and the field path.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from orchestrator.errors import ConfigError, Problem

# --- cell parameters -------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
Precision = Literal["fp32", "amp", "bf16"]
Mode = Literal["train", "infer"]
CompileMode = Literal["none", "default", "reduce-overhead", "max-autotune"]
Profiler = Literal["none", "torch", "nsys", "ncu"]

#: Parameters the orchestrator consumes itself; every other one is passed to the workload.
ORCHESTRATOR_PARAMS = frozenset({"hardware", "gpus"})


class StrictModel(BaseModel):
    """Base of every user-file model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CellParams(StrictModel):
    """Every parameter of one cell. Axes, zips, includes and [workload] defaults set these."""

    hardware: Name = Field(description="Hardware profile name (a [hardware.NAME] table).")
    gpus: PositiveInt = Field(1, description="Accelerators (or CPU worker processes) per cell.")
    batch_size: PositiveInt = Field(64, description="Batch size per GPU / rank.")
    precision: Precision = Field("fp32", description="fp32, amp (fp16 autocast) or bf16.")
    mode: Mode = Field("train", description="train or infer.")
    arch: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        "resnet50", description="torchvision classification model name."
    )
    image_size: Annotated[int, Field(ge=16, le=4096)] = Field(224, description="Input size, px.")
    warmup: NonNegativeInt = Field(20, description="Warmup iterations, excluded from metrics.")
    iterations: PositiveInt = Field(100, description="Measured iterations.")
    data: Annotated[str, Field(min_length=1)] = Field(
        "synthetic",
        description="'synthetic' or an ImageFolder dataset path (as the runner sees it).",
    )
    channels_last: bool = Field(True, description="Use the channels-last memory format.")
    compile: CompileMode = Field("none", description="torch.compile mode, or none.")
    cuda_graphs: bool = Field(False, description="Capture the step in a CUDA graph.")
    pretrained: bool = Field(False, description="Load weights from the checkpoint dir (infer).")
    num_classes: PositiveInt = Field(1000, description="Classifier classes.")
    workers: NonNegativeInt = Field(4, description="Data loader workers (real data).")
    seed: NonNegativeInt = Field(0, description="Random seed.")
    profiler: Profiler = Field("none", description="Per-cell profiler: none, torch, nsys, ncu.")

    def workload_params(self) -> dict[str, Any]:
        """The parameters the workload receives as command-line flags."""
        return {k: v for k, v in self.model_dump().items() if k not in ORCHESTRATOR_PARAMS}


PARAM_NAMES: tuple[str, ...] = tuple(CellParams.model_fields)


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
    "AxisValues", lambda t: Annotated[list[t], Field(min_length=1)] | None  # type: ignore[valid-type]
)
#: ``[[exclude]]``: parameter -> a value or a list of values (any of them matches).
ExcludeRule = _derived("ExcludeRule", lambda t: t | list[t] | None)  # type: ignore[valid-type]


# --- hardware profiles -----------------------------------------------------------------------


class Mount(StrictModel):
    """A bind mount into the container (a dataset at /imagenet, checkpoints at the hub cache)."""

    source: Annotated[str, Field(min_length=1)]
    target: Annotated[str, Field(pattern=r"^/")]
    read_only: bool = True


class ContainerOptions(StrictModel):
    """How the container is started (Docker / Singularity backends)."""

    ipc: Literal["host", "private", "shareable"] = "host"
    shm_size: Annotated[str, Field(pattern=r"^[0-9]+[bkmgBKMG]?$")] = "8g"
    privileged: bool = False
    mounts: list[Mount] = []
    devices: list[str] = Field([], description="Extra device nodes, e.g. /dev/accel for Gaudi.")
    cap_add: list[str] = []
    ulimits: dict[str, int] = Field(
        {"memlock": -1, "stack": 67108864},
        description="ulimits (soft = hard); -1 is unlimited. NVIDIA's recommended defaults; "
        "a table here replaces them whole.",
    )
    mem_limit: str | None = Field(None, description="Container memory limit, e.g. '16g'.")
    network: str | None = Field(None, description="Docker network mode, e.g. 'host'.")
    runtime: str | None = Field(None, description="OCI runtime, e.g. 'habana'.")


class BitfusionOptions(StrictModel):
    """``bitfusion run -n GPUS -p PARTIAL [-l SERVERS] -- <workload>``."""

    partial: Annotated[float, Field(gt=0, le=1)] = 1.0
    servers: list[str] = []
    extra_args: list[str] = []


#: A value that ends up on an ``#SBATCH`` line: one line, no control characters.
SbatchValue = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]+$")]


class SlurmOptions(StrictModel):
    """``sbatch`` options of a profile's cells (slurm backend)."""

    partition: SbatchValue | None = None
    account: SbatchValue | None = None
    qos: SbatchValue | None = None
    time_limit: Annotated[str, Field(pattern=r"^[0-9]+(-[0-9]+)?(:[0-9]+){0,2}$")] | None = Field(
        None, description="--time of every cell (Slurm format, e.g. '02:00:00'); default: "
        "the per-cell timeout plus 5 minutes.",
    )
    cpus_per_task: PositiveInt | None = None
    cpus_per_gpu: PositiveInt | None = None
    mem: Annotated[str, Field(pattern=r"^[0-9]+[KMGT]?$")] | None = Field(
        None, description="--mem per node, e.g. '32G'."
    )
    max_jobs: PositiveInt | None = Field(
        None, description="At most this many of the profile's cells in Slurm at once "
        "(default: submit every cell; Slurm queues them).",
    )
    extra_args: list[SbatchValue] = Field(
        [], description="More sbatch options, one per #SBATCH line, in --name=value form, "
        "e.g. '--constraint=a100'."
    )


class HardwareProfile(StrictModel):
    """What a ``hardware`` value means: device, image, wrapper, container options, placement."""

    description: str = ""
    device: Literal["cuda", "hpu", "cpu"]
    image: str | None = Field(None, description="Image template name (images/NAME).")
    image_vars: dict[str, Any] = {}
    wrapper: Literal["none", "bitfusion"] = "none"
    bitfusion: BitfusionOptions = BitfusionOptions()
    container: ContainerOptions = ContainerOptions()
    slurm: SlurmOptions = SlurmOptions()
    env: dict[str, str] = {}
    hosts: list[str] = Field([], description="Hosts (inventory names) allowed to run it.")
    gpu_ids: list[NonNegativeInt] | None = Field(
        None, description="Local GPU ids to use (default: all visible)."
    )
    multi_node: bool = False
    checkpoint_dir: str | None = Field(
        None, description="Where pretrained weights are (the torch hub cache as mounted)."
    )

    @model_validator(mode="after")
    def _wrapper_needs_cuda(self) -> HardwareProfile:
        if self.wrapper == "bitfusion" and self.device != "cuda":
            raise ValueError("wrapper 'bitfusion' needs device = 'cuda'")
        return self


# --- the matrix file -------------------------------------------------------------------------


class MatrixSettings(StrictModel):
    name: Name | None = Field(None, description="Defaults to the file name without .toml.")
    description: str = ""
    repeats: PositiveInt = 1
    backend: str = "process"
    timeout_s: Annotated[float, Field(gt=0)] = Field(1800, description="Per-cell timeout.")
    one_cell_per_host: bool = Field(False, description="Never run two cells on a host at once.")
    retries: NonNegativeInt = Field(1, description="Retries of a cell whose host was lost.")
    hosts: str | None = Field(
        None, description="Hosts inventory (TOML) for the ssh backend, relative to this file."
    )
    baseline: Annotated[str, Field(pattern=r"^[a-z_]+=.+$")] | None = Field(
        None, description="KEY=VALUE row the table compares against, e.g. 'hardware=v100' "
        "for Bitfusion/native ratios.",
    )


class MatrixFile(StrictModel):
    """The whole file, as written (before expansion)."""

    matrix: MatrixSettings = MatrixSettings()
    workload: PartialParams = PartialParams()  # type: ignore[valid-type]
    axes: AxisValues = AxisValues()  # type: ignore[valid-type]
    zip: list[AxisValues] = []  # type: ignore[valid-type]
    include: list[PartialParams] = []  # type: ignore[valid-type]
    exclude: list[ExcludeRule] = []  # type: ignore[valid-type]
    hardware: dict[Name, HardwareProfile] = {}


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a matrix file, for editors (``orchestrate schema``)."""
    schema = MatrixFile.model_json_schema()
    schema["title"] = "orchestrate matrix file"
    return schema


# --- loading ---------------------------------------------------------------------------------


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def problems_from_validation(
    file: str, exc: ValidationError, keys_hint: str = "`orchestrate schema` lists the keys"
) -> list[Problem]:
    """Turn pydantic's errors into :class:`Problem` values with readable field paths."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key (check the spelling; {keys_hint})"
        elif (
            "input" in err
            and err["type"] not in ("missing",)
            and not isinstance(err["input"], dict | list)
            # our own validators' messages already show the value
            and not (err["type"] == "value_error" and repr(err["input"]) in msg)
        ):
            msg = f"{msg} (got {err['input']!r})"
        problems.append(Problem(file, _field_path(loc), msg))
    return problems


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a :class:`ConfigError`."""
    return parse_toml(read_config_text(path), str(path))


def read_config_text(path: Path) -> str:
    """A config file's text; a missing or unreadable file is a :class:`ConfigError`."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such file (looked at {path.resolve()})", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None


def parse_toml(text: str, file: str) -> dict[str, Any]:
    """Parse TOML text; malformed TOML is a :class:`ConfigError` naming ``file``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", file=file) from None


def parse_matrix_file(path: Path) -> tuple[MatrixFile, dict[str, Any], str]:
    """Validate a matrix file's structure and types. Returns the model, the raw TOML and the
    text it was parsed from (saved with each run)."""
    text = read_config_text(path)
    raw = parse_toml(text, str(path))
    try:
        return MatrixFile.model_validate(raw), raw, text
    except ValidationError as exc:
        problems = problems_from_validation(str(path), exc)
        problems += hardware_reference_problems(raw, str(path), problems)
        raise ConfigError(problems) from None


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
