"""The Apptainer / SingularityCE runtime: a cell's program in ``apptainer exec --cleanenv ...``.

HPC centres run containers with Apptainer (the Linux Foundation successor of Singularity) or
SingularityCE, not Docker. A profile with ``runtime = "apptainer"`` (or ``"singularity"``) runs
each cell's program (:func:`orchestrator.plan.launch.cell_command`, with the image's ``python3``;
several GPUs under torchrun *inside* the container) as::

    apptainer exec [--nv] --cleanenv --bind SRC:DST[:ro] ... --pwd DIR [--env NAME=VALUE ...]
        [extra_args] IMAGE.sif <argv>

* ``--nv`` (CUDA profiles) binds the host's NVIDIA driver libraries and every GPU device into
  the container; which GPUs the program uses is ``CUDA_VISIBLE_DEVICES``, passed in explicitly
  because ``--cleanenv`` drops the host environment: the local GPU ids the process and ssh
  backends pin (an ``--env`` argument), or, under Slurm, the job's own value from Slurm's
  allocation at run time (the batch script exports ``APPTAINERENV_CUDA_VISIBLE_DEVICES``).
* ``--cleanenv``: the container sees its image's environment (``%environment``) plus what is
  passed, nothing else of the launcher's: the same cell gets the same environment wherever it
  is launched from.
* Binds: the profile's ``container.mounts`` and ``apptainer.binds``, then the cell's folder at
  its own path (``--output-dir`` is the same path inside and out). Apptainer's ``--bind``
  separates binds with ``,`` and fields with ``:``, so neither may appear in a bound path
  (:func:`bind_problem`). The working directory (``--pwd``) is the command's ``workdir``, else
  the cell's folder, so ``python3 -m workload`` imports the image's workload, never a checkout's.
* Environment: a public variable whose value ``--env`` reads back unchanged is an ``--env``
  argument (that flag is a ``key=value`` list: a value with ``=`` in it, or ``"`` at either
  end, would come out changed). It is visible in the argv: command.json and ``ps`` on the
  machine. Every other variable, and every secret, travels in the launcher's environment as
  ``APPTAINERENV_NAME`` (``SINGULARITYENV_NAME`` for ``singularity``), which the runtime puts
  into the container even under ``--cleanenv``: nothing written, nothing in ``ps`` (a process's
  environment is readable by its user and root only) — :func:`launcher_env`; over SSH they are
  written to the command's stdin and exported there (:func:`remote_argv`).

How each backend starts it: the process backend as a local process (:func:`launch_spec`,
:func:`launch_env`), the ssh backend as a process on its host over SSH (:func:`launch_spec`,
:func:`remote_command`; one host per cell), the slurm backend in its batch script
(:func:`batch_command`). The docker backend runs Docker containers only.

**What it needs from the host** where the cells run: the runtime's program and every bind
source (:func:`host_problems`, asked of a :class:`~orchestrator.images.sif.Machine`: this one,
or a lab host over SSH), and the ``.sif`` of each image (:func:`plan_sifs`: a profile's ready
``apptainer.sif``, else built from its template and cached by content hash,
:mod:`orchestrator.images.sif`). :func:`prepare` makes sure of both before the first cell.

**What it checks before the run** (:func:`check_profile`, for ``validate``, ``--dry-run`` and
the sweep alike): CUDA or CPU profiles only (no Gaudi, no Bitfusion wrapper), one host per cell
on ssh, bind paths absolute and free of ``,`` and ``:``, an image to run (a template or a ready
``.sif``), a release of its own (no ``release = "auto"``). What must exist where the cells run
(:func:`host_problems`) is part of the one decision on this machine's backends (process, slurm:
:func:`orchestrator.backends.checks.preflight`), and checked on each lab host when an ssh
sweep reaches it.
"""

from __future__ import annotations

import base64
import functools
import posixpath
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config.matrix_file import HardwareProfile, Program
from orchestrator.config.redact import is_secret, resolve_env
from orchestrator.config.syntax import words
from orchestrator.errors import ConfigError, Problem, Requirement
from orchestrator.images import build
from orchestrator.images.sif import Machine, SifPlan, ensure_sif, plan_sif
from orchestrator.plan import selection
from orchestrator.plan.launch import CellCommand, LaunchSpec, NodeLaunch, cell_command
from orchestrator.plan.matrix import Cell
from orchestrator.plan.selection import ImageKey
from orchestrator.runtimes import BackendFacts, Report

if TYPE_CHECKING:
    from orchestrator.plan.matrix import Matrix

