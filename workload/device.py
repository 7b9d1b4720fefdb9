"""Device selection, distributed setup and the ``env`` block of the output.

Optional extras are imported only inside guarded functions: ``habana_frameworks.torch``
(Gaudi / ``hpu``) and ``pynvml`` (driver version).  Without them everything still runs.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torchvision

from workload import compat
from workload.errors import ConfigError, DeviceError
from workload.telemetry import nvml_device_driver_version


@dataclass(frozen=True)
class Dist:
    """Where this process sits in a (possibly single-process) run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def enabled(self) -> bool:
        """True when running under torchrun with more than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that prints metric lines."""
        return self.rank == 0


def dist_from_env(environ: dict[str, str] | None = None) -> Dist:
    """Read RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE as torchrun sets them."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    return Dist(
        rank=int(env.get("RANK", "0")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=world,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
    )


def habana_installed() -> bool:
    """True when ``habana_frameworks`` is installed (found, not imported: importing it reads
    ``PT_HPU_LAZY_MODE`` once, see :func:`hpu_mode`)."""
    return importlib.util.find_spec("habana_frameworks") is not None


def habana_available() -> bool:
    """True when ``habana_frameworks.torch`` imports (registers the ``hpu`` device)."""
    try:
        import habana_frameworks.torch.core  # noqa: F401  (optional extra: Gaudi)
    except Exception:
        return False
    return True


def resolve_device(requested: str) -> str:
    """Map ``auto|cuda|cpu|hpu`` to the device type that will run, or raise DeviceError."""
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if habana_available():
            return "hpu"
        return "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "--device cuda was requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); check the GPU "
            "is visible in the container (--gpus / CUDA_VISIBLE_DEVICES) or use --device auto"
        )
    if requested == "hpu" and not habana_available():
        raise DeviceError(
            "--device hpu was requested but habana_frameworks.torch is not importable; "
            "run inside a Gaudi (Habana) PyTorch image or use --device auto"
        )
    return requested


def torch_device(device: str, dist: Dist) -> torch.device:
    """The torch.device of this rank (and make it current on CUDA)."""
    if device == "cuda":
        count = torch.cuda.device_count()
        index = dist.local_rank % max(count, 1)
        if dist.local_world_size > count:
            raise DeviceError(
                f"{dist.local_world_size} processes per node but only {count} CUDA devices "
                "are visible; lower --nproc_per_node"
            )
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if device == "hpu":
        return torch.device("hpu")
    return torch.device("cpu")


def init_distributed(device: str, dist: Dist, dev: torch.device) -> None:
    """Initialise the process group when running under torchrun with several processes.

    ``dev`` is this rank's device (from :func:`torch_device`, which must run first so that each
    rank binds its own GPU, not GPU 0)."""
    if not dist.enabled:
        return
    backend = {"cuda": "nccl", "hpu": "hccl", "cpu": "gloo"}[device]
    if device == "hpu":
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (optional extra)
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(minutes=10)}
    kwargs |= compat.process_group_kwargs(device, dev)
    torch.distributed.init_process_group(**kwargs)


def shutdown_distributed() -> None:
    """Destroy the process group if one is up."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


def resolve_precision(precision: str, device: str, warn: Any) -> str:
    """The precision that will actually run; ``warn`` is called with a note on a change."""
    if precision == "amp" and device == "hpu":
        warn("Gaudi mixed precision is bf16: --precision amp runs as bf16 autocast")
        return "bf16"
    if precision not in ("fp32", "amp", "bf16"):
        raise ConfigError(f"unknown --precision {precision!r}; use fp32, amp or bf16")
    if device == "cpu" and not compat.autocast(device, precision).available:
        raise ConfigError(
            f"--precision {precision} on the CPU: torch {torch.__version__} cannot autocast the "
            "CPU to that dtype; use --precision bf16 or fp32"
        )
    if precision == "amp" and device == "cpu":
        warn("--precision amp (fp16 autocast) is very slow on most CPUs; bf16 is the CPU choice")
    return precision


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context for a precision (a no-op for fp32); see
    :func:`workload.compat.autocast`."""
    context: contextlib.AbstractContextManager[Any] = compat.autocast(device, precision)()
    return context


def synchronize(device: str) -> None:
    """Wait for the device's queued work."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "hpu":
        torch.hpu.synchronize()  # type: ignore[attr-defined]


#: PT_HPU_LAZY_MODE of each Gaudi execution mode (read by habana_frameworks when it is imported).
HPU_LAZY_MODE = {"eager": "0", "lazy": "1", "compile": "0", "graph": "0"}


