"""A cell's command under Apptainer / SingularityCE: ``apptainer exec --nv --cleanenv ...`` (pure).

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
"""

from __future__ import annotations

import base64
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.matrix_file import HardwareProfile, Program
from orchestrator.config.redact import is_secret, resolve_env
from orchestrator.plan.launch import CellCommand, LaunchSpec, NodeLaunch, cell_command
from orchestrator.plan.matrix import Cell

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


def flavour(binary: str) -> str:
    """``apptainer`` or ``singularity``: what a binary is, by its name (Apptainer installs a
    ``singularity`` link to itself, which reads ``SINGULARITYENV_`` too)."""
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