#: The interpreter inside the images (NGC's, and the test base image's).
PYTHON = "python3"
#: A variable name as shells accept it.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Environment prefixes the runtimes read from the launcher's environment, by flavour.
ENV_PREFIXES = {"apptainer": "APPTAINERENV_", "singularity": "SINGULARITYENV_"}


@dataclass(frozen=True)
class Bind:
    """One ``--bind SOURCE:TARGET[:ro]``."""

    source: str
    target: str
    read_only: bool = False

    def spec(self) -> str:
        """The ``--bind`` value."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


def binary_of(profile: HardwareProfile) -> str:
    """The runtime's program: the profile's ``apptainer.binary``, else the runtime's name."""
    return profile.apptainer.binary or (profile.runtime or "apptainer")


@functools.lru_cache(maxsize=256)
def flavour(binary: str) -> str:
    """``apptainer`` or ``singularity``: what a binary is, by its name (Apptainer installs a
    ``singularity`` link to itself, which reads ``SINGULARITYENV_`` too). Asked once per
    binary (each cell asks it several times)."""
    name = posixpath.basename(binary)
    return "singularity" if name.startswith("singularity") else "apptainer"


def env_prefix(binary: str) -> str:
    """The prefix of the variables the runtime moves into the container."""
    return ENV_PREFIXES[flavour(binary)]


def bind_problem(path: str) -> str:
    """Why ``path`` cannot be one side of a ``--bind`` ('' when it can)."""
    if not path.startswith("/"):
        return f"{path!r} is not an absolute path"
    bad = sorted({ch for ch in path if ch in ",:"})
    if bad:
        return (f"{path!r} contains {' and '.join(repr(c) for c in bad)}, which apptainer's "
                "--bind reads as separators (bind a parent folder, or rename it)")
    return ""


def binds_of(profile: HardwareProfile, output_dir: str | None) -> list[Bind]:
    """The cell's binds: the profile's mounts, its Apptainer binds, its own folder."""
    mounts = [*profile.container.mounts, *profile.apptainer.binds]
    binds = [Bind(m.source, m.target, m.read_only) for m in mounts]
    if output_dir:
        binds.append(Bind(output_dir, output_dir))
    return binds


def flag_safe(value: str) -> bool:
    """Whether ``--env NAME=value`` gives the container exactly ``value``."""
    return "=" not in value and not value.startswith('"') and not value.endswith('"') \
        and "\n" not in value