def hpu_mode(requested: str | None, compile_mode: str, environ: Any = None) -> str:
    """The Gaudi execution mode of this run, with ``PT_HPU_LAZY_MODE`` set to match in
    ``environ`` (default ``os.environ``) -- before ``habana_frameworks`` is imported, which
    reads it once.

    ``requested`` is ``--hpu-mode`` (eager | lazy | compile | graph); unset, it is ``compile`` when
    ``--compile`` asks for torch.compile, else what ``PT_HPU_LAZY_MODE`` already says, else
    ``lazy``.  A contradiction (``--compile`` with eager/lazy, or a ``PT_HPU_LAZY_MODE`` that
    does not match the mode) is a ConfigError: the run would not be the mode it is labelled.
    """
    env = os.environ if environ is None else environ
    current = env.get("PT_HPU_LAZY_MODE")
    mode = requested
    if mode is None:
        if compile_mode != "none":
            mode = "compile"
        elif current is not None:
            mode = "eager" if current.strip() == "0" else "lazy"
        else:
            mode = "lazy"
    if mode not in HPU_LAZY_MODE:
        raise ConfigError(f"unknown --hpu-mode {mode!r}; use eager, lazy, compile or graph")
    if compile_mode != "none" and mode != "compile":
        raise ConfigError(
            f"--compile {compile_mode} with --hpu-mode {mode}: on Gaudi torch.compile is "
            "--hpu-mode compile (eager mode with the hpu_backend)"
        )
    want = HPU_LAZY_MODE[mode]
    if current is not None and current.strip() != want:
        raise ConfigError(
            f"PT_HPU_LAZY_MODE={current} in the environment contradicts --hpu-mode {mode} "
            f"(which needs PT_HPU_LAZY_MODE={want}); unset it or pick the other mode"
        )
    env["PT_HPU_LAZY_MODE"] = want
    return mode


def mark_step(device: str, mode: str | None) -> None:
    """Flush the Gaudi lazy-mode graph: only on ``hpu`` in lazy mode (eager and compiled mode
    run op by op / by their own graphs; elsewhere there is nothing to flush)."""
    if device == "hpu" and mode == "lazy":
        import habana_frameworks.torch.core as htcore  # optional extra: Gaudi

        htcore.mark_step()


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo, else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_uuids(count: int) -> list[str | None]:
    """UUIDs of CUDA devices ``0..count-1`` in NVML's ``GPU-...`` form (None if unknown)."""
    out: list[str | None] = []
    for i in range(count):
        try:
            uuid = compat.device_uuid(torch.cuda.get_device_properties(i))
        except Exception:
            uuid = None
        if uuid is None:
            out.append(None)
        else:
            out.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    return out


def rank_hosts() -> list[str]:
    """Every rank's hostname, in rank order: where a multi-node run really ran. A collective:
    every rank calls it (after the process group is up)."""
    hosts: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(hosts, socket.gethostname())
    return [str(host) for host in hosts]


def environment(device: str, dist: Dist) -> dict[str, Any]:
    """Facts about the software and hardware that ran (the device-independent part)."""
    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "cuda_version": torch.version.cuda,
        "cudnn_version": None,
        "device": device,
        "device_name": None,
        "driver_version": None,
        "device_count": 1,
        "world_size": dist.world_size,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "cpu_model": cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        env["cudnn_version"] = torch.backends.cudnn.version()
        env["device_name"] = torch.cuda.get_device_name()
        env["device_count"] = torch.cuda.device_count()
        env["driver_version"] = nvml_device_driver_version()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device_memory_mib"] = props.total_memory // 2**20
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        env["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    elif device == "hpu":
        with contextlib.suppress(Exception):
            env["device_name"] = torch.hpu.get_device_name()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            env["device_count"] = torch.hpu.device_count()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            import habana_frameworks.torch as ht  # optional extra: Gaudi

            env["habana_version"] = str(ht.__version__)
        env["pt_hpu_lazy_mode"] = os.environ.get("PT_HPU_LAZY_MODE")
    else:
        env["device_name"] = env["cpu_model"]
    if dist.enabled and torch.distributed.is_available() and torch.distributed.is_initialized():
        env["rank_hosts"] = rank_hosts()
    release = os.environ.get("NVIDIA_PYTORCH_VERSION")  # set by NGC PyTorch containers
    if release:
        env["container_release"] = release
    return env
