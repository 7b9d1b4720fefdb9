"""From a cell to the command that runs it: the same argv for every backend.

The workload command is a list of arguments, never a shell string: backends hand it to
``subprocess`` (argv), the Docker SDK (a list ``command``), or quote each element with
:func:`shlex.quote` before a remote shell sees it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import ContainerOptions, HardwareProfile
from orchestrator.matrix import Cell


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a backend needs to start one cell, decided before it starts."""

    cell_id: str
    argv: tuple[str, ...]
    env: dict[str, str]
    device: str
    gpu_ids: tuple[int, ...] = ()
    image: str | None = None
    container: ContainerOptions | None = None
    workdir: str | None = None
    output_dir: str | None = None
    host: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: 1, or more when the cell is retried after its host was lost.
    attempt: int = 1
    #: A multi-node cell's hosts (the first is the rendezvous); empty for one host.
    hosts: tuple[str, ...] = ()

    def shell_line(self) -> str:
        """The command as one safely quoted line (for logs and remote shells)."""
        return shlex.join(self.argv)

    def to_json(self) -> dict[str, Any]:
        return {
            "cell_id": self.cell_id,
            "argv": list(self.argv),
            "shell": self.shell_line(),
            "env": self.env,
            "device": self.device,
            "gpu_ids": list(self.gpu_ids),
            "image": self.image,
            "container": self.container.model_dump() if self.container else None,
            "workdir": self.workdir,
            "output_dir": self.output_dir,
            "host": self.host,
            "hosts": list(self.hosts),
            "attempt": self.attempt,
            "labels": self.labels,
        }


def workload_flags(cell: Cell) -> list[str]:
    """``--key value`` for every workload parameter; booleans as ``--flag`` / ``--no-flag``."""
    flags: list[str] = []
    for key, value in cell.params.workload_params().items():
        name = key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no-{name}")
        else:
            flags += [f"--{name}", str(value)]
    return flags


def workload_argv(
    cell: Cell,
    profile: HardwareProfile,
    *,
    python: str = "python",
    output_dir: str | None = None,
) -> list[str]:
    """The full command of a cell: profiler and runtime wrappers, torchrun, the workload."""
    gpus = cell.params.gpus
    if gpus > 1:
        launcher = [
            python, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={gpus}", "-m", "workload",
        ]
    else:
        launcher = [python, "-m", "workload"]
    argv = [*launcher, *workload_flags(cell), "--device", profile.device]
    if output_dir:
        argv += ["--output-dir", output_dir]
    if profile.checkpoint_dir:
        argv += ["--checkpoint-dir", profile.checkpoint_dir]
    argv = _profiler_wrap(cell, argv, output_dir)
    if profile.wrapper == "bitfusion":
        argv = bitfusion_wrap(profile, gpus, argv)
    return argv


def bitfusion_wrap(profile: HardwareProfile, gpus: int, argv: list[str]) -> list[str]:
    """``bitfusion run -n GPUS -p PARTIAL [-l SERVERS] -- argv``."""
    opts = profile.bitfusion
    wrapped = ["bitfusion", "run", "-n", str(gpus), "-p", f"{opts.partial:g}"]
    if opts.servers:
        wrapped += ["-l", ",".join(opts.servers)]
    return [*wrapped, *opts.extra_args, "--", *argv]


def _profiler_wrap(cell: Cell, argv: list[str], output_dir: str | None) -> list[str]:
    out = f"{output_dir}/profile" if output_dir else "profile"
    if cell.params.profiler == "nsys":
        return ["nsys", "profile", "--force-overwrite=true", "--trace=cuda,nvtx,osrt",
                f"--output={out}", *argv]
    if cell.params.profiler == "ncu":
        return ["ncu", "--target-processes", "all", "--nvtx", "--set", "basic",
                "--export", out, "--force-overwrite", *argv]
    return argv


def workload_env(cell: Cell, profile: HardwareProfile, gpu_ids: tuple[int, ...]) -> dict[str, str]:
    """Environment of the workload process: the profile's, plus device selection.

    ``gpu_ids`` are picked with ``CUDA_VISIBLE_DEVICES`` / ``HABANA_VISIBLE_MODULES`` (a local
    process); pass none where the GPUs come otherwise (a container's device request, Slurm).
    """
    env = {"PYTHONUNBUFFERED": "1", **profile.env}
    if profile.device == "cuda" and gpu_ids and profile.wrapper == "none":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    if profile.device == "hpu" and gpu_ids:
        env["HABANA_VISIBLE_MODULES"] = ",".join(map(str, gpu_ids))
    return env