def flag_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` passed as ``--env`` arguments: public and flag-safe."""
    return {k: v for k, v in env.items() if not is_secret(k, v) and flag_safe(v)}


def prefixed_env(env: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The variables of ``env`` that are no ``--env`` argument (secrets among them), each named
    ``prefix + NAME``, as written (``$env:`` references unresolved: a batch script's)."""
    passed = flag_env(env)
    return {prefix + k: v for k, v in env.items() if k not in passed}


def launcher_env(env: Mapping[str, str], prefix: str,
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``env`` that travel in the launcher's environment (secrets resolved from
    ``environ``, default this process's), each named ``prefix + NAME``."""
    return resolve_env(prefixed_env(env, prefix), environ)


def exec_argv(
    binary: str,
    image: str,
    argv: list[str],
    *,
    nv: bool,
    binds: list[Bind],
    env: Mapping[str, str],
    pwd: str | None,
    extra_args: list[str] | tuple[str, ...] = (),
) -> list[str]:
    """``binary exec [--nv] --cleanenv --bind ... --pwd DIR --env ... [extra] image argv``;
    ``env``: the program's environment (only its :func:`flag_env` part becomes arguments)."""
    out = [binary, "exec"]
    if nv:
        out.append("--nv")
    out.append("--cleanenv")
    for bind in binds:
        out += ["--bind", bind.spec()]
    if pwd:
        out += ["--pwd", pwd]
    for key, value in flag_env(env).items():
        out += ["--env", f"{key}={value}"]
    return [*out, *extra_args, image, *argv]


#: What runs an Apptainer cell over SSH before its argv: reads ``NAME=<base64 value>`` lines
#: from stdin and exports them (a value's trailing newlines are lost: shell command
#: substitution), then ``exec``-s the argv. Fixed text; the names and values are data.
ENV_READER = ('while IFS= read -r line; do case $line in *=*) '
              'export "${line%%=*}=$(printf %s "${line#*=}" | base64 -d)";; esac; done; '
              'exec "$@"')


def remote_argv(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], bytes]:
    """The command that runs ``argv`` on an SSH host with ``env`` exported, and the bytes to
    write to its stdin: the variables travel there (base64), never in a command line that
    ``ps`` or a log on the host would show."""
    for name in env:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"invalid environment variable name {name!r}")
    payload = "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in env.items())
    return ["sh", "-c", ENV_READER, "sh", *argv], payload.encode()


def runtime_record(binary: str, image: str) -> dict[str, Any]:
    """What ran the cell, for command.json and the result's provenance."""
    return {"name": flavour(binary), "binary": binary, "image": image,
            "env_prefix": env_prefix(binary)}


def apptainer_command(
    cell: Cell,
    profile: HardwareProfile,
    program: Program,
    *,
    image: str,
    output_dir: str,
    gpu_ids: tuple[int, ...] = (),
    node: NodeLaunch | None = None,
) -> CellCommand:
    """The command of ``cell`` under ``apptainer exec`` with ``image`` (a .sif path where the
    cell runs), writing into ``output_dir`` (bound at its own path). ``gpu_ids``: the local GPUs
    to pin (none under Slurm, whose job passes its own). The environment is the program's
    (command.json shows it redacted); :func:`launcher_env` gives what the launcher adds."""
    inner = cell_command(cell, profile, program, python=PYTHON, output_dir=output_dir,
                         gpu_ids=gpu_ids, node=node)
    binary = binary_of(profile)
    argv = exec_argv(
        binary, image, inner.argv, nv=profile.device == "cuda",
        binds=binds_of(profile, output_dir), env=inner.env,
        pwd=inner.workdir or output_dir, extra_args=profile.apptainer.extra_args,
    )
    return CellCommand(argv, inner.env, None, inner.program)


def launch_spec(cell: Cell, profile: HardwareProfile, program: Program, *, image: str,
                output_dir: str, gpu_ids: tuple[int, ...], attempt: int,
                host: str | None = None) -> LaunchSpec:
    """The launch of an Apptainer cell started as a process (here, or on ``host`` over SSH):
    :func:`apptainer_command` in the cell's folder, its GPUs pinned, the runtime recorded."""
    command = apptainer_command(cell, profile, program, image=image, output_dir=output_dir,
                                gpu_ids=gpu_ids)
    return LaunchSpec(
        cell_id=cell.id, argv=tuple(command.argv), env=command.env, device=profile.device,
        gpu_ids=gpu_ids, image=image, workdir=output_dir, output_dir=output_dir, host=host,
        attempt=attempt, mem_limit=profile.container.mem_limit if host is None else None,
        program=command.program, runtime=runtime_record(binary_of(profile), image),
    )


def launch_env(spec: LaunchSpec, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a local launcher's environment carries into the container of ``spec`` (an Apptainer
    launch): the variables no ``--env`` argument carries, secrets resolved (:func:`launcher_env`),
    and ``extra`` (the cell's marker), each with the runtime's prefix."""
    prefix = spec.runtime["env_prefix"]
    env = launcher_env(spec.env, prefix)
    env.update({prefix + k: v for k, v in (extra or {}).items()})
    return env


def remote_command(spec: LaunchSpec) -> tuple[list[str], bytes]:
    """The command that starts ``spec`` (an Apptainer launch) on its SSH host and the bytes for
    its stdin: the variables ``--env`` does not carry, secrets among them, never in a command
    line (:func:`remote_argv`)."""
    return remote_argv(spec.argv, launcher_env(spec.env, spec.runtime["env_prefix"]))


@dataclass(frozen=True)
class BatchCommand:
    """An Apptainer cell as a batch script runs it (``srun`` is the scheduler's)."""

    argv: list[str]
    #: What the script exports: the variables ``--env`` does not carry, with the runtime's
    #: prefix, as written (secrets: named, passed by the scheduler from its own environment).
    env: dict[str, str]
    #: The variable the script sets to the job's ``CUDA_VISIBLE_DEVICES`` (None: no GPUs):
    #: ``--cleanenv`` drops the job's own.
    gpu_env: str | None
    program: dict[str, Any]
    #: :func:`runtime_record`.
    runtime: dict[str, Any]


def batch_command(cell: Cell, profile: HardwareProfile, program: Program, *, image: str,
                  output_dir: str, gpus: bool, node: NodeLaunch | None = None) -> BatchCommand:
    """``cell`` under ``apptainer exec`` in a batch job whose GPUs the scheduler grants at run
    time (``gpus``: it asks for some): :func:`apptainer_command` with no GPU ids pinned;
    ``node``: the cell's part of a multi-node launch (the job's ``srun`` runs it per node)."""
    command = apptainer_command(cell, profile, program, image=image, output_dir=output_dir,
                                node=node)
    binary = binary_of(profile)
    prefix = env_prefix(binary)
    return BatchCommand(
        argv=command.argv, env=prefixed_env(command.env, prefix),
        gpu_env=f"{prefix}CUDA_VISIBLE_DEVICES" if gpus else None, program=command.program,
        runtime=runtime_record(binary, image),
    )


# --- what it needs from the host -------------------------------------------------------------


def plan_sifs(matrix: Matrix, cells: Iterable[Cell], images: build.ImagePlans | None = None
              ) -> dict[ImageKey, SifPlan]:
    """The ``.sif`` of every image the Apptainer cells need, by image key (a profile, and the
    release a cell pins with ``ngc_release``); nothing built. A Docker conversion's name here
    is the unpinned plan's: :func:`orchestrator.images.sif.ensure_sif` names it by the pinned
    Docker image's hash. ``images``: the matrix's image plans made so far (a dry run asks
    cell by cell; each image is planned once).

    A profile with neither an image template nor ``apptainer.sif`` is a :class:`ConfigError`.
    """
    images = images or build.ImagePlans(matrix)
    problems: list[Problem] = []
    plans: dict[ImageKey, SifPlan] = {}
    for key in sorted({selection.image_key(matrix, c) for c in cells
                       if matrix.profiles[c.hardware].apptainer_runtime},
                      key=lambda k: (k.hardware, k.ngc_release or "")):
        profile = matrix.profiles[key.hardware]
        binary = binary_of(profile)
        opts = profile.apptainer
        if opts.sif:
            plans[key] = SifPlan(opts.sif, "given", None, binary, opts.fakeroot)
            continue
        try:
            image = images.get(key)[1]
        except ConfigError as exc:
            problems += exc.problems
            continue
        plans[key] = plan_sif(image, binary=binary, directory=opts.image_dir,
                              fakeroot=opts.fakeroot)
    if problems:
        raise ConfigError(problems)
    return plans


def host_problems(matrix: Matrix, profiles: Iterable[str], machine: Machine
                  ) -> list[Requirement]:
    """What stops the profiles' cells on ``machine`` (requirements of the machine, not of the
    file): a runtime binary that is not there, a ready ``.sif`` that is not there, a bind
    source that does not exist there (apptainer refuses to bind a missing path)."""
    file = str(matrix.path)
    problems: list[Requirement] = []
    for hw in profiles:
        profile = matrix.profiles[hw]
        where = f"hardware.{hw}"
        binary = binary_of(profile)
        if machine.which(binary) is None:
            problems.append(Requirement(file, f"{where}.apptainer.binary", (
                f"{binary!r} is not on PATH on {machine.name}: install Apptainer (or "
                f"SingularityCE), or name its program in [hardware.{hw}.apptainer] binary "
                "(an absolute path, or 'singularity')"), kind="binary"))
        given = profile.apptainer.sif
        if given and not machine.exists(machine.expand(given)):
            problems.append(Requirement(file, f"{where}.apptainer.sif", (
                f"{machine.expand(given)} does not exist on {machine.name}: give the path of a "
                "ready .sif there, or leave sif out to build the profile's image"), kind="image"))
        mounts = [("container.mounts", profile.container.mounts),
                  ("apptainer.binds", profile.apptainer.binds)]
        for table, entries in mounts:
            for i, mount in enumerate(entries):
                source = machine.expand(mount.source)
                if not bind_problem(source) and not machine.exists(source):
                    problems.append(Requirement(file, f"{where}.{table}[{i}].source", (
                        f"{source} does not exist on {machine.name}: apptainer refuses to bind "
                        "a missing path (create it, or fix the path)"), kind="data"))
    return problems


def prepare(
    matrix: Matrix,
    cells: Iterable[Cell],
    machine: Machine,
    *,
    plans: dict[ImageKey, SifPlan] | None = None,
    on_log: Callable[[str], None] | None = None,
    docker: Any = None,
    say: Callable[[str], None] | None = None,
) -> dict[ImageKey, str]:
    """Before a backend's first cell on ``machine``: refuse (every problem at once, a
    :class:`ConfigError` naming the field) what :func:`host_problems` finds there; then make
    sure every image the Apptainer cells need is there (``plans``: those images, else
    :func:`plan_sifs` of ``cells``; ``docker``: an engine client on that machine, for a
    conversion). Returns each image's path there, by image key. ``on_log`` hears the builds'
    output; ``say`` (default ``on_log``) one line per image:
    ``<machine>: image PATH (source): built in 12.3 s``."""
    plans = plan_sifs(matrix, cells) if plans is None else plans
    say = say or on_log
    problems = host_problems(matrix, sorted({k.hardware for k in plans}), machine)
    if problems:
        raise ConfigError(problems)
    paths = {}
    for key, plan in plans.items():
        try:
            outcome = ensure_sif(plan, machine, on_log, docker)
        except ConfigError as exc:
            raise ConfigError([Problem(str(matrix.path), f"hardware.{key.hardware}.apptainer.sif",
                                       p.message) for p in exc.problems]) from None
        if say is not None:
            say(f"{machine.name}: image {outcome.path} ({plan.source}): {outcome.summary}")
        paths[key] = outcome.path
    return paths


def image_path(matrix: Matrix, cell: Cell, prepared: Mapping[ImageKey, str],
               machine: Machine | None = None, images: build.ImagePlans | None = None,
               planned: dict[ImageKey, str] | None = None) -> str:
    """The ``.sif`` ``cell`` runs: the one :func:`prepare` made sure of (``prepared``), else (a
    dry run) where it would be, ``~`` expanded on ``machine`` (None: left for the host where
    the cell runs); ``images``: the image plans made so far (:func:`plan_sifs`), ``planned``:
    the paths found so far this way, by image key (a dry run asks cell by cell)."""
    key = selection.image_key(matrix, cell)
    path = prepared.get(key)
    if path is None and planned is not None:
        path = planned.get(key)
    if path is None:
        path = plan_sifs(matrix, [cell], images)[key].path
        if machine is not None:
            path = machine.expand(path)
        if planned is not None:
            planned[key] = path
    return path


# --- what it checks before the run -----------------------------------------------------------

def refused_on(backend: BackendFacts, profile: HardwareProfile, runs_on: Sequence[str]
               ) -> str | None:
    """Why ``profile``'s cells cannot run under Apptainer on ``backend`` (one that starts no
    process of ours); None where they can. ``runs_on``: the backends that run it."""
    if "apptainer" in backend.runtimes:
        return None
    runtime = profile.runtime
    return (f"runtime {runtime!r} runs `{runtime} exec` on the {words(runs_on)} backends; "
            f"the {backend.name} backend runs Docker containers (pick another backend, or "
            "remove runtime)")


def check_profile(report: Report, file: str, hw: str, profile: HardwareProfile,
                  backend: BackendFacts) -> None:
    """What a profile under Apptainer cannot do (errors) or what is not checked (notes) on
    ``backend`` (one that runs it), before anything is built (the module docstring)."""
    where = f"hardware.{hw}"
    runtime = profile.runtime
    if profile.device == "hpu":
        report.error(Problem(file, f"{where}.runtime", (
            f"runtime {runtime!r} runs CUDA (--nv) and CPU profiles; Gaudi (device hpu) runs in "
            "Docker with the habana runtime")))
    if profile.wrapper != "none":
        report.error(Problem(file, f"{where}.wrapper", (
            f"wrapper {profile.wrapper!r} is not available under runtime {runtime!r}: the "
            "Bitfusion client runs in a Docker image of its own (runtime docker)")))
    if profile.multi_node and backend.multi_node == "hosts":
        report.error(Problem(file, f"{where}.multi_node", (
            f"cells spanning several hosts are not run under runtime {runtime!r} (one host per "
            "cell): set multi_node = false")))
    for table, mounts in (("container.mounts", profile.container.mounts),
                          ("apptainer.binds", profile.apptainer.binds)):
        for i, mount in enumerate(mounts):
            for side in ("source", "target"):
                value = getattr(mount, side)
                if side == "source" and value.startswith("~/"):
                    continue  # expanded where the cell runs
                problem = bind_problem(value)
                if problem:
                    report.error(Problem(file, f"{where}.{table}[{i}].{side}", problem))
    if profile.image is None:
        if profile.apptainer.sif is None:
            report.error(Problem(file, f"{where}.image", (
                f"runtime {runtime!r} runs an image: name a template (singularity, or a "
                "Dockerfile template to convert) or a ready .sif in apptainer.sif")))
        else:
            report.note(Problem(file, f"{where}.apptainer.sif", (
                f"a ready image ({profile.apptainer.sif}): its torch, models and profilers are "
                "not checked (name the template it was built from in image to have them "
                "checked)")))
    elif profile.release == selection.AUTO:
        report.error(Problem(file, f"{where}.release", (
            f"release = 'auto' (a release per host's driver) is not offered under runtime "
            f"{runtime!r}: pin the release in image_vars (base_tag), or make it an axis "
            "(ngc_release)")))
